package receive

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirlb/weir/internal/report"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
)

// healthyNode is a connected, programmed, eligible node whose speaker
// has the given sessions and announcements.
func healthyNode(sessions []report.BGPSession, announced ...string) observed.Node {
	n := observed.Node{Node: "node1", Connected: true, SentVersion: 5, AppliedVersion: 5,
		Health: observed.Health{HealthzCode: 200, LivezCode: 200, NodeEligible: true}, BGPSessions: sessions}
	for _, p := range announced {
		n.BGPAnnouncements = append(n.BGPAnnouncements, report.BGPAnnouncement{Prefix: netip.MustParsePrefix(p)})
	}
	return n
}

func session(peer, state, lastError string, negotiated ...string) report.BGPSession {
	s := report.BGPSession{PeerAddress: netip.MustParseAddr(peer), PeerASN: 64512, State: report.BGPState(state), LastError: lastError}
	for _, f := range []string{"ipv4", "ipv6"} {
		s.Families = append(s.Families, report.BGPFamily{Name: report.Family(f), Negotiated: state == "established" && strings.Contains(strings.Join(negotiated, ","), f)})
	}
	return s
}

func TestReceiveReasonsPerFamily(t *testing.T) {
	svc := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("2001:db8:113::5")}}
	badAS := "the router sent NOTIFICATION code 2(open) subcode 2(bad peer as)"
	for _, tc := range []struct {
		name       string
		node       observed.Node
		reason     string   // the node's
		families   []string // "family reason" each
		messageHas string
	}{
		{
			name:     "both families up and announced",
			node:     healthyNode([]report.BGPSession{session("192.0.2.1", "established", "", "ipv4"), session("2001:db8:2::1", "established", "", "ipv6")}, "203.0.113.5/32", "2001:db8:113::5/128"),
			families: []string{"ipv4 ", "ipv6 "},
		},
		{
			// The case an operator could not see: the IPv6 session is up,
			// so the node looked as if it received everything.
			name:       "the IPv4 router refuses the session",
			node:       healthyNode([]report.BGPSession{session("192.0.2.1", "active", badAS), session("2001:db8:2::1", "established", "", "ipv6")}, "203.0.113.5/32", "2001:db8:113::5/128"),
			reason:     "BGPSessionsDown",
			families:   []string{"ipv4 BGPSessionsDown", "ipv6 "},
			messageHas: "ipv4: no established BGP session carries ipv4: 192.0.2.1 (AS 64512) active: " + badAS,
		},
		{
			name:       "a session up without the family",
			node:       healthyNode([]report.BGPSession{session("192.0.2.1", "established", "", "ipv4")}, "203.0.113.5/32"),
			reason:     "BGPSessionsDown",
			families:   []string{"ipv4 ", "ipv6 BGPSessionsDown"},
			messageHas: "192.0.2.1 (AS 64512) established without ipv6",
		},
		{
			name:       "up but not announced",
			node:       healthyNode([]report.BGPSession{session("192.0.2.1", "established", "", "ipv4", "ipv6")}, "2001:db8:113::5/128"),
			reason:     "NotAnnounced",
			families:   []string{"ipv4 NotAnnounced", "ipv6 "},
			messageHas: "does not announce 203.0.113.5",
		},
		{
			name:     "an aggregate carries the address",
			node:     healthyNode([]report.BGPSession{session("192.0.2.1", "established", "", "ipv4", "ipv6")}, "203.0.113.0/28", "2001:db8:113::/124"),
			families: []string{"ipv4 ", "ipv6 "},
		},
		{
			name: "the node's own reason comes first",
			node: func() observed.Node {
				n := healthyNode(nil)
				n.Connected = false
				n.BGPSessions = []report.BGPSession{session("192.0.2.1", "active", badAS)}
				return n
			}(),
			reason:     "Disconnected",
			families:   []string{"ipv4 Disconnected", "ipv6 Disconnected"},
			messageHas: "the node's agent is not connected",
		},
		{
			name:   "no speaker on the node",
			node:   healthyNode(nil),
			reason: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Of(svc, tc.node, model.Aside{})
			var fams []string
			for _, f := range r.Families {
				fams = append(fams, f.Family+" "+f.Reason)
			}
			if r.Reason != tc.reason || strings.Join(fams, ",") != strings.Join(tc.families, ",") {
				t.Errorf("reason %q, families %q; want %q, %q", r.Reason, fams, tc.reason, tc.families)
			}
			if !strings.Contains(r.Message, tc.messageHas) || (tc.reason == "Disconnected" && r.Message != tc.messageHas) {
				t.Errorf("message %q does not contain %q", r.Message, tc.messageHas)
			}
		})
	}
}

