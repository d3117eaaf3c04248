package datapath

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

func dnsService(proto Protocol, eps ...Endpoint) *Service {
	return &Service{
		Key:        ServiceKey{"kube-system", "dns"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")},
		Ports:      []ServicePort{{Name: "dns", Protocol: proto, Port: 53, NodePort: 30053, Endpoints: eps}},
	}
}

func terminating(e Endpoint, serving bool) Endpoint {
	e.Ready, e.Serving, e.Terminating = false, serving, true
	return e
}

func onPort(e Endpoint, port uint16) Endpoint {
	e.Port = port
	return e
}

func TestStaleUDPConntrackEntriesAreCleared(t *testing.T) {
	ctx := context.Background()
	a, b := ep("10.244.1.11", true), ep("10.244.2.11", false)
	vip := netip.MustParseAddr("10.96.0.53")
	for _, tc := range []struct {
		name        string
		proto       Protocol
		before, now []Endpoint
		want        []UDPFlow
	}{
		{"removed endpoint", UDP, []Endpoint{a, b}, []Endpoint{a}, []UDPFlow{
			{Dst: vip, Port: 53, Endpoint: b.Addr, EndpointPort: 8080}, {Port: 30053, Endpoint: b.Addr, EndpointPort: 8080}}},
		{"removed endpoint whose slot another one takes", UDP, []Endpoint{a, b}, []Endpoint{b}, []UDPFlow{
			{Dst: vip, Port: 53, Endpoint: a.Addr, EndpointPort: 8080}, {Port: 30053, Endpoint: a.Addr, EndpointPort: 8080}}},
		{"first endpoint of a service that had none", UDP, nil, []Endpoint{a}, []UDPFlow{{Dst: vip, Port: 53}, {Port: 30053}}},
		{"endpoint added", UDP, []Endpoint{a}, []Endpoint{a, b}, nil},
		// kube-proxy keeps the flows of an endpoint that still serves: a
		// UDP service drains gracefully.
		{"endpoint terminating but still serving", UDP, []Endpoint{a, b}, []Endpoint{a, terminating(b, true)}, nil},
		{"endpoint terminating and no longer serving", UDP, []Endpoint{a, b}, []Endpoint{a, terminating(b, false)}, []UDPFlow{
			{Dst: vip, Port: 53, Endpoint: b.Addr, EndpointPort: 8080}, {Port: 30053, Endpoint: b.Addr, EndpointPort: 8080}}},
		// The same pod, another target port: its flows still go to the
		// old port, where nothing may answer any more.
		{"endpoint's port changed", UDP, []Endpoint{a, b}, []Endpoint{a, onPort(b, 9090)}, []UDPFlow{
			{Dst: vip, Port: 53, Endpoint: b.Addr, EndpointPort: 8080}, {Port: 30053, Endpoint: b.Addr, EndpointPort: 8080}}},
		{"TCP entries are left alone", TCP, []Endpoint{a, b}, []Endpoint{a}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := &FakeConntrack{}
			dp := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), Config{Conntrack: ct})
			if err := dp.Apply(ctx, nodeState(dnsService(tc.proto, tc.before...))); err != nil {
				t.Fatal(err)
			}
			if err := dp.Apply(ctx, nodeState(dnsService(tc.proto, tc.now...))); err != nil {
				t.Fatal(err)
			}
			sortFlows := func(f []UDPFlow) {
				slices.SortFunc(f, func(x, y UDPFlow) int { return strings.Compare(x.String(), y.String()) })
			}
			sortFlows(ct.Cleared)
			sortFlows(tc.want)
			if diff := cmp.Diff(tc.want, ct.Cleared, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("cleared flows (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUDPFlowsCachedBeforeAServiceExistedAreCleared: a datagram sent to a
// cluster IP before its service reached the node was routed as it was,
// and conntrack keeps that un-NAT'ed entry for as long as the client
// keeps sending; when the service arrives with endpoints, those entries
// (the reply comes from the frontend itself) go, and DNAT'ed ones stay.
func TestUDPFlowsCachedBeforeAServiceExistedAreCleared(t *testing.T) {
	ctx := context.Background()
	ct := &FakeConntrack{}
	dp := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), Config{Conntrack: ct})
	web := webService(ep("10.244.1.10", true))
	if err := dp.Apply(ctx, nodeState(web)); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.96.0.53")
	if err := dp.Apply(ctx, nodeState(web, dnsService(UDP, ep("10.244.1.11", true)))); err != nil {
		t.Fatal(err)
	}
	want := []UDPFlow{{Dst: vip, Port: 53, Endpoint: vip}}
	if diff := cmp.Diff(want, ct.Cleared, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("cleared flows (-want +got):\n%s", diff)
	}
}

// TestTrafficPolicyChangesClearNoUDPFlows: an endpoint that leaves a
// frontend's backends because of the traffic policy still serves the
// service, so its flows stay (as in kube-proxy).
func TestTrafficPolicyChangesClearNoUDPFlows(t *testing.T) {
	ctx := context.Background()
	a, b := ep("10.244.1.11", true), ep("10.244.2.11", false)
	for _, policies := range [][2]TrafficPolicy{{Local, Cluster}, {Cluster, Local}} {
		ct := &FakeConntrack{}
		dp := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), Config{Conntrack: ct})
		for _, p := range policies {
			svc := dnsService(UDP, a, b)
			svc.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.53")}
			svc.ExternalTrafficPolicy, svc.InternalTrafficPolicy = p, p
			if err := dp.Apply(ctx, nodeState(svc)); err != nil {
				t.Fatal(err)
			}
		}
		if len(ct.Cleared) != 0 {
			t.Errorf("policy %v to %v cleared %v; want nothing", policies[0], policies[1], ct.Cleared)
		}
	}
}

