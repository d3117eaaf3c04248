package bounded

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	if got := String("short", 5); got != "short" {
		t.Errorf("a string that fits: %q", got)
	}
	got := String(strings.Repeat("é", 10), 5) // 2 bytes a rune: cut at 4
	if want := "éé... (20 bytes in all)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !utf8.ValidString(got) {
		t.Errorf("%q is not valid UTF-8", got)
	}
}
