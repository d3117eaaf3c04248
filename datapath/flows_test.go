package datapath

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

func flowsState(ring int, peers ...FlowPeer) NodeState {
	st := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false), ep("fd00:244:1::11", true)))
	st.Node.Addresses = append(st.Node.Addresses, netip.MustParseAddr("2001:db8::11"))
	st.Node.FlowRing, st.Node.FlowPeers = ring, peers
	return st
}

// A new connection's first packet goes where it went without redirection:
// the rules that pass moved connections on never touch it.
func TestNewConnectionsIgnoreTheFlowRules(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
	if err := dp.Apply(ctx, flowsState(3, FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}})); err != nil {
		t.Fatal(err)
	}
	both := verdict{Endpoints: []string{"10.244.1.11:8080", "10.244.2.11:8080"}}
	for _, src := range []netip.Addr{podSource, externalSource} {
		if diff := cmp.Diff(both, trace(t, v4, src, "tcp", netip.MustParseAddrPort("203.0.113.10:80"))); diff != "" {
			t.Errorf("from %s (-want +got):\n%s", src, diff)
		}
	}
}

// How far a moved packet may go is the ring's size, per family with a
// peer to send it to; no ring, no redirection.
func TestFlowTTLsFollowTheRing(t *testing.T) {
	ctx := context.Background()
	peer4 := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}}
	peer46 := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}
	for _, tc := range []struct {
		name   string
		st     NodeState
		v4, v6 []string
	}{
		{"no ring", flowsState(0), nil, nil},
		{"two nodes: the first node sends, the next serves", flowsState(2, peer46), []string{"255"}, []string{"255"}},
		{"four nodes", flowsState(4, peer46), []string{"253-255"}, []string{"253-255"}},
		{"no IPv6 peer", flowsState(4, peer4), []string{"253-255"}, nil},
		{"a ring larger than TTLs allow", flowsState(1000, peer46), []string{"16-255"}, []string{"16-255"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, v6 := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
			if err := dp.Apply(ctx, tc.st); err != nil {
				t.Fatal(err)
			}
			for _, f := range []struct {
				name string
				fake *knftables.Fake
				want []string
			}{{"ip", v4, tc.v4}, {"ip6", v6, tc.v6}} {
				var got []string
				for _, e := range f.fake.Table.Sets[genOf(f.fake.Table).of(flowTTLsSet)].Elements {
					got = append(got, e.Key...)
				}
				if diff := cmp.Diff(f.want, got); diff != "" {
					t.Errorf("%s flow TTLs (-want +got):\n%s", f.name, diff)
				}
			}
		})
	}
}

