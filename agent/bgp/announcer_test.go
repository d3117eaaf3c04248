package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/bgpspeaker/bgpfake"
)

// failingSpeaker refuses peer sets until told otherwise and records the
// last one it took.
type failingSpeaker struct {
	fail  bool
	peers []Peer
}

func (f *failingSpeaker) Announce(context.Context, netip.Prefix, Announcement) error { return nil }
func (f *failingSpeaker) Withdraw(context.Context, netip.Prefix, Announcement) error { return nil }
func (f *failingSpeaker) Sessions(context.Context) ([]bgpspeaker.Session, error)     { return nil, nil }
func (f *failingSpeaker) Close()                                                     {}
func (f *failingSpeaker) SetExportRules(context.Context, []ExportRule) error         { return nil }
func (f *failingSpeaker) SetPeers(_ context.Context, peers []Peer) error {
	if f.fail {
		return errors.New("peer refused")
	}
	f.peers = peers
	return nil
}

func TestPeersThatFailAreRetried(t *testing.T) {
	sp := &failingSpeaker{fail: true}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	router := datapath.BGPPeer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64512}
	a.Received(datapath.NodeState{Node: datapath.NodeInfo{BGPPeers: []datapath.BGPPeer{router}}})
	sp.fail = false
	if a.Report(false); sp.peers != nil {
		t.Fatal("peers dialled before the first state was applied")
	}
	sp.fail = true
	a.Applied(0)
	if sp.peers != nil {
		t.Fatal("a refused peer set was recorded")
	}
	a.Report(false) // still refused
	sp.fail = false
	a.Report(false)
	if len(sp.peers) != 1 || sp.peers[0].Address != router.Address || sp.peers[0].MyASN != 64512 {
		t.Errorf("after the retry the speaker has %+v; want the router", sp.peers)
	}
}

// A router's session options reach the speaker as the server sent them.
func TestPeersKeepTheirSessionOptions(t *testing.T) {
	sp := &failingSpeaker{}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	router := datapath.BGPPeer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64512, HoldTime: 30 * time.Second,
		EBGPMultihopTTL: 2, SourceAddress: netip.MustParseAddr("198.51.100.7"), Keepalive: 10 * time.Second, ConnectRetry: 5 * time.Second}
	a.Received(datapath.NodeState{Node: datapath.NodeInfo{BGPPeers: []datapath.BGPPeer{router}}})
	a.Applied(0)
	want := []Peer{{Address: router.Address, ASN: 64500, MyASN: 64512, HoldTime: 30 * time.Second,
		EBGPMultihopTTL: 2, SourceAddress: router.SourceAddress, Keepalive: 10 * time.Second, ConnectRetry: 5 * time.Second}}
	if diff := cmp.Diff(want, sp.peers, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("the speaker's peers (-want +got):\n%s", diff)
	}
}

