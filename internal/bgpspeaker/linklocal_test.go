package bgpspeaker

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	api "github.com/osrg/gobgp/v3/api"

	"github.com/weirlb/weir/internal/bgpnumbers"
)

// TestLinkLocalAndDynamicPeers: a link-local router is dialled on its
// interface, a dynamic AS becomes the AS GoBGP expects (the speaker's own
// for "internal", any for "external"), a VRF binds the session to its
// device, and an unnumbered peer whose interface has no link-local
// neighbour yet is an error that names the interface (the caller retries)
// and leaves the other peers be.
func TestLinkLocalAndDynamicPeers(t *testing.T) {
	ctx, g := startSpeaker(t, 4200000001)
	// GoBGP dials a link-local router from the interface's own
	// link-local address, so the interface must have one.
	link := linkLocalInterface(t)
	leaf := Peer{Address: netip.MustParseAddr("fe80::1%" + link), DynamicASN: bgpnumbers.External, VRF: "lo"}
	spine := Peer{Address: netip.MustParseAddr("2001:db8::1"), DynamicASN: bgpnumbers.Internal}
	type session struct {
		neighbor, bind string
		asn            uint32
	}
	check := func(when string, want map[string]session) {
		t.Helper()
		got := map[string]session{}
		if err := g.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
			got[p.GetConf().GetNeighborAddress()] = session{neighbor: p.GetConf().GetNeighborAddress(),
				bind: p.GetTransport().GetBindInterface(), asn: p.GetConf().GetPeerAsn()}
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("%s: GoBGP holds %v; want %v", when, got, want)
		}
		for addr, w := range want {
			if got[addr] != w {
				t.Errorf("%s: GoBGP holds %s as %+v; want %+v", when, addr, got[addr], w)
			}
		}
	}
	if err := g.SetPeers(ctx, []Peer{leaf, spine}); err != nil {
		t.Fatal(err)
	}
	want := map[string]session{
		"fe80::1%" + link: {neighbor: "fe80::1%" + link, bind: "lo", asn: 0},
		"2001:db8::1":     {neighbor: "2001:db8::1", asn: 4200000001},
	}
	check("set", want)

	// lo has no link-local neighbour: nothing to dial yet.
	unnumbered := Peer{Interface: "lo", ASN: 64500}
	err := g.SetPeers(ctx, []Peer{leaf, spine, unnumbered})
	if err == nil || !strings.Contains(err.Error(), `"lo"`) || !strings.Contains(err.Error(), "link-local neighbour") {
		t.Errorf("an unnumbered peer on lo: %v; want an error naming lo and its missing link-local neighbour", err)
	}
	check("an unnumbered peer not found", want)
}

// linkLocalInterface is an interface of this host with an IPv6 link-local
// address.
func linkLocalInterface(t *testing.T) string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifaces {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
				return i.Name
			}
		}
	}
	t.Skip("no interface of this host has an IPv6 link-local address to dial a link-local router from")
	return ""
}

// TestExportRulesFollowUnnumberedRouters: a rule that names a link keeps
// its routes to whichever router is found there, by the address it has
// now (the policy says it before the router is added); until one is found
// the rule keeps them from every router, never gives them to all.
func TestExportRulesFollowUnnumberedRouters(t *testing.T) {
	ctx, g := startSpeaker(t, 64512)
	neighbors := func() []string {
		t.Helper()
		var got []string
		if err := g.s.ListDefinedSet(ctx, &api.ListDefinedSetRequest{DefinedType: api.DefinedType_NEIGHBOR, Name: "weir-rule-0-peers"}, func(d *api.DefinedSet) {
			got = append(got, d.GetList()...)
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	rules := []ExportRule{{Prefixes: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, Peers: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Links: []string{"swp1"}}}
	if err := g.SetExportRules(ctx, rules); err != nil {
		t.Fatal(err)
	}
	if got, want := neighbors(), []string{"192.0.2.1/32"}; !slices.Equal(got, want) {
		t.Errorf("no router on swp1 yet: the rule's routers %v; want %v", got, want)
	}
	// The router on swp1 found at fe80::2, as resolve would find it.
	g.mu.Lock()
	g.dynamic[netip.MustParseAddr("fe80::2%swp1")] = Peer{Address: netip.MustParseAddr("fe80::2%swp1"), Interface: "swp1"}
	g.mu.Unlock()
	if err := g.SetExportRules(ctx, rules); err != nil {
		t.Fatal(err)
	}
	if got, want := neighbors(), []string{"192.0.2.1/32", "fe80::2/128"}; !slices.Equal(got, want) {
		t.Errorf("the router on swp1 at fe80::2: the rule's routers %v; want %v", got, want)
	}
	// A rule of only a link with no router found keeps its routes from all.
	g.mu.Lock()
	clear(g.dynamic)
	g.mu.Unlock()
	if err := g.SetExportRules(ctx, []ExportRule{{Prefixes: rules[0].Prefixes, Links: []string{"swp1"}}}); err != nil {
		t.Fatal(err)
	}
	if got, want := neighbors(), []string{"::/128"}; !slices.Equal(got, want) {
		t.Errorf("no router on swp1: the rule's routers %v; want %v", got, want)
	}
}