// A packet of an established connection that a router moved here: passed
// on unchanged (but for its TTL) while the ring has a node it has not met,
// served here once it went round, and counted either way; a packet of a
// connection this node holds is served here, counted by the nodes it
// crossed when a peer passed it.
func TestMovedPacketsArePassedOnAndCounted(t *testing.T) {
	ctx := context.Background()
	peer := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}
	vip := netip.AddrPortFrom(lbIP, 80)
	endpoint := netip.MustParseAddrPort("10.244.1.11:8080")
	both := []string{"10.244.1.11:8080", "10.244.2.11:8080"}
	for _, tc := range []struct {
		name string
		ring int
		pkt  packet
		want verdict
	}{{
		name: "a moved packet's first arrival from the uplink",
		ring: 4,
		pkt:  packet{iif: uplink, midFlow: true},
		want: verdict{PassedOn: true, PassedTTL: FlowTTL, Counted: []string{counterPassedConnections, counterPassedPackets}},
	}, {
		name: "a later packet of a connection passed on",
		ring: 4,
		pkt:  packet{iif: uplink, midFlow: true, entered: true},
		want: verdict{PassedOn: true, PassedTTL: FlowTTL, Counted: []string{counterPassedPackets}},
	}, {
		name: "from a peer, with nodes of the ring left: on, its TTL kept",
		ring: 4,
		pkt:  packet{iif: "weir-flows", midFlow: true, ttl: FlowTTL - 2},
		want: verdict{PassedOn: true, PassedTTL: FlowTTL - 2, Counted: []string{counterPassedConnections, counterPassedPackets}},
	}, {
		name: "from a peer, round the ring: served here, counted as unowned",
		ring: 2,
		pkt:  packet{iif: "weir-flows", midFlow: true, ttl: FlowTTL - 1},
		want: verdict{Endpoints: both, Masqueraded: both, Counted: []string{counterUnowned}},
	}, {
		// Its entry has no DNAT (the node passed the connection on
		// before): routed to the load-balancer IP, it would go back to
		// the router and round the ring for ever.
		name: "round the ring, on a node that passed the connection on before: refused",
		ring: 2,
		pkt:  packet{iif: "weir-flows", midFlow: true, entered: true, ttl: FlowTTL - 1},
		want: verdict{Rejected: true, Counted: []string{counterUnowned}},
	}, {
		// Out of its entry's window (a stale entry of a reused port):
		// no entry, so passed on like any moved packet...
		name: "out of window, with nodes of the ring left: passed on",
		ring: 4,
		pkt:  packet{iif: uplink, midFlow: true, invalid: true},
		want: verdict{PassedOn: true, PassedTTL: FlowTTL, Counted: []string{counterPassedPackets}},
	}, {
		// ...and once round the ring, never routed back to the router.
		name: "out of window, round the ring: dropped",
		ring: 2,
		pkt:  packet{iif: "weir-flows", midFlow: true, invalid: true, ttl: FlowTTL - 1},
		want: verdict{Dropped: true, Counted: []string{counterUnowned}},
	}, {
		// A TTL no client sends with, within a ring's reach of
		// FlowTTL: it came back from the router after leaving the
		// ring on a node without rules; a fresh TTL would send it
		// round again, for ever.
		name: "back from the router with a ring's TTL: dropped, not sent round again",
		ring: 4,
		pkt:  packet{iif: uplink, midFlow: true, ttl: FlowTTL - 5},
		want: verdict{Dropped: true, Counted: []string{counterUnowned}},
	}, {
		name: "a client's highest TTL still gets a fresh one",
		ring: 4,
		pkt:  packet{iif: uplink, midFlow: true, ttl: maxEntryTTL},
		want: verdict{PassedOn: true, PassedTTL: FlowTTL, Counted: []string{counterPassedConnections, counterPassedPackets}},
	}, {
		name: "no ring: served here, counted as unowned",
		ring: 0,
		pkt:  packet{iif: uplink, midFlow: true},
		want: verdict{Endpoints: both, Masqueraded: both, Counted: []string{counterUnowned}},
	}, {
		name: "held here, passed by the next node",
		ring: 4,
		pkt:  packet{iif: "weir-flows", midFlow: true, heldBy: endpoint, ttl: FlowTTL - 1},
		want: verdict{Endpoints: []string{endpoint.String()}, Counted: []string{counterTaken1}},
	}, {
		name: "held here, passed by three nodes",
		ring: 4,
		pkt:  packet{iif: "weir-flows", midFlow: true, heldBy: endpoint, ttl: FlowTTL - 3},
		want: verdict{Endpoints: []string{endpoint.String()}, Counted: []string{counterTaken3}},
	}, {
		name: "held here, passed by many",
		ring: 40,
		pkt:  packet{iif: "weir-flows", midFlow: true, heldBy: endpoint, ttl: FlowTTL - 30},
		want: verdict{Endpoints: []string{endpoint.String()}, Counted: []string{counterTakenMore}},
	}, {
		name: "held here, from the uplink: nothing to count",
		ring: 4,
		pkt:  packet{iif: uplink, midFlow: true, heldBy: endpoint},
		want: verdict{Endpoints: []string{endpoint.String()}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
			var peers []FlowPeer
			if tc.ring > 0 {
				peers = []FlowPeer{peer}
			}
			if err := dp.Apply(ctx, flowsState(tc.ring, peers...)); err != nil {
				t.Fatal(err)
			}
			pkt := tc.pkt
			pkt.src, pkt.proto, pkt.dst = externalSource, "tcp", vip
			if diff := cmp.Diff(tc.want, traceFlow(t, v4, pkt)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// FlowCounts adds up both families' counters, and a full sync keeps what
// they counted.
func TestFlowCountsSurviveFullSyncs(t *testing.T) {
	ctx := context.Background()
	dp, v4, v6 := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
	st := flowsState(2, FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}})
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	count := func(fake *knftables.Fake, name string, n uint64) {
		c := fake.Table.Counters[name]
		if c == nil {
			t.Fatalf("no counter %s in the %s table", name, fake.Table.Family)
		}
		c.Packets = knftables.PtrTo(n)
	}
	count(v4, counterPassedPackets, 10)
	count(v6, counterPassedPackets, 5)
	count(v4, counterPassedConnections, 2)
	count(v4, counterTaken1, 7)
	count(v6, counterTakenMore, 1)
	count(v4, counterUnowned, 3)
	want := FlowCounts{PassedPackets: 15, PassedConnections: 2, TakenPackets: [4]uint64{7, 0, 0, 1}, UnownedPackets: 3}
	if err := dp.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := dp.FlowCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counts after a full sync (-want +got):\n%s", diff)
	}
	plain, _, _ := newConfiguredFakeDatapath(Config{})
	if got, err := plain.FlowCounts(ctx); err != nil || got != (FlowCounts{}) {
		t.Errorf("without redirection: %+v, %v; want nothing", got, err)
	}
}

// The tunnel's port takes only the nodes that pass packets to this one:
// a host that is not one of them is dropped (and counted) before the
// kernel's VXLAN socket sees its packet; nothing else the node receives
// is filtered, whatever the source.
func TestFlowTunnelTakesOnlyItsSenders(t *testing.T) {
	ctx := context.Background()
	sender := FlowPeer{Name: "node4", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.14"), netip.MustParseAddr("2001:db8::14")}}
	next := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}
	stranger, stranger6 := netip.MustParseAddr("192.0.2.99"), netip.MustParseAddr("2001:db8::99")
	refused := verdict{Dropped: true, Counted: []string{counterRefusedNotAPeer}}
	for _, tc := range []struct {
		name    string
		port    uint16 // FlowRedirect.Port
		senders []FlowPeer
		src     netip.Addr
		proto   string
		dst     netip.AddrPort
		want    verdict
	}{
		{name: "from the node before this one", senders: []FlowPeer{sender}, src: sender.Addresses[0], proto: "udp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort)},
		{name: "from the node before it, over IPv6", senders: []FlowPeer{sender}, src: sender.Addresses[1], proto: "udp", dst: netip.MustParseAddrPort("[2001:db8::11]:7449")},
		{name: "from a host that is not a node", senders: []FlowPeer{sender}, src: stranger, proto: "udp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort), want: refused},
		{name: "from a host that is not a node, over IPv6", senders: []FlowPeer{sender}, src: stranger6, proto: "udp", dst: netip.MustParseAddrPort("[2001:db8::11]:7449"), want: refused},
		// It passes packets to this node's next one, not to this one.
		{name: "from the next node", senders: []FlowPeer{sender}, src: next.Addresses[0], proto: "udp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort), want: refused},
		{name: "no sender known", src: sender.Addresses[0], proto: "udp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort), want: refused},
		{name: "the port the agent was given", port: 9000, senders: []FlowPeer{sender}, src: stranger, proto: "udp", dst: netip.AddrPortFrom(nodeAddr, 9000), want: refused},
		{name: "another port, from anyone", port: 9000, senders: []FlowPeer{sender}, src: stranger, proto: "udp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort)},
		{name: "DNS on the node, from anyone", senders: []FlowPeer{sender}, src: stranger, proto: "udp", dst: netip.AddrPortFrom(nodeAddr, 53)},
		{name: "TCP to the same port number, from anyone", senders: []FlowPeer{sender}, src: stranger, proto: "tcp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort)},
		{name: "a connection to a load-balancer IP, from anyone", senders: []FlowPeer{sender}, src: stranger, proto: "tcp", dst: netip.AddrPortFrom(lbIP, 80),
			want: verdict{Endpoints: []string{"10.244.1.11:8080", "10.244.2.11:8080"}, Masqueraded: []string{"10.244.1.11:8080", "10.244.2.11:8080"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, v6 := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows", Port: tc.port}})
			st := flowsState(4, next)
			st.Node.FlowSenders = tc.senders
			if err := dp.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			fake := v4
			if tc.src.Is6() {
				fake = v6
			}
			got := traceFlow(t, fake, packet{src: tc.src, iif: uplink, proto: tc.proto, dst: tc.dst})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The senders follow the node's state: a change of the ring replaces
// them in place (a partial sync), and a full sync keeps them.
func TestFlowSendersFollowTheRing(t *testing.T) {
	ctx := context.Background()
	node3 := FlowPeer{Name: "node3", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.13")}}
	node4 := FlowPeer{Name: "node4", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.14")}}
	dp, v4, _ := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
	takes := func(sender FlowPeer) bool {
		t.Helper()
		return !traceFlow(t, v4, packet{src: sender.Addresses[0], iif: uplink, proto: "udp", dst: netip.AddrPortFrom(nodeAddr, DefaultFlowPort)}).Dropped
	}
	st := flowsState(3, node3)
	st.Node.FlowSenders = []FlowPeer{node3}
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if !takes(node3) || takes(node4) {
		t.Fatalf("senders node3: takes node3 %v, node4 %v; want only node3", takes(node3), takes(node4))
	}
	st = flowsState(3, node4)
	st.Node.FlowSenders = []FlowPeer{node4}
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if takes(node3) || !takes(node4) {
		t.Errorf("senders node4: takes node3 %v, node4 %v; want only node4", takes(node3), takes(node4))
	}
	if err := dp.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	if takes(node3) || !takes(node4) {
		t.Errorf("after a full sync: takes node3 %v, node4 %v; want only node4", takes(node3), takes(node4))
	}
}

// What comes through the tunnel is what a peer passes on: a TCP packet
// to a load-balancer or external IP (a SYN too: a peer passes on one
// that a stale entry of its own took), or a probe to the node itself,
// whose answer the table marks as its own (datapath.FlowProbeAnsweredID).
// Anything else is dropped and counted, an entry for it or not; a SYN
// meets the service's source ranges as it would from the router.
func TestFlowTunnelTakesOnlyWhatPeersPassOn(t *testing.T) {
	ctx := context.Background()
	peer := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}}
	svc := webService(ep("10.244.1.11", true), ep("10.244.2.11", false))
	svc.Ports = append(svc.Ports, ServicePort{Name: "dns", Protocol: UDP, Port: 53, NodePort: 30053, Endpoints: []Endpoint{ep("10.244.1.11", true)}})
	ranged := &Service{Key: ServiceKey{"default", "ranged"}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.20")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/28")},
		Ports:                    []ServicePort{{Name: "http", Protocol: TCP, Port: 80, Endpoints: []Endpoint{ep("10.244.1.12", true)}}}}
	both := []string{"10.244.1.11:8080", "10.244.2.11:8080"}
	refused := verdict{Dropped: true, Counted: []string{counterRefusedNotPassedOn}}
	outsideRanges := netip.MustParseAddr("198.51.100.77")
	for _, tc := range []struct {
		name string
		pkt  packet
		want verdict
	}{{
		name: "a moved TCP packet to a load-balancer IP",
		pkt:  packet{src: externalSource, proto: "tcp", dst: netip.AddrPortFrom(lbIP, 80), midFlow: true, ttl: FlowTTL - 1},
		want: verdict{Endpoints: both, Masqueraded: both, Counted: []string{counterUnowned}},
	}, {
		name: "a SYN to a load-balancer IP",
		pkt:  packet{src: externalSource, proto: "tcp", dst: netip.AddrPortFrom(lbIP, 80), ttl: FlowTTL - 1},
		want: verdict{Endpoints: both, Masqueraded: both},
	}, {
		name: "a SYN from outside the service's source ranges",
		pkt:  packet{src: outsideRanges, proto: "tcp", dst: netip.MustParseAddrPort("203.0.113.20:80"), ttl: FlowTTL - 1},
		want: verdict{Dropped: true},
	}, {
		name: "a probe to the node",
		pkt:  packet{src: peer.Addresses[0], proto: "icmp", dst: netip.AddrPortFrom(nodeAddr, 0)},
		want: verdict{},
	}, {
		// The table marks the answer as its own: a node whose rules
		// are gone answers with the identifier unchanged.
		name: "a peer's probe to the node",
		pkt:  packet{src: peer.Addresses[0], proto: "icmp", dst: netip.AddrPortFrom(nodeAddr, 0), icmpID: FlowProbeID},
		want: verdict{EchoIDSet: FlowProbeAnsweredID},
	}, {
		name: "a peer's probe to a load-balancer IP",
		pkt:  packet{src: peer.Addresses[0], proto: "icmp", dst: netip.AddrPortFrom(lbIP, 0), icmpID: FlowProbeID},
		want: verdict{Dropped: true, Counted: []string{counterRefusedNotPassedOn}, EchoIDSet: FlowProbeAnsweredID},
	}, {
		name: "a datagram to a load-balancer IP",
		pkt:  packet{src: externalSource, proto: "udp", dst: netip.AddrPortFrom(lbIP, 53), ttl: FlowTTL - 1},
		want: refused,
	}, {
		name: "a datagram of a flow this node DNAT'ed",
		pkt:  packet{src: externalSource, proto: "udp", dst: netip.AddrPortFrom(lbIP, 53), midFlow: true, heldBy: netip.MustParseAddrPort("10.244.1.11:8080"), ttl: FlowTTL - 1},
		want: refused,
	}, {
		name: "a SYN to a cluster IP",
		pkt:  packet{src: externalSource, proto: "tcp", dst: netip.AddrPortFrom(clusterIP, 80), ttl: FlowTTL - 1},
		want: refused,
	}, {
		name: "a SYN to a node port",
		pkt:  packet{src: externalSource, proto: "tcp", dst: netip.AddrPortFrom(nodeAddr, 30080), ttl: FlowTTL - 1},
		want: refused,
	}, {
		name: "a SYN to a pod",
		pkt:  packet{src: externalSource, proto: "tcp", dst: netip.MustParseAddrPort("10.244.1.11:8080"), ttl: FlowTTL - 1},
		want: refused,
	}, {
		name: "an echo request to a load-balancer IP",
		pkt:  packet{src: externalSource, proto: "icmp", dst: netip.AddrPortFrom(lbIP, 0)},
		want: refused,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
			st := flowsState(2, peer)
			st.Node.FlowSenders = []FlowPeer{peer}
			st.Services[ranged.Key] = ranged
			st.Services[svc.Key] = svc
			if err := dp.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			pkt := tc.pkt
			pkt.iif = "weir-flows"
			if diff := cmp.Diff(tc.want, traceFlow(t, v4, pkt)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			// From the router, the same packet meets the same source
			// ranges.
			if tc.pkt.src == outsideRanges {
				pkt.iif = uplink
				if got := traceFlow(t, v4, pkt); !got.Dropped {
					t.Errorf("from the router: %+v; want it dropped as through the tunnel", got)
				}
			}
		})
	}
}
