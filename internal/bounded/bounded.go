// Package bounded cuts text a caller sent, or an error that quotes it,
// before it is logged, stored or sent back: one place for how it is cut.
package bounded

import (
	"fmt"
	"unicode/utf8"
)

// String cuts s to at most limit bytes at a rune boundary, saying how long
// it was; s itself when it fits.
func String(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes in all)", s[:cut], len(s))
}