func TestAggregatesAndWeights(t *testing.T) {
	addr := netip.MustParseAddr
	svc := func(name string, policy datapath.TrafficPolicy, vip string, ready int) *datapath.Service {
		s := &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: name}, LoadBalancerIPs: []netip.Addr{addr(vip)},
			ExternalTrafficPolicy: policy, Ports: []datapath.ServicePort{{}}}
		for i := range ready {
			s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, datapath.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), Local: true, Ready: true})
		}
		return s
	}
	node := datapath.NodeInfo{Addresses: []netip.Addr{addr("192.0.2.11")}, Advertisements: []datapath.BGPAdvertisement{
		{Ranges: []datapath.AddressRange{{First: addr("203.0.113.0"), Last: addr("203.0.113.255")}}, AggregationLength: 24, Communities: []uint32{7},
			LargeCommunities: []bgpcommunity.Large{{Global: 4200000001, Local1: 1, Local2: 2}}},
		{Ranges: []datapath.AddressRange{{First: addr("198.51.100.0"), Last: addr("198.51.100.255")}}, AggregationLength: 24},
	}}
	st := datapath.NodeState{Node: node, Services: map[datapath.ServiceKey]*datapath.Service{}}
	for _, s := range []*datapath.Service{
		svc("a", datapath.Local, "203.0.113.7", 2),
		svc("b", datapath.Local, "203.0.113.9", 1),
		svc("none-here", datapath.Local, "203.0.113.10", 0),
		svc("c", datapath.Local, "198.51.100.7", 3),
		svc("d", datapath.Cluster, "198.51.100.8", 0),
		svc("outside", datapath.Local, "192.0.2.200", 1),
	} {
		st.Services[s.Key] = s
	}
	got := map[string]string{}
	for p, a := range Wanted(st, true) {
		got[p.String()] = fmt.Sprintf("via %s weight %d communities %v %v", a.NextHop, a.Weight, a.Communities, a.LargeCommunities)
	}
	want := map[string]string{
		"203.0.113.0/24":  "via 192.0.2.11 weight 3 communities [7] [large:4200000001:1:2]", // both Local services' endpoints
		"198.51.100.0/24": "via 192.0.2.11 weight 0 communities [] []",                      // a Cluster service in it: unweighted
		"192.0.2.200/32":  "via 192.0.2.11 weight 1 communities [] []",                      // in no pool: the address alone
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("announcements (-want +got):\n%s", diff)
	}
}

// TestAnL2PoolAnnouncedOverBGPToo: a node announces an address of an L2
// pool that is announced over BGP as well, through the pool's
// advertisements it was given, and not one of an L2 pool answered over
// L2 alone, nor one whose advertisement selects other nodes.
func TestAnL2PoolAnnouncedOverBGPToo(t *testing.T) {
	addr := netip.MustParseAddr
	rng := func(first, last string) []datapath.AddressRange {
		return []datapath.AddressRange{{First: addr(first), Last: addr(last)}}
	}
	st := datapath.NodeState{Node: datapath.NodeInfo{Name: "node2", Addresses: []netip.Addr{addr("192.0.2.12")},
		L2Pools: []datapath.L2Pool{{Ranges: rng("203.0.113.0", "203.0.113.7"), AnnouncedOverBGP: true}, {Ranges: rng("203.0.113.8", "203.0.113.15")}},
		// The pool's first advertisement selects this node; its second
		// (for another rack) does not, so the node was not given it.
		Advertisements: []datapath.BGPAdvertisement{{Name: "both#0", Ranges: rng("203.0.113.0", "203.0.113.7"), Communities: []uint32{65000<<16 | 7}}}},
		Services: map[datapath.ServiceKey]*datapath.Service{}}
	for _, s := range []struct {
		name, vip string
		advs      []string
	}{
		{"both", "203.0.113.1", []string{"both#0"}},
		{"other-rack", "203.0.113.2", []string{"both#1"}},
		{"l2-alone", "203.0.113.9", nil},
	} {
		svc := &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: s.name}, LoadBalancerIPs: []netip.Addr{addr(s.vip)},
			ExternalTrafficPolicy: datapath.Cluster}
		if s.advs != nil {
			svc.Advertisements = map[netip.Addr][]string{addr(s.vip): s.advs}
		}
		st.Services[svc.Key] = svc
	}
	got := map[string][]uint32{}
	for p, a := range Wanted(st, true) {
		got[p.String()] = a.Communities
	}
	if want := map[string][]uint32{"203.0.113.1/32": {65000<<16 | 7}}; !cmp.Equal(want, got) {
		t.Errorf("node2 announces %v; want %v", got, want)
	}
}

