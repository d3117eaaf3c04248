package iprange

import (
	"fmt"
	"net/netip"
)

// SpecialPurpose are the ranges no service address and no service range
// may touch: this network, loopback, link-local (cloud metadata servers
// among them), multicast, reserved and broadcast, and IPv6's unspecified,
// loopback, IPv4-mapped, link-local and multicast.
var SpecialPurpose = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// Widest service ranges: every node drops new connections to a range's
// free addresses, so a range is bounded. IPv4: 2^20 addresses, the bound
// kube-apiserver long held --service-cluster-ip-range to (kubeadm's
// default, 10.96.0.0/12, is that size). IPv6: /64, the bound Kubernetes'
// ServiceCIDR allocator holds every range to.
const (
	WidestServiceRange4 = 12
	WidestServiceRange6 = 64
)

// ValidateServiceRange checks one range cluster IPs come from (a
// ServiceCidr resource, weir-server's --service-cluster-ip-range or
// weir-agent's --service-cidr): a canonical prefix, not wider than /12
// (IPv6 /64), clear of every special-purpose range.
func ValidateServiceRange(p netip.Prefix) error {
	if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" {
		return fmt.Errorf("%q is not a network prefix", p)
	}
	if p.Addr().Is4In6() {
		return fmt.Errorf("%q is not in canonical form", p)
	}
	widest := WidestServiceRange6
	if p.Addr().Is4() {
		widest = WidestServiceRange4
	}
	if p.Bits() < widest {
		return fmt.Errorf("%s is wider than /%d: every node would drop connections to its free addresses", p, widest)
	}
	for _, sp := range SpecialPurpose {
		if sp.Overlaps(p) {
			return fmt.Errorf("%s overlaps the special-purpose range %s", p, sp)
		}
	}
	return nil
}

// ServiceAddr says whether a is an address range p may give a service as
// its cluster IP: inside p and not one of its reserved addresses.
func ServiceAddr(p netip.Prefix, a netip.Addr) bool {
	return p.Contains(a) && ReservedServiceAddr(p, a) == ""
}

// ReservedServiceAddr names what a is in p when a range gives it to no
// service, "" otherwise: p's first address (the network's; in IPv6 the
// subnet-router anycast address) and, in IPv4, its last (the broadcast
// address). Kubernetes' allocator never hands those out, and counts a
// service holding one as outside the range.
func ReservedServiceAddr(p netip.Prefix, a netip.Addr) string {
	switch {
	case !p.Contains(a):
		return ""
	case a == p.Masked().Addr() && a.Is6():
		return "the subnet-router anycast address"
	case a == p.Masked().Addr():
		return "the network address"
	case a.Is4() && a == Last(p):
		return "the broadcast address"
	}
	return ""
}