// TestAWholeStateClearsUDPEntriesNoRuleCaught: datagrams sent to a UDP
// service before the node's rules were written (the agent starting, or
// its first state arriving after the client began) left entries that go
// where the datagram went; a whole state clears those of frontends with
// endpoints, and no other.
func TestAWholeStateClearsUDPEntriesNoRuleCaught(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.53")
	other := netip.MustParseAddr("192.0.2.99")
	ct := &FakeConntrack{NotDNATed: []UDPFlow{
		{Dst: vip, Port: 53, Endpoint: vip},
		{Dst: vip, Port: 54, Endpoint: vip},     // a port the service does not serve
		{Dst: other, Port: 53, Endpoint: other}, // no service's address
	}}
	dp := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), Config{Conntrack: ct})
	if err := dp.Apply(context.Background(), nodeState(dnsService(UDP, ep("10.244.1.11", true)))); err != nil {
		t.Fatal(err)
	}
	want := []UDPFlow{{Dst: vip, Port: 53, Endpoint: vip}}
	if diff := cmp.Diff(want, ct.Cleared, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("cleared flows (-want +got):\n%s", diff)
	}
}

// TestAWholeStateWithoutUDPEndpointsListsNoConntrack: a whole state in
// which no UDP port has an endpoint has no flow to clear, and the table of
// connections (whose listing walks every bucket of its hash) is not read.
func TestAWholeStateWithoutUDPEndpointsListsNoConntrack(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.53")
	ct := &FakeConntrack{NotDNATed: []UDPFlow{{Dst: vip, Port: 53, Endpoint: vip}}}
	for _, c := range []struct {
		what     string
		state    NodeState
		listings int
	}{
		{"TCP only", nodeState(dnsService(TCP, ep("10.244.1.11", true))), 0},
		{"UDP without endpoints", nodeState(dnsService(UDP)), 0},
		{"UDP with an endpoint", nodeState(dnsService(UDP, ep("10.244.1.11", true))), 1},
	} {
		ct.Listings, ct.Cleared = 0, nil
		dp := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), Config{Conntrack: ct})
		if err := dp.Apply(context.Background(), c.state); err != nil {
			t.Fatal(err)
		}
		if ct.Listings != c.listings || len(ct.Cleared) != c.listings {
			t.Errorf("%s: listed %d times, cleared %v; want %d listing(s) and as many flows", c.what, ct.Listings, ct.Cleared, c.listings)
		}
	}
}

// TestConntrackListsUDPEntriesNoRuleCaught: the real Conntrack lists, from
// the kernel's table, the UDP entries of both families whose replies come
// from their original destination, and not a UDP flow DNAT'ed elsewhere,
// nor a TCP connection.
func TestConntrackListsUDPEntriesNoRuleCaught(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"nft", "add table inet t"},
		{"nft", "add chain inet t out { type nat hook output priority -100 ; }"},
		{"nft", "add rule inet t out ct state new udp dport 5454 dnat ip to 127.0.0.2"},
		{"nft", "add rule inet t out ct state new udp dport 5456 dnat ip to 127.0.0.1:5455"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	send := func(network, to string) {
		// A listener that never answers: the entry stays unreplied.
		l, err := net.ListenPacket(network, to)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.Dial(network, to)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
	}
	send("udp4", "127.0.0.1:53")
	send("udp6", "[::1]:53")
	for _, dnat := range []struct{ to, from string }{
		{"127.0.0.2:5454", "127.0.0.1:5454"}, // to another address
		{"127.0.0.1:5455", "127.0.0.1:5456"}, // to another port
	} {
		l, err := net.ListenPacket("udp4", dnat.to)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.Dial("udp4", dnat.from)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
	}
	tl, err := net.Listen("tcp4", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tc, err := net.Dial("tcp4", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()

	ct := &ConntrackTool{}
	for range 2 { // and again on the socket it kept
		got, err := ct.NotDNATedUDP(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		v4, v6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
		want := []UDPFlow{{Dst: v4, Port: 53, Endpoint: v4}, {IPv6: true, Dst: v6, Port: 53, Endpoint: v6}}
		if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
			t.Fatalf("UDP entries no rule caught (-want +got):\n%s", diff)
		}
	}
}
