package l2

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// Where an address is answered: the pool's interfaces, each of which must
// exist, or else every interface whose subnet holds it; otherwise the
// reason, which the server shows as CannotAnswer.
func TestInterfacesFor(t *testing.T) {
	links := []localLink{
		{name: "eth0", subnets: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8:2::/64")}},
		{name: "eth1", subnets: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
		{name: "bond0", subnets: []netip.Prefix{netip.MustParsePrefix("192.0.2.128/25")}},
	}
	for _, c := range []struct {
		addr  string
		named []string
		want  []string
		why   string
	}{
		{"192.0.2.200", nil, []string{"eth0", "bond0"}, ""},
		{"2001:db8:2::200", nil, []string{"eth0"}, ""},
		{"203.0.113.5", nil, nil, "no interface of the node has a subnet that holds 203.0.113.5"},
		{"203.0.113.5", []string{"eth1"}, []string{"eth1"}, ""},
		{"192.0.2.200", []string{"eth0", "eth9"}, nil, `the node has no interface "eth9"`},
	} {
		got, why := interfacesFor(netip.MustParseAddr(c.addr), c.named, links, nil)
		if !slices.Equal(got, c.want) || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
			t.Errorf("%s on %v: %v, %q; want %v, %q", c.addr, c.named, got, why, c.want, c.why)
		}
	}
	if _, why := interfacesFor(netip.MustParseAddr("192.0.2.200"), nil, nil, errors.New("netlink: no")); !strings.Contains(why, "netlink: no") {
		t.Errorf("a failed listing: %q", why)
	}
}
