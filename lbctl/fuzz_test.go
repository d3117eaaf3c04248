package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// FuzzReadDocuments: whatever a file holds, apply's reader answers with
// documents or an error, never a panic.
func FuzzReadDocuments(f *testing.F) {
	for _, file := range []string{"../deploy/examples/web.yaml", "../deploy/examples/rack.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("kind: Service\nmetadata: {name: web}\n---\nitems: [{kind: Node, metadata: {name: n1}}]\n")
	f.Add("kind: ServiceCidr\nmetadata: {name: k}\ncidrs: [10.96.0.0/16]\n")
	f.Fuzz(func(t *testing.T, data string) {
		a := &app{stdin: strings.NewReader(data), stdout: io.Discard, stderr: io.Discard, now: time.Now}
		docs, err := a.readDocuments([]string{"-"})
		if err == nil {
			for _, d := range docs {
				if d.kind == nil || d.obj == nil {
					t.Fatalf("a document without a kind or object: %+v", d)
				}
			}
		}
	})
}
