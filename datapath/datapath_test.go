package datapath

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

var (
	nodeAddr  = netip.MustParseAddr("192.0.2.11")
	clusterIP = netip.MustParseAddr("10.96.0.10")
	lbIP      = netip.MustParseAddr("203.0.113.10")
)

func ep(addr string, local bool) Endpoint {
	return Endpoint{Addr: netip.MustParseAddr(addr), Port: 8080, Local: local, Ready: true, Serving: true}
}

func webService(eps ...Endpoint) *Service {
	return &Service{
		Key:             ServiceKey{"default", "web"},
		ClusterIPs:      []netip.Addr{clusterIP, netip.MustParseAddr("fd00:96::10")},
		LoadBalancerIPs: []netip.Addr{lbIP},
		Ports:           []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: 30080, Endpoints: eps}},
	}
}

func nodeState(svcs ...*Service) NodeState {
	st := NodeState{
		Node:     NodeInfo{Name: "node1", Addresses: []netip.Addr{nodeAddr}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, Registered: true},
		Services: map[ServiceKey]*Service{},
	}
	for _, s := range svcs {
		st.Services[s.Key] = s
	}
	return st
}

func newFakeDatapath(t *testing.T) (*Datapath, *knftables.Fake, *knftables.Fake) {
	t.Helper()
	v4 := knftables.NewFake(knftables.IPv4Family, TableName)
	v6 := knftables.NewFake(knftables.IPv6Family, TableName)
	// As the agent programs it: with the rules of moved connections.
	return New(v4, v6, Config{Flows: &FlowRedirect{Interface: "weir-flows"}}), v4, v6
}

var (
	podSource      = netip.MustParseAddr("10.244.1.50") // a pod on this node
	podSource6     = netip.MustParseAddr("fd00:244:1::50")
	externalSource = netip.MustParseAddr("198.51.100.2")
)

func TestApplyTracesConnectionsToEndpoints(t *testing.T) {
	ctx := context.Background()
	dp, v4, v6 := newFakeDatapath(t)
	svc := webService(ep("10.244.1.11", true), ep("10.244.2.11", false), ep("fd00:244:1::11", true))
	if err := dp.Apply(ctx, nodeState(svc)); err != nil {
		t.Fatal(err)
	}
	both := verdict{Endpoints: []string{"10.244.1.11:8080", "10.244.2.11:8080"}}
	for _, tc := range []struct {
		name string
		fake *knftables.Fake
		dst  string
		want verdict
	}{
		{"cluster IP", v4, "10.96.0.10:80", both},
		{"load-balancer IP", v4, "203.0.113.10:80", both},
		{"node port", v4, "192.0.2.11:30080", both},
		{"wrong port on cluster IP is rejected", v4, "10.96.0.10:81", verdict{Rejected: true}},
		{"unknown address is left alone", v4, "198.51.100.7:80", verdict{}},
		{"IPv6 cluster IP uses IPv6 endpoints only", v6, "[fd00:96::10]:80", verdict{Endpoints: []string{"[fd00:244:1::11]:8080"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := netip.MustParseAddrPort(tc.dst)
			src := podSource
			if dst.Addr().Is6() {
				src = podSource6
			}
			got := trace(t, tc.fake, src, "tcp", dst)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("connection to %s (-want +got):\n%s", tc.dst, diff)
			}
		})
	}
	if v4.Table.Sets[genOf(v4.Table).of(localEndpointsSet)].FindElement("10.244.1.11") == nil {
		t.Error("local endpoint 10.244.1.11 missing from local_endpoints: its replies would be masqueraded")
	}
	if v4.Table.Sets[genOf(v4.Table).of(localEndpointsSet)].FindElement("10.244.2.11") != nil {
		t.Error("remote endpoint listed as local: external clients reaching it would not be masqueraded")
	}
}