func TestLoadBalancerTierTargetsIgnoreTheNodesOwnAnnouncements(t *testing.T) {
	v4, v6 := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("2001:db8:113::5")
	svc := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}, LoadBalancerIPs: []netip.Addr{v4, v6}}
	n := healthyNode([]report.BGPSession{session("2001:db8:2::1", "established", "", "ipv6")})
	r := Of(svc, n, model.Aside{})
	if got := r.TargetReason(v6); got != "" {
		t.Errorf("ipv6 target reason %q; the tier announces the node itself", got)
	}
	if got := r.TargetReason(v4); got != "BGPSessionsDown" {
		t.Errorf("ipv4 target reason %q, want BGPSessionsDown", got)
	}
}

// A node may own an L2 address by the rules that decide whether it
// receives the service's traffic, its BGP sessions aside.
func TestL2Candidates(t *testing.T) {
	svc := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}, ExternalTrafficPolicy: model.PolicyLocal,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.50")}}
	node := func(name string, ready bool) observed.Node {
		n := healthyNode([]report.BGPSession{session("192.0.2.1", "active", "")}) // a speaker that is down: no matter here
		n.Node = name
		n.Services = map[string]observed.Service{}
		if ready {
			n.Services["default/web"] = observed.Service{LocalReady: 1, HealthCheckCode: 200}
		}
		return n
	}
	down := node("n4", true)
	down.Connected = false
	nodes := []observed.Node{node("n1", true), node("n2", false), node("n3", true), down}
	nodes = append(nodes, node("n5", true))
	aside := func(n string) model.Aside { return model.Aside{Drained: n == "n3", Excluded: n == "n3" || n == "n5"} }
	got, why := L2Candidates(svc, nodes, aside)
	if !slices.Equal(got, []string{"n1"}) {
		t.Errorf("candidates %v; want n1 alone", got)
	}
	for n, want := range map[string]string{"n2": NoLocalEndpoints, "n3": NodeDrained, "n4": Disconnected, "n5": NodeExcluded} {
		if why[n].Reason != want {
			t.Errorf("%s left out for %q; want %s", n, why[n].Reason, want)
		}
	}
	// Cluster policy: every healthy node, endpoints or not.
	svc.ExternalTrafficPolicy = model.PolicyCluster
	if got, _ := L2Candidates(svc, nodes, nil); !slices.Equal(got, []string{"n1", "n2", "n3", "n5"}) {
		t.Errorf("Cluster candidates %v; want n1, n2, n3, n5", got)
	}
	// A write on its way to a node does not take its addresses away; a
	// node that has applied no state yet gets none.
	busy, fresh := node("n1", true), node("n2", true)
	busy.SentVersion = busy.AppliedVersion + 5
	fresh.AppliedVersion, fresh.SentVersion = 0, 3
	if got, why := L2Candidates(svc, []observed.Node{busy, fresh}, nil); !slices.Equal(got, []string{"n1"}) || why["n2"].Reason != NotProgrammed {
		t.Errorf("candidates %v (n2: %q); want n1 alone, n2 not programmed", got, why["n2"].Reason)
	}
}

