// Package yamldocs cuts a YAML stream into its documents, as lbctl and the
// server's resources file read them.
package yamldocs

import "strings"

// Split cuts a YAML stream at its "---" lines.
func Split(data string) []string {
	var docs []string
	var cur strings.Builder
	for _, line := range strings.SplitAfter(data, "\n") {
		if rest, ok := strings.CutPrefix(line, "---"); ok && (rest == "" || strings.ContainsAny(rest[:1], " \t\r\n")) {
			docs = append(docs, cur.String())
			cur.Reset()
			line = rest // YAML allows content after the marker
		}
		cur.WriteString(line)
	}
	return append(docs, cur.String())
}