func TestApplyRejectsServicesWithoutEndpoints(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	notReady := ep("10.244.1.11", true)
	notReady.Ready, notReady.Serving = false, false
	if err := dp.Apply(ctx, nodeState(webService(notReady))); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"10.96.0.10:80", "203.0.113.10:80", "192.0.2.11:30080"} {
		if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort(dst)); !got.Rejected {
			t.Errorf("connection to %s: got %+v, want rejected", dst, got)
		}
	}
}

func TestApplyFallsBackToTerminatingEndpoints(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	draining := ep("10.244.1.11", true)
	draining.Ready, draining.Terminating = false, true
	gone := ep("10.244.1.12", true)
	gone.Ready, gone.Serving, gone.Terminating = false, false, true
	if err := dp.Apply(ctx, nodeState(webService(draining, gone))); err != nil {
		t.Fatal(err)
	}
	want := verdict{Endpoints: []string{"10.244.1.11:8080"}}
	if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.96.0.10:80")); !cmp.Equal(want, got) {
		t.Errorf("got %+v, want only the serving terminating endpoint %+v", got, want)
	}
}

func TestPartialSyncTouchesOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	other := &Service{Key: ServiceKey{"default", "db"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
		Ports: []ServicePort{{Protocol: TCP, Port: 5432, Endpoints: []Endpoint{ep("10.244.2.20", false)}}}}
	st := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false)), other)
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}

	// One endpoint more for web: a new pick chain, web's frontends repointed,
	// one backend slot added per frontend; db untouched.
	st2 := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false), ep("10.244.2.12", false)), other)
	st2.Services[other.Key] = other
	if err := dp.Apply(ctx, st2); err != nil {
		t.Fatal(err)
	}
	tx := v4.LastTransaction.String()
	if strings.Contains(tx, "10.96.0.20") || strings.Contains(tx, "table") {
		t.Errorf("partial sync rewrote more than the changed service:\n%s", tx)
	}
	want := verdict{Endpoints: []string{"10.244.1.11:8080", "10.244.2.11:8080", "10.244.2.12:8080"}}
	if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.96.0.10:80")); !cmp.Equal(want, got) {
		t.Errorf("after scale-up got %+v, want %+v", got, want)
	}

	// Removing the service removes every trace of it, and only of it.
	delete(st2.Services, ServiceKey{"default", "web"})
	if err := dp.Apply(ctx, st2); err != nil {
		t.Fatal(err)
	}
	if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.96.0.10:80")); !cmp.Equal(verdict{}, got) {
		t.Errorf("removed service still forwards: %+v", got)
	}
	if n := len(v4.Table.Maps[genOf(v4.Table).of(ipKind.backends(TCP))].Elements); n != 1 {
		t.Errorf("backends left: %d, want only db's 1", n)
	}
	if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.96.0.20:5432")); len(got.Endpoints) != 1 {
		t.Errorf("unrelated service lost its endpoint: %+v", got)
	}
}

func TestSharedLocalEndpointIsCountedPerService(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	shared := ep("10.244.1.11", true)
	a := webService(shared)
	b := &Service{Key: ServiceKey{"default", "web-alt"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")},
		Ports: []ServicePort{{Protocol: TCP, Port: 80, Endpoints: []Endpoint{shared}}}}
	st := nodeState(a, b)
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	delete(st.Services, a.Key)
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if v4.Table.Sets[genOf(v4.Table).of(localEndpointsSet)].FindElement("10.244.1.11") == nil {
		t.Error("deleting one service removed a local endpoint another service still uses")
	}
}

func TestEvenSpreadForEveryEndpointCount(t *testing.T) {
	ctx := context.Background()
	for n := 1; n <= 64; n++ {
		dp, v4, _ := newFakeDatapath(t)
		var eps []Endpoint
		for i := range n {
			eps = append(eps, ep(netip.AddrFrom4([4]byte{10, 244, 3, byte(i + 1)}).String(), false))
		}
		if err := dp.Apply(ctx, nodeState(webService(eps...))); err != nil {
			t.Fatal(err)
		}
		got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.96.0.10:80"))
		counts := map[string]int{}
		for _, e := range got.Endpoints {
			counts[e]++
		}
		// numgen random mod n draws each slot with probability 1/n, and
		// every endpoint holds exactly one slot.
		if len(got.Endpoints) != n || len(counts) != n {
			t.Fatalf("n=%d: %d slots over %d endpoints, want one slot each", n, len(got.Endpoints), len(counts))
		}
	}
}

func TestFailedTransactionForcesFullResync(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	if err := dp.Apply(ctx, nodeState(webService(ep("10.244.1.11", true)))); err != nil {
		t.Fatal(err)
	}
	// Someone deletes our table behind our back.
	tx := v4.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := v4.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := dp.Apply(ctx, nodeState(webService(ep("10.244.1.12", true)))); err == nil {
		t.Fatal("partial sync on a deleted table succeeded; want an error")
	}
	if err := dp.Apply(ctx, nodeState(webService(ep("10.244.1.12", true)))); err != nil {
		t.Fatalf("the sync after a failure should rebuild the table: %v", err)
	}
	if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.96.0.10:80")); !cmp.Equal(verdict{Endpoints: []string{"10.244.1.12:8080"}}, got) {
		t.Errorf("after rebuild got %+v", got)
	}
}