// TestOnlyTheChosenNodesAnnounce: where the server chose a service's
// announcers (the pool's max_announcing_nodes), a node announces the
// address only when it is among them.
func TestOnlyTheChosenNodesAnnounce(t *testing.T) {
	addr := netip.MustParseAddr
	svc := func(name, vip string, announcers ...string) *datapath.Service {
		s := &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: name}, LoadBalancerIPs: []netip.Addr{addr(vip)},
			ExternalTrafficPolicy: datapath.Cluster}
		if announcers != nil {
			s.Announcers = map[netip.Addr][]string{addr(vip): announcers}
		}
		return s
	}
	st := datapath.NodeState{Node: datapath.NodeInfo{Name: "node2", Addresses: []netip.Addr{addr("192.0.2.12")}},
		Services: map[datapath.ServiceKey]*datapath.Service{}}
	// An address of an L2 pool is answered by ARP, never announced.
	st.Node.L2Pools = []datapath.L2Pool{{Ranges: []datapath.AddressRange{{First: addr("203.0.113.4"), Last: addr("203.0.113.7")}}}}
	for _, s := range []*datapath.Service{
		svc("mine", "203.0.113.1", "node1", "node2"),
		svc("theirs", "203.0.113.2", "node1", "node3"),
		svc("unlimited", "203.0.113.3"),
		svc("l2", "203.0.113.4"),
		svc("other-controller", "203.0.113.8"),
	} {
		st.Services[s.Key] = s
	}
	// Another load-balancer controller announces its own services.
	st.Services[datapath.ServiceKey{Namespace: "default", Name: "other-controller"}].OtherController = true
	var got []string
	for p := range Wanted(st, true) {
		got = append(got, p.String())
	}
	slices.Sort(got)
	if want := []string{"203.0.113.1/32", "203.0.113.3/32"}; !slices.Equal(got, want) {
		t.Errorf("node2 announces %v, want %v", got, want)
	}
	// A node labelled out of external load balancers announces nothing.
	st.Node.Excluded = true
	if got := Wanted(st, true); len(got) != 0 {
		t.Errorf("an excluded node announces %v", got)
	}
}

// TestExportRulesNameThePoolsPeers: a pool that names peers is kept to
// them, by address, and an unnumbered one by its link (its address is the
// speaker's to find).
func TestExportRulesNameThePoolsPeers(t *testing.T) {
	addr := netip.MustParseAddr
	node := datapath.NodeInfo{
		BGPPeers: []datapath.BGPPeer{{Name: "upstream", Address: addr("192.0.2.1")}, {Name: "collector", Address: addr("192.0.2.2")}, {Address: addr("192.0.2.3")},
			{Name: "leaf", Interface: "swp1"}, {Name: "leaf-ll", Address: addr("fe80::1"), Interface: "swp2"}},
		Advertisements: []datapath.BGPAdvertisement{
			{Ranges: []datapath.AddressRange{{First: addr("203.0.113.10"), Last: addr("203.0.113.13")}}, Peers: []string{"upstream", "leaf", "leaf-ll"}},
			{Ranges: []datapath.AddressRange{{First: addr("2001:db8::"), Last: addr("2001:db8::ff")}}, Communities: []uint32{1}},
			{Ranges: []datapath.AddressRange{{First: addr("198.51.100.0"), Last: addr("198.51.100.255")}}, Peers: []string{"elsewhere"}},
		},
	}
	rules, _ := ExportRules(node, nil)
	got := fmt.Sprint(rules)
	want := "[{[203.0.113.10/31 203.0.113.12/31] [192.0.2.1 fe80::1] [swp1] false} {[198.51.100.0/24] [] [] false}]"
	if got != want {
		t.Errorf("rules %s, want %s", got, want)
	}
}

// recordingSpeaker is the BGP fake with the agent's peer and export seams.
type recordingSpeaker struct{ bgpfake.Recorder }

func (*recordingSpeaker) SetPeers(context.Context, []Peer) error             { return nil }
func (*recordingSpeaker) SetExportRules(context.Context, []ExportRule) error { return nil }
func (*recordingSpeaker) Close()                                             {}

