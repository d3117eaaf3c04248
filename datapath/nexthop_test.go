package datapath

import (
	"net/netip"
	"testing"
)

// The next hop a node announces itself with and the one a load-balancer
// speaker names for it come from NextHop alone.
func TestNextHop(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("fe80::1"), netip.MustParseAddr("169.254.0.9"),
		netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::11"), netip.MustParseAddr("192.0.2.12")}
	for _, tc := range []struct {
		is6  bool
		want string
	}{{false, "192.0.2.11"}, {true, "2001:db8::11"}} {
		if got, ok := NextHop(addrs, tc.is6); !ok || got.String() != tc.want {
			t.Errorf("NextHop(is6 %v) = %v, %v; want %s", tc.is6, got, ok, tc.want)
		}
	}
	if _, ok := NextHop(addrs[:3], false); ok {
		t.Error("a node with only loopback and link-local addresses has a next hop")
	}
}