// genOf finds the generation a fake table forwards with.
func genOf(tbl *knftables.FakeTable) generation {
	if _, ok := tbl.Maps[genA.of(ipKind.frontends)]; ok {
		return genA
	}
	return genB
}

// TestChangedNamesAreEnough: a datapath told which services changed
// (NodeState.Changed, as the agent's syncer tells it) programs exactly
// what one that compares every service programs, over a random walk of
// changes, removals, additions, node changes, names given twice and names
// of services that did not change.
func TestChangedNamesAreEnough(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	hinted, h4, h6 := newFakeDatapath(t)
	full, f4, f6 := newFakeDatapath(t)
	state := randomState(rng)
	// Its endpoints depend on the node's zone alone: only a node change
	// changes it.
	zoned := &Service{Key: ServiceKey{"default", "zoned"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.1.1")}, PreferClose: true,
		Ports: []ServicePort{{Name: "p", Protocol: TCP, Port: 80, Endpoints: []Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.1"), Port: 80, Zone: "zone-a", Hints: &Hints{Zones: []string{"zone-a"}}, Ready: true, Serving: true},
			{Addr: netip.MustParseAddr("10.244.2.1"), Port: 80, Zone: "zone-b", Hints: &Hints{Zones: []string{"zone-b"}}, Ready: true, Serving: true},
		}}}}
	state.Services[zoned.Key] = zoned
	state.Node.Zone = "zone-a"
	for _, dp := range []*Datapath{hinted, full} {
		if err := dp.Apply(ctx, state); err != nil {
			t.Fatal(err)
		}
	}
	for step := range 300 {
		next := mutate(rng, state)
		if rng.IntN(10) == 0 {
			next.Node.Zone = map[string]string{"zone-a": "zone-b", "zone-b": "zone-a"}[state.Node.Zone]
		}
		var changed []ServiceKey
		for k, s := range next.Services {
			if state.Services[k] != s {
				changed = append(changed, k, k) // twice
			}
		}
		for k := range state.Services {
			if _, ok := next.Services[k]; !ok {
				changed = append(changed, k)
			}
		}
		changed = append(changed, stableService().Key) // unchanged
		hintedState := next
		hintedState.Changed = changed
		if err := hinted.Apply(ctx, hintedState); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if err := full.Apply(ctx, next); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		lines := func(dumps ...string) []string {
			// The fake keeps elements in the order they came.
			out := strings.Split(strings.Join(dumps, ""), "\n")
			slices.Sort(out)
			return out
		}
		if diff := cmp.Diff(lines(f4.Dump(), f6.Dump()), lines(h4.Dump(), h6.Dump())); diff != "" {
			t.Fatalf("step %d: told %v, the tables differ from comparing every service (-all +told):\n%s", step, changed, diff)
		}
		state = next
	}
}

