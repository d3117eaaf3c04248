package iprange

import (
	"fmt"
	"net/netip"
	"strings"
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

// A service range gives neither its network address nor (IPv4) its
// broadcast address, as Kubernetes' allocator; IPv6's last address is an
// ordinary one.
func TestServiceAddr(t *testing.T) {
	for _, tc := range []struct {
		prefix, addr string
		want         bool
	}{
		{"10.96.0.0/16", "10.96.0.1", true},
		{"10.96.0.0/16", "10.96.255.254", true},
		{"10.96.0.0/16", "10.96.0.0", false},
		{"10.96.0.0/16", "10.96.255.255", false},
		{"10.96.0.0/16", "10.97.0.1", false},
		{"10.96.0.0/31", "10.96.0.1", false},
		{"fd00:96::/108", "fd00:96::", false},
		{"fd00:96::/108", "fd00:96::1", true},
		{"fd00:96::/108", "fd00:96::f:ffff", true},
		{"10.96.0.0/16", "fd00:96::1", false},
	} {
		if got := ServiceAddr(netip.MustParsePrefix(tc.prefix), netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("ServiceAddr(%s, %s) = %v, want %v", tc.prefix, tc.addr, got, tc.want)
		}
	}
}

// A service range is no wider than 2^20 IPv4 addresses (Kubernetes'
// --service-cluster-ip-range bound) and no wider than an IPv6 /64 (its
// ServiceCIDR allocator's).
func TestValidateServiceRangeBoundsTheWidth(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"10.96.0.0/12", true},
		{"10.96.0.0/16", true},
		{"10.0.0.0/8", false},
		{"10.64.0.0/11", false},
		{"fd00:96::/64", true},
		{"fd00:96::/108", true},
		{"fd00::/63", false},
	} {
		err := ValidateServiceRange(netip.MustParsePrefix(tc.prefix))
		if (err == nil) != tc.ok {
			t.Errorf("ValidateServiceRange(%s) = %v; want ok=%v", tc.prefix, err, tc.ok)
		}
	}
}

func TestEndingIn0Or255IsCountedPerRange(t *testing.T) {
	for rg, want := range map[string]int64{
		"203.0.113.0-203.0.113.255": 2, "203.0.112.0-203.0.113.255": 4, "203.0.113.1-203.0.113.254": 0, "203.0.113.255-203.0.114.0": 2,
		"203.0.113.0-203.0.113.0": 1, "10.0.0.0-10.255.255.255": 2 << 16, "0.0.0.0-0.0.0.255": 2, "255.255.255.0-255.255.255.255": 2,
	} {
		first, last, _ := strings.Cut(rg, "-")
		if got := EndingIn0Or255(netip.MustParseAddr(first), netip.MustParseAddr(last)); got != want {
			t.Errorf("%s: %d addresses ending in .0 or .255, want %d", rg, got, want)
		}
	}
}
