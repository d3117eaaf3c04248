package iprange

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestPrefixes(t *testing.T) {
	for _, tc := range []struct{ first, last, want string }{
		{"203.0.113.0", "203.0.113.255", "[203.0.113.0/24]"},
		{"203.0.113.7", "203.0.113.7", "[203.0.113.7/32]"},
		{"203.0.113.10", "203.0.113.20", "[203.0.113.10/31 203.0.113.12/30 203.0.113.16/30 203.0.113.20/32]"},
		{"0.0.0.0", "255.255.255.255", "[0.0.0.0/0]"},
		{"255.255.255.254", "255.255.255.255", "[255.255.255.254/31]"},
		{"2001:db8::1", "2001:db8::3", "[2001:db8::1/128 2001:db8::2/127]"},
	} {
		got := fmt.Sprint(Prefixes(netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last)))
		if got != tc.want {
			t.Errorf("Prefixes(%s, %s) = %s, want %s", tc.first, tc.last, got, tc.want)
		}
	}
}