// TestAddingAServiceAddsNoVerdict: a frontend is an element of a plain set
// (its pick's), never a jump or goto in a map, so that adding a service
// never makes the kernel validate the ruleset through every frontend.
// Only a pick that is new (an endpoint count the node had not had) writes
// rules, and those rules jump nowhere. Then a connection to the new
// service reaches its endpoints.
func TestAddingAServiceAddsNoVerdict(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	svc := func(i int, eps ...Endpoint) *Service {
		return &Service{Key: ServiceKey{"default", fmt.Sprintf("svc%d", i)},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 1, byte(i)})},
			Ports:      []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: uint16(30100 + i), Endpoints: eps}}}
	}
	st := nodeState(svc(1, ep("10.244.2.1", false), ep("10.244.2.2", false)), webService(ep("10.244.1.11", true)))
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		svc    *Service
		newSet bool
	}{
		{"a service of a shape the node has", svc(2, ep("10.244.2.3", false), ep("10.244.2.4", false)), false},
		{"a service with an endpoint count the node had not had", svc(3, ep("10.244.2.5", false), ep("10.244.2.6", false), ep("10.244.2.7", false)), true},
		{"a service with no endpoint here", svc(4), false},
	} {
		st.Services[step.svc.Key] = step.svc
		st.Changed = []ServiceKey{step.svc.Key}
		if err := dp.Apply(ctx, st); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		tx := v4.LastTransaction.String()
		for _, word := range []string{"goto", "jump", "verdict"} {
			if strings.Contains(tx, word) {
				t.Errorf("%s: the transaction holds %q:\n%s", step.name, word, tx)
			}
		}
		if got := strings.Contains(tx, "add set"); got != step.newSet {
			t.Errorf("%s: a set added: %v, want %v:\n%s", step.name, got, step.newSet, tx)
		}
		var want verdict
		for _, e := range step.svc.Ports[0].Endpoints {
			want.Endpoints = append(want.Endpoints, netip.AddrPortFrom(e.Addr, e.Port).String())
		}
		if len(want.Endpoints) == 0 {
			want = verdict{Rejected: true}
		}
		if got := trace(t, v4, podSource, "tcp", netip.AddrPortFrom(step.svc.ClusterIPs[0], 80)); !cmp.Equal(want, got) {
			t.Errorf("%s: a pod's connection got %+v, want %+v", step.name, got, want)
		}
		if got := trace(t, v4, externalSource, "tcp", netip.AddrPortFrom(nodeAddr, step.svc.Ports[0].NodePort)); !cmp.Equal(want, got) {
			t.Errorf("%s: an external connection to the node port got %+v, want %+v", step.name, got, want)
		}
	}
}

// TestNewForNodeWithoutNft: with no nft to run, NewForNode fails at once
// and says so.
func TestNewForNodeWithoutNft(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := NewForNode(Config{}); err == nil || !strings.Contains(err.Error(), "nft") {
		t.Fatalf("NewForNode without nft: %v; want an error naming nft", err)
	}
}

// TestAnInterfaceThatFailsToOpenIsTriedAgain: nft opened in the background
// failing (the kernel refusing, a process that could not start) fails the
// calls that need it, each of which tries again, and the first attempt
// that succeeds serves every call after it.
func TestAnInterfaceThatFailsToOpenIsTriedAgain(t *testing.T) {
	ctx := context.Background()
	attempts, fail := 0, true
	o := startOpening(&ipv4, func() (knftables.Interface, error) {
		attempts++
		if fail {
			return nil, errors.New("could not run nftables command")
		}
		return knftables.NewFake(knftables.IPv4Family, TableName), nil
	})
	tx := o.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := o.Run(ctx, tx); err == nil {
		t.Fatal("Run on an interface that does not open: no error")
	}
	if _, err := o.List(ctx, "chain"); err == nil {
		t.Fatal("List on an interface that does not open: no error")
	}
	before := attempts
	fail = false
	tx = o.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := o.Run(ctx, tx); err != nil {
		t.Fatalf("Run once the interface opens: %v", err)
	}
	if _, err := o.List(ctx, "chain"); err != nil {
		t.Fatalf("List once the interface opens: %v", err)
	}
	if attempts != before+1 {
		t.Errorf("%d attempts to open after it first succeeded; want 1", attempts-before)
	}
}