// What the node speaker says and when: nothing is announced before the
// state is applied; an address no longer wanted, or a weight that drops,
// is said at once, when the state is received (before the rules change),
// while a new address or a weight that grows waits for the rules; a
// withdraw the speaker refused is tried again.
func TestAnnouncerSaysLessAtOnceAndMoreWhenApplied(t *testing.T) {
	addr := netip.MustParseAddr
	state := func(ready map[string]int) datapath.NodeState {
		st := datapath.NodeState{Node: datapath.NodeInfo{Addresses: []netip.Addr{addr("192.0.2.11")}}, Services: map[datapath.ServiceKey]*datapath.Service{}}
		for vip, n := range ready {
			s := &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: vip}, LoadBalancerIPs: []netip.Addr{addr(vip)},
				ExternalTrafficPolicy: datapath.Local, Ports: []datapath.ServicePort{{}}}
			for i := range n {
				s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, datapath.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), Local: true, Ready: true})
			}
			st.Services[s.Key] = s
		}
		return st
	}
	sp := &recordingSpeaker{}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	step := func(what string, do func(), want ...string) {
		t.Helper()
		do()
		got := sp.Calls()
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the speaker was told %q, want %q", what, got, want)
		}
	}
	step("received, not applied", func() { a.Received(state(map[string]int{"203.0.113.7": 2, "203.0.113.8": 1})) })
	step("applied", func() { a.Applied(0) },
		"announce 203.0.113.7/32 via 192.0.2.11 weight 2", "announce 203.0.113.8/32 via 192.0.2.11 weight 1")
	step("a weight drops, an address goes, another comes, a weight grows: received",
		func() { a.Received(state(map[string]int{"203.0.113.7": 1, "203.0.113.9": 1})) },
		"announce 203.0.113.7/32 via 192.0.2.11 weight 1", "withdraw 203.0.113.8/32 via 192.0.2.11")
	step("then applied", func() { a.Applied(0) }, "announce 203.0.113.9/32 via 192.0.2.11 weight 1")
	step("a weight grows: received", func() { a.Received(state(map[string]int{"203.0.113.7": 3, "203.0.113.9": 1})) })
	step("then applied", func() { a.Applied(0) }, "announce 203.0.113.7/32 via 192.0.2.11 weight 3")

	sp.Fail(true)
	step("a withdraw the speaker refuses", func() { a.Received(state(map[string]int{"203.0.113.7": 3})) })
	sp.Fail(false)
	step("is tried again at the next state", func() { a.Received(state(map[string]int{"203.0.113.7": 3})) }, "withdraw 203.0.113.9/32 via 192.0.2.11")
	if routes := sp.Routes(); len(routes) != 1 {
		t.Errorf("left announced: %v; want 203.0.113.7/32 alone", routes)
	}
}

// randomServices is a random service for the incremental tests: a
// load-balancer IP or two out of a few pools', Local or Cluster, with a
// few local endpoints, now and then limited to some announcers or owned
// by another controller.
func randomService(rng *rand.Rand, name string) *datapath.Service {
	s := &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: name}, Ports: []datapath.ServicePort{{}}}
	for range 1 + rng.IntN(2) {
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, byte(rng.IntN(3)), byte(rng.IntN(6))}))
	}
	if rng.IntN(2) == 0 {
		s.ExternalTrafficPolicy = datapath.Local
	}
	for i := range rng.IntN(4) {
		s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, datapath.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}),
			Local: rng.IntN(3) > 0, Ready: rng.IntN(4) > 0})
	}
	if rng.IntN(8) == 0 {
		s.Announcers = map[netip.Addr][]string{s.LoadBalancerIPs[0]: {fmt.Sprintf("node%d", rng.IntN(2))}}
	}
	s.OtherController = rng.IntN(16) == 0
	return s
}