// An L2 pool's node selector leaves nodes out, with the reason; a node
// the cluster does not know is no candidate.
func TestL2AddressesFollowTheNodeSelector(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.200")
	svc := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}, ExternalTrafficPolicy: model.PolicyCluster,
		LoadBalancerIPs: []netip.Addr{vip, netip.MustParseAddr("203.0.113.1")}}
	pools := []*model.AddressPool{
		{Meta: model.Meta{Name: "lan"}, Ranges: []model.AddressRange{{First: vip, Last: vip}},
			L2: &model.L2Advertisement{NodeSelector: map[string]string{"rack": "a"}}},
		{Meta: model.Meta{Name: "bgp"}, Ranges: []model.AddressRange{{First: netip.MustParseAddr("203.0.113.0"), Last: netip.MustParseAddr("203.0.113.255")}}},
	}
	nodes := []*model.Node{{Meta: model.Meta{Name: "n1", Labels: map[string]string{"rack": "a"}}}, {Meta: model.Meta{Name: "n2", Labels: map[string]string{"rack": "b"}}}}
	var observedNodes []observed.Node
	for _, name := range []string{"n2", "n1", "n3"} {
		n := healthyNode(nil)
		n.Node = name
		observedNodes = append(observedNodes, n)
	}
	c := Cluster{Nodes: nodes, Pools: pools, Services: []*model.Service{svc}, Observed: observedNodes}
	got := L2Addresses(c)
	if len(got) != 1 || !slices.Equal(got[vip], []string{"n1"}) {
		t.Fatalf("L2 addresses %v; want %s with n1 alone (the BGP pool's address left out)", got, vip)
	}
	why := map[netip.Addr]map[string]Verdict{}
	L2Why(c, svc, why)
	if why[vip]["n2"].Reason != NotSelected || why[vip]["n3"].Reason != NotSelected {
		t.Errorf("reasons %v; want n2 and n3 NotSelected", why[vip])
	}
	// A service selector that leaves the service out: no node answers,
	// each saying why.
	pools[0].L2.ServiceSelector = map[string]string{"tier": "front"}
	if got := L2Addresses(c); len(got[vip]) != 0 {
		t.Errorf("L2 addresses %v; want none for a service the selector leaves out", got)
	}
	L2Why(c, svc, why)
	if v := why[vip]["n1"]; v.Reason != NotSelected || !strings.Contains(v.Message, "service selector") {
		t.Errorf("n1's reason %v; want NotSelected by the service selector", v)
	}
	svc.Labels = map[string]string{"tier": "front"}
	if got := L2Addresses(c); !slices.Equal(got[vip], []string{"n1"}) {
		t.Errorf("L2 addresses %v; want %s with n1 for a selected service", got, vip)
	}
}

// TestAnnouncedSaysWhoReceivesAndWhy: one line per address, BGP and L2
// told apart, and every node's reason when an address has none.
func TestAnnouncedSaysWhoReceivesAndWhy(t *testing.T) {
	bgpVIP, l2VIP, lonely := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("192.0.2.50"), netip.MustParseAddr("192.0.2.51")
	l2 := &model.AddressPool{Meta: model.Meta{Name: "lan"}, L2: &model.L2Advertisement{},
		Ranges: []model.AddressRange{{First: l2VIP, Last: lonely}}}
	svc := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}, LoadBalancerIPs: []netip.Addr{bgpVIP, l2VIP, lonely}}
	var seen []observed.Node
	var nodes []*model.Node
	for _, name := range []string{"n2", "n1", "n3"} {
		n := healthyNode([]report.BGPSession{session("192.0.2.1", "established", "", "ipv4")}, "203.0.113.5/32")
		n.Node = name
		seen = append(seen, n)
		nodes = append(nodes, &model.Node{Meta: model.Meta{Name: name}})
	}
	seen[2].Connected = false
	c := Cluster{Nodes: nodes, Pools: []*model.AddressPool{l2}, Observed: seen,
		Aside: func(n string) model.Aside { return model.Aside{Excluded: n == "n2"} }}
	owner := func(a netip.Addr) (string, bool) { return "n1", a == l2VIP }
	lines, missing := Announced(c, svc, owner)
	want := []string{
		"203.0.113.5 over BGP from n1",
		"192.0.2.50 over L2 from n1",
		"192.0.2.51: no node answers it over L2 yet (n2: NodeExcluded, n3: Disconnected)",
	}
	if !slices.Equal(lines, want) || !missing {
		t.Errorf("announced %q (missing %v); want %q, missing", lines, missing, want)
	}
	svc.OtherController = true
	if lines, missing := Announced(c, svc, owner); lines != nil || missing {
		t.Errorf("another controller's service: %q, %v; want nothing said", lines, missing)
	}
}

