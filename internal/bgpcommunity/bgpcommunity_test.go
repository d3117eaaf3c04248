package bgpcommunity

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Each spelling reads as the value BGP sends and writes back the same; a
// number too wide for its field, a second spelling of one number (a sign,
// a leading zero) or a missing part is refused with the input quoted.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want *Community // nil: refused
	}{
		{"64512:100", &Community{Standard: 64512<<16 | 100}},
		{"0:0", &Community{}},
		{"65535:65535", &Community{Standard: 0xFFFFFFFF}},
		{"no-export", &Community{Standard: 0xFFFFFF01}},
		{"no-advertise", &Community{Standard: 0xFFFFFF02}},
		{"no-export-subconfed", &Community{Standard: 0xFFFFFF03}},
		{"no-peer", &Community{Standard: 0xFFFFFF04}},
		{"large:64512:1:2", &Community{Large: Large{64512, 1, 2}, IsLarge: true}},
		{"large:4294967295:0:4294967295", &Community{Large: Large{4294967295, 0, 4294967295}, IsLarge: true}},
		{"65536:1", nil}, {"1:65536", nil}, {"01:1", nil}, {"+1:1", nil}, {"1", nil}, {"1:2:3", nil}, {"", nil}, {"NO-EXPORT", nil},
		{"large:4294967296:1:2", nil}, {"large:1:2", nil}, {"large:1:2:3:4", nil}, {"large:1:02:3", nil}, {"large:-1:2:3", nil}, {"Large:1:2:3", nil},
	} {
		got, err := Parse(tc.in)
		if tc.want == nil {
			if err == nil {
				t.Errorf("Parse(%q) = %+v; want an error", tc.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(*tc.want, got); diff != "" {
			t.Errorf("Parse(%q) (-want +got):\n%s", tc.in, diff)
		}
		if got.String() != tc.in {
			t.Errorf("Parse(%q).String() = %q", tc.in, got.String())
		}
	}
}

// MetalLB writes the well-known communities as numbers: they read as the
// same values and are written back by name.
func TestWellKnownAsNumbers(t *testing.T) {
	c, err := Parse("65535:65281")
	if err != nil || c.String() != "no-export" {
		t.Errorf("65535:65281 reads as %v (%v); want no-export", c, err)
	}
}