// TestUDPChoosesByTheFlowsHash: a UDP frontend that a router may move
// (a load-balancer IP, a node port) chooses its endpoint by a hash of the
// client's address and port, with a seed every node shares, into a flow
// table built from the endpoints alone, whatever order they came in, so
// that two nodes choose alike for a flow a router moves between them; a
// cluster IP, and TCP, stay random. Every endpoint holds its share of
// the slots. (That the kernel hashes alike on two nodes is
// TestMovedUDPFlowsKeepTheirEndpoint's, with real packets.)
func TestUDPChoosesByTheFlowsHash(t *testing.T) {
	ctx := context.Background()
	a, b, c := ep("10.244.1.53", true), ep("10.244.2.53", false), ep("10.244.3.53", false)
	dumps := map[string]string{}
	for name, order := range map[string][]Endpoint{"in order": {a, b, c}, "shuffled": {c, a, b}} {
		dp, v4, _ := newFakeDatapath(t)
		dns := dnsService(UDP, order...)
		dns.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.53")}
		if err := dp.Apply(ctx, nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false)), dns)); err != nil {
			t.Fatal(err)
		}
		dump := v4.Dump()
		for _, want := range []string{
			"@udp_table_251_a meta mark set meta mark | 0x2000 dnat ip to ip daddr . meta l4proto . th dport . jhash ip saddr . th sport mod 251 seed 0x77656972 map @udp_backends_a",
			"@nodeport_udp_table_251_a meta mark set meta mark | 0x2000 dnat ip to meta l4proto . th dport . jhash ip saddr . th sport mod 251 seed 0x77656972 map @nodeport_udp_backends_a",
			"@udp_endpoints_3_a meta mark set meta mark | 0x2000 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @udp_backends_a",
			"@tcp_endpoints_2_a meta mark set meta mark | 0x2000 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @tcp_backends_a",
		} {
			if !strings.Contains(dump, want) {
				t.Errorf("%s: no rule %q:\n%s", name, want, dump)
			}
		}
		if !strings.Contains(dump, "udp_table_251_a { 203.0.113.53 . udp . 53 }") || !strings.Contains(dump, "udp_endpoints_3_a { 10.96.0.53 . udp . 53 }") {
			t.Errorf("%s: the load-balancer IP is not hashed, or the cluster IP not random:\n%s", name, dump)
		}
		for _, dst := range []string{"203.0.113.53:53", "192.0.2.11:30053"} {
			got := trace(t, v4, netip.MustParseAddr("198.51.100.7"), "udp", netip.MustParseAddrPort(dst))
			if want := []string{"10.244.1.53:8080", "10.244.2.53:8080", "10.244.3.53:8080"}; !slices.Equal(got.Endpoints, want) {
				t.Errorf("%s, %s: the table leads to %v; want %v", name, dst, got.Endpoints, want)
			}
			for e, n := range got.Slots {
				if n != 83 && n != 84 {
					t.Errorf("%s, %s: %s holds %d of 251 slots; want 83 or 84", name, dst, e, n)
				}
			}
		}
		var tables []string
		for _, l := range strings.Split(dump, "\n") {
			if strings.Contains(l, "add element ip weir nodeport_udp_backends_a {") || strings.Contains(l, "udp_backends_a { 203.0.113.53") {
				tables = append(tables, l)
			}
		}
		dumps[name] = strings.Join(tables, "\n")
	}
	if dumps["in order"] != dumps["shuffled"] || strings.Count(dumps["in order"], "\n") != 2*251-1 {
		t.Errorf("the endpoints' order changed the flow tables:\n%s\nagainst\n%s", dumps["in order"], dumps["shuffled"])
	}
}