// randomNode is the node with random addresses, pools, L2 pools, drain.
func randomNode(rng *rand.Rand) datapath.NodeInfo {
	addr := netip.MustParseAddr
	n := datapath.NodeInfo{Name: fmt.Sprintf("node%d", rng.IntN(2)), Addresses: []netip.Addr{addr(fmt.Sprintf("192.0.2.%d", 1+rng.IntN(2)))},
		Drained: rng.IntN(8) == 0}
	if rng.IntN(2) == 0 {
		// 203.0.0.x aggregated to a /24, 203.0.1.x announced alone with
		// communities; 203.0.2.x in no pool.
		n.Advertisements = []datapath.BGPAdvertisement{
			{Ranges: []datapath.AddressRange{{First: addr("203.0.0.0"), Last: addr("203.0.0.255")}}, AggregationLength: 24 + rng.IntN(2)*6},
			{Ranges: []datapath.AddressRange{{First: addr("203.0.1.0"), Last: addr("203.0.1.255")}}, Communities: []uint32{uint32(rng.IntN(2))}},
		}
	}
	if rng.IntN(4) == 0 {
		n.L2Pools = []datapath.L2Pool{{Ranges: []datapath.AddressRange{{First: addr("203.0.2.4"), Last: addr("203.0.2.5")}}}}
	}
	return n
}

// TestAnnouncerFollowsChangesAsAWholeStateWould: over random states
// handed over as changes (Changed naming the services that differ), with
// node changes, proxy health flips and a speaker that fails now and
// then, the incremental announcer leaves the speaker with exactly the
// routes of an announcer that works out Wanted from the whole state at
// every step, after each state received and each apply.
func TestAnnouncerFollowsChangesAsAWholeStateWould(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 4))
		healthy := true
		proxyHealthy := func() bool { return healthy }
		sp := &recordingSpeaker{}
		a := NewAnnouncer(sp, proxyHealthy, log)
		// The reference: Wanted over the whole state, reconciled whole.
		ref := &bgpfake.Recorder{}
		refAnnounced := map[netip.Prefix]Announcement{}
		reconcileRef := func(st datapath.NodeState, rise bool) {
			bgpspeaker.Reconcile(context.Background(), ref, refAnnounced, Wanted(st, healthy), func(p netip.Prefix) netip.Prefix { return p }, rise, log)
		}
		st := datapath.NodeState{Node: randomNode(rng), Services: map[datapath.ServiceKey]*datapath.Service{}}
		for step := range 300 {
			next := datapath.NodeState{Node: st.Node, Services: maps.Clone(st.Services), Changed: []datapath.ServiceKey{}}
			if rng.IntN(10) == 0 {
				next.Node = randomNode(rng)
			}
			for range rng.IntN(4) {
				name := fmt.Sprintf("s%d", rng.IntN(15))
				key := datapath.ServiceKey{Namespace: "default", Name: name}
				if rng.IntN(4) == 0 {
					delete(next.Services, key)
				} else {
					next.Services[key] = randomService(rng, name)
				}
				next.Changed = append(next.Changed, key)
			}
			if rng.IntN(20) == 0 {
				next.Changed = nil // a whole state
			}
			if rng.IntN(15) == 0 {
				healthy = !healthy
			}
			fail := rng.IntN(12) == 0
			sp.Fail(fail)
			ref.Fail(fail)
			check := func(when string) {
				t.Helper()
				if diff := cmp.Diff(ref.Routes(), sp.Routes(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
					cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
					t.Fatalf("seed %d, step %d, %s: routes (-whole state +incremental):\n%s", seed, step, when, diff)
				}
			}
			a.Received(next)
			reconcileRef(next, false)
			check("received")
			if rng.IntN(5) > 0 {
				a.Applied(0)
				reconcileRef(next, true)
				check("applied")
			}
			st = next
		}
	}
}