// TestAnL2PoolAnnouncedOverBGPTooIsSaidBothWays: an address of a pool
// answered over L2 and announced over BGP has a line for each way, the
// BGP one naming only the nodes the pool's advertisements select; it is
// missing only when neither way has a node, and the load-balancer tier
// targets it through the BGP advertisement's nodes.
func TestAnL2PoolAnnouncedOverBGPTooIsSaidBothWays(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.50")
	pool := &model.AddressPool{Meta: model.Meta{Name: "both"}, Ranges: []model.AddressRange{{First: vip, Last: vip}},
		L2:                &model.L2Advertisement{NodeSelector: map[string]string{"rack": "a"}},
		BGPAdvertisements: []model.BGPAdvertisement{{NodeSelector: map[string]string{"rack": "b"}}}}
	svc := &model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}, LoadBalancerIPs: []netip.Addr{vip}}
	var seen []observed.Node
	var nodes []*model.Node
	for i, name := range []string{"n1", "n2", "n3"} {
		// n1 too says it announces the address: the pool's advertisement
		// leaving it out is what keeps it off the BGP line.
		n := healthyNode([]report.BGPSession{session("192.0.2.1", "established", "", "ipv4")}, "192.0.2.50/32")
		n.Node = name
		seen = append(seen, n)
		rack := map[bool]string{true: "a", false: "b"}[i == 0]
		nodes = append(nodes, &model.Node{Meta: model.Meta{Name: name, Labels: map[string]string{"rack": rack}},
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)})}})
	}
	c := Cluster{Nodes: nodes, Pools: []*model.AddressPool{pool}, Services: []*model.Service{svc}, Observed: seen}
	if got := L2Addresses(c); !slices.Equal(got[vip], []string{"n1"}) {
		t.Errorf("L2 candidates %v; want n1 alone (the L2 node selector)", got[vip])
	}
	owner := func(netip.Addr) (string, bool) { return "n1", true }
	lines, missing := Announced(c, svc, owner)
	if want := []string{"192.0.2.50 over L2 from n1", "192.0.2.50 over BGP from n2, n3"}; !slices.Equal(lines, want) || missing {
		t.Errorf("announced %q (missing %v); want %q", lines, missing, want)
	}
	// No L2 owner yet: the routers still reach it.
	noOwner := func(netip.Addr) (string, bool) { return "", false }
	if lines, missing := Announced(c, svc, noOwner); len(lines) != 2 || missing {
		t.Errorf("without an owner: %q (missing %v); want both lines, not missing", lines, missing)
	}
	// Neither way has a node: missing.
	for i := range seen {
		seen[i].Connected = false
	}
	if _, missing := Announced(c, svc, noOwner); !missing {
		t.Error("an address no node answers or announces is not missing")
	}
	for i := range seen {
		seen[i].Connected = true
	}
	targets := Targets(c)
	var got []string
	for _, v := range targets {
		for _, tg := range v.Targets {
			got = append(got, tg.Node)
		}
	}
	if len(targets) != 1 || !slices.Equal(got, []string{"n2", "n3"}) {
		t.Errorf("the load-balancer tier targets %v; want n2 and n3 (the BGP advertisement's nodes)", got)
	}
}