// TestAPrefixWithdrawnForNewExportRulesComesBack: when the peer a pool
// names moves to another address, what the pool announced is withdrawn
// under the old rules and announced again, under the new ones, at the
// next apply, though no service changed.
func TestAPrefixWithdrawnForNewExportRulesComesBack(t *testing.T) {
	addr := netip.MustParseAddr
	sp := &recordingSpeaker{}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	key := datapath.ServiceKey{Namespace: "default", Name: "web"}
	node := datapath.NodeInfo{Addresses: []netip.Addr{addr("192.0.2.11")}, Advertisements: []datapath.BGPAdvertisement{
		{Ranges: []datapath.AddressRange{{First: addr("203.0.113.0"), Last: addr("203.0.113.255")}}, Peers: []string{"upstream"}}},
		BGPPeers: []datapath.BGPPeer{{Name: "upstream", Address: addr("192.0.2.1")}}}
	services := map[datapath.ServiceKey]*datapath.Service{key: {Key: key, LoadBalancerIPs: []netip.Addr{addr("203.0.113.7")}}}
	a.Received(datapath.NodeState{Node: node, Services: services})
	a.Applied(0)
	sp.Calls()
	node.BGPPeers = []datapath.BGPPeer{{Name: "upstream", Address: addr("192.0.2.2")}}
	a.Received(datapath.NodeState{Node: node, Services: services, Changed: []datapath.ServiceKey{}})
	a.Applied(0)
	want := []string{"withdraw 203.0.113.7/32 via 192.0.2.11", "announce 203.0.113.7/32 via 192.0.2.11 weight 0"}
	if got := sp.Calls(); !slices.Equal(got, want) {
		t.Errorf("the speaker was told %q, want %q", got, want)
	}
}

// TestAServiceMovedToAnotherAdvertisementsPeersIsWithdrawnFirst: in a
// pool whose advertisements (chosen by service) name different peers, a
// service that moves from one to the other is withdrawn under the old
// rules (its old peers hear it go) and announced again under the new
// ones; another service of the pool is left be.
func TestAServiceMovedToAnotherAdvertisementsPeersIsWithdrawnFirst(t *testing.T) {
	addr := netip.MustParseAddr
	sp := &recordingSpeaker{}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	pool := []datapath.AddressRange{{First: addr("203.0.113.0"), Last: addr("203.0.113.255")}}
	node := datapath.NodeInfo{Addresses: []netip.Addr{addr("192.0.2.11")}, Advertisements: []datapath.BGPAdvertisement{
		{Name: "split#0", Ranges: pool, Peers: []string{"tor"}}, {Name: "split#1", Ranges: pool, Peers: []string{"collector"}}},
		BGPPeers: []datapath.BGPPeer{{Name: "tor", Address: addr("192.0.2.1")}, {Name: "collector", Address: addr("192.0.2.2")}}}
	svc := func(name, vip, adv string) *datapath.Service {
		return &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: name}, LoadBalancerIPs: []netip.Addr{addr(vip)},
			Advertisements: map[netip.Addr][]string{addr(vip): {adv}}}
	}
	web, db := svc("web", "203.0.113.7", "split#0"), svc("db", "203.0.113.8", "split#0")
	services := map[datapath.ServiceKey]*datapath.Service{web.Key: web, db.Key: db}
	a.Received(datapath.NodeState{Node: node, Services: services})
	a.Applied(0)
	if got, want := fmt.Sprint(a.rules), "[{[203.0.113.7/32 203.0.113.8/32] [192.0.2.1] [] true}]"; got != want {
		t.Fatalf("rules %s, want %s", got, want)
	}
	sp.Calls()
	services[web.Key] = svc("web", "203.0.113.7", "split#1")
	a.Received(datapath.NodeState{Node: node, Services: services, Changed: []datapath.ServiceKey{web.Key}})
	if got, want := fmt.Sprint(a.rules), "[{[203.0.113.7/32] [192.0.2.2] [] true} {[203.0.113.8/32] [192.0.2.1] [] true}]"; got != want {
		t.Errorf("rules %s, want %s", got, want)
	}
	a.Applied(0)
	want := []string{"withdraw 203.0.113.7/32 via 192.0.2.11", "announce 203.0.113.7/32 via 192.0.2.11 weight 0"}
	if got := sp.Calls(); !slices.Equal(got, want) {
		t.Errorf("the speaker was told %q, want %q", got, want)
	}
}
