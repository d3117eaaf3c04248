package datapath

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// localService is web with externalTrafficPolicy Local.
func localService(eps ...Endpoint) *Service {
	s := webService(eps...)
	s.ExternalTrafficPolicy = Local
	s.HealthCheckNodePort = 31000
	return s
}

func TestExternalTrafficPolicyLocal(t *testing.T) {
	ctx := context.Background()
	lb := netip.MustParseAddrPort("203.0.113.10:80")
	np := netip.MustParseAddrPort("192.0.2.11:30080")
	both := []string{"10.244.1.11:8080", "10.244.2.11:8080"}
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		src  netip.Addr
		dst  netip.AddrPort
		want verdict
	}{
		{"external client to LB IP: local endpoints only", []Endpoint{ep("10.244.1.11", true), ep("10.244.2.11", false)}, externalSource, lb, verdict{Endpoints: []string{"10.244.1.11:8080"}}},
		{"external client to node port: local endpoints only", []Endpoint{ep("10.244.1.11", true), ep("10.244.2.11", false)}, externalSource, np, verdict{Endpoints: []string{"10.244.1.11:8080"}}},
		{"external client, no local endpoint: dropped", []Endpoint{ep("10.244.2.11", false)}, externalSource, lb, verdict{Dropped: true}},
		{"external client, no local endpoint, node port: dropped", []Endpoint{ep("10.244.2.11", false)}, externalSource, np, verdict{Dropped: true}},
		{"pod to LB IP is short-circuited to every endpoint", []Endpoint{ep("10.244.1.11", true), ep("10.244.2.11", false)}, podSource, lb, verdict{Endpoints: both}},
		{"pod to LB IP works on a node without local endpoints", []Endpoint{ep("10.244.2.11", false)}, podSource, lb, verdict{Endpoints: []string{"10.244.2.11:8080"}}},
		{"host to LB IP is short-circuited too", []Endpoint{ep("10.244.2.11", false)}, nodeAddr, lb, verdict{Endpoints: []string{"10.244.2.11:8080"}}},
		{"cluster IP ignores the external policy", []Endpoint{ep("10.244.1.11", true), ep("10.244.2.11", false)}, externalSource, netip.AddrPortFrom(clusterIP, 80), verdict{Endpoints: both}},
		{"no endpoints anywhere: rejected", nil, externalSource, lb, verdict{Rejected: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newFakeDatapath(t)
			if err := dp.Apply(ctx, nodeState(localService(tc.eps...))); err != nil {
				t.Fatal(err)
			}
			if got := trace(t, v4, tc.src, "tcp", tc.dst); !cmp.Equal(tc.want, got) {
				t.Errorf("%s -> %s: got %+v, want %+v", tc.src, tc.dst, got, tc.want)
			}
		})
	}
}

func TestLocalTerminatingFallbackIsPerSet(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	draining := ep("10.244.1.11", true)
	draining.Ready, draining.Terminating = false, true
	// Cluster-wide a ready endpoint exists (on node2); locally only a
	// terminating one: external traffic here still drains to it.
	if err := dp.Apply(ctx, nodeState(localService(draining, ep("10.244.2.11", false)))); err != nil {
		t.Fatal(err)
	}
	if got := trace(t, v4, externalSource, "tcp", netip.MustParseAddrPort("203.0.113.10:80")); !cmp.Equal(verdict{Endpoints: []string{"10.244.1.11:8080"}}, got) {
		t.Errorf("external, only a terminating local endpoint: got %+v", got)
	}
	if got := trace(t, v4, podSource, "tcp", netip.AddrPortFrom(clusterIP, 80)); !cmp.Equal(verdict{Endpoints: []string{"10.244.2.11:8080"}}, got) {
		t.Errorf("cluster-wide set must use the ready endpoint only: got %+v", got)
	}
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		want verdict
	}{
		{"local endpoints only", []Endpoint{ep("10.244.1.11", true), ep("10.244.2.11", false)}, verdict{Endpoints: []string{"10.244.1.11:8080"}}},
		{"none here: dropped", []Endpoint{ep("10.244.2.11", false)}, verdict{Dropped: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newFakeDatapath(t)
			s := webService(tc.eps...)
			s.InternalTrafficPolicy = Local
			if err := dp.Apply(ctx, nodeState(s)); err != nil {
				t.Fatal(err)
			}
			if got := trace(t, v4, podSource, "tcp", netip.AddrPortFrom(clusterIP, 80)); !cmp.Equal(tc.want, got) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLoadBalancerSourceRanges(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	s := webService(ep("10.244.1.11", true))
	s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/28")}
	if err := dp.Apply(ctx, nodeState(s)); err != nil {
		t.Fatal(err)
	}
	allowed := verdict{Endpoints: []string{"10.244.1.11:8080"}}
	for _, tc := range []struct {
		src, dst string
		want     verdict
	}{
		{"198.51.100.2", "203.0.113.10:80", allowed},
		{"198.51.100.77", "203.0.113.10:80", verdict{Dropped: true}},
		{"198.51.100.77", "192.0.2.11:30080", allowed}, // ranges apply to load-balancer IPs only
		{"198.51.100.77", "10.96.0.10:80", allowed},
	} {
		if got := trace(t, v4, netip.MustParseAddr(tc.src), "tcp", netip.MustParseAddrPort(tc.dst)); !cmp.Equal(tc.want, got) {
			t.Errorf("%s -> %s: got %+v, want %+v", tc.src, tc.dst, got, tc.want)
		}
	}
}

// TestTopologyFollowsTheHintsAsKubeProxy: the EndpointSlice controller's
// hints carry the service's trafficDistribution; kube-proxy follows node
// hints, then zone hints, each only when every ready endpoint has them and
// one names this node (node1, zone a), and never the zone field itself.
func TestTopologyFollowsTheHintsAsKubeProxy(t *testing.T) {
	ctx := context.Background()
	hinted := func(addr, zone string, zones, nodes []string) Endpoint {
		e := ep(addr, false)
		e.Zone, e.Hints = zone, NewHints(zones, nodes)
		return e
	}
	zoned := func(addr, zone string, hints ...string) Endpoint { return hinted(addr, zone, hints, nil) }
	z := func(zs ...string) []string { return zs }
	for _, tc := range []struct {
		name        string
		preferClose bool
		eps         []Endpoint
		want        []string
	}{
		{"PreferClose without hints: every endpoint", true, []Endpoint{zoned("10.244.1.11", "a"), zoned("10.244.2.11", "b")}, []string{"10.244.1.11:8080", "10.244.2.11:8080"}},
		{"hints on every endpoint are followed", false, []Endpoint{zoned("10.244.1.11", "b", "a"), zoned("10.244.2.11", "b", "b")}, []string{"10.244.1.11:8080"}},
		{"hints on only some endpoints are ignored", true, []Endpoint{zoned("10.244.1.11", "b", "a"), zoned("10.244.2.11", "b")}, []string{"10.244.1.11:8080", "10.244.2.11:8080"}},
		{"no endpoint hinted for this zone: all", false, []Endpoint{zoned("10.244.2.11", "b", "b"), zoned("10.244.3.11", "c", "c")}, []string{"10.244.2.11:8080", "10.244.3.11:8080"}},
		{"a not-ready endpoint without hints does not count", false, []Endpoint{zoned("10.244.1.11", "a", "a"), zoned("10.244.2.11", "b", "b"), func() Endpoint {
			e := zoned("10.244.3.11", "c")
			e.Ready = false
			return e
		}()}, []string{"10.244.1.11:8080"}},
		{"node hints (PreferSameNode) first", false, []Endpoint{hinted("10.244.1.11", "a", z("a"), z("node1")), hinted("10.244.1.12", "a", z("a"), z("node3")), hinted("10.244.2.11", "b", z("b"), z("node2"))}, []string{"10.244.1.11:8080"}},
		{"no endpoint hinted for this node: zone hints", false, []Endpoint{hinted("10.244.1.11", "a", z("a"), z("node3")), hinted("10.244.1.12", "a", z("a"), z("node3")), hinted("10.244.2.11", "b", z("b"), z("node2"))}, []string{"10.244.1.11:8080", "10.244.1.12:8080"}},
		{"node hints on only some endpoints: zone hints", false, []Endpoint{hinted("10.244.1.11", "a", z("a"), z("node1")), hinted("10.244.1.12", "a", z("a"), nil), hinted("10.244.2.11", "b", z("b"), z("node2"))}, []string{"10.244.1.11:8080", "10.244.1.12:8080"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newFakeDatapath(t)
			s := webService(tc.eps...)
			s.PreferClose = tc.preferClose
			st := nodeState(s)
			st.Node.Zone = "a"
			if err := dp.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			if got := trace(t, v4, podSource, "tcp", netip.AddrPortFrom(clusterIP, 80)); !cmp.Equal(verdict{Endpoints: tc.want}, got) {
				t.Errorf("got %+v, want %v", got, tc.want)
			}
		})
	}
}

func TestSessionAffinityKeepsClientsOnTheirEndpoint(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	a, b := ep("10.244.1.11", true), ep("10.244.2.11", false)
	s := localService(a, b)
	s.SessionAffinityTimeout = 3 * time.Hour
	if err := dp.Apply(ctx, nodeState(s)); err != nil {
		t.Fatal(err)
	}
	tbl := v4.Table
	// Every frontend of the port goes through the same per-endpoint client
	// sets: the cluster set for the cluster IP, node port and cluster
	// sources, the local set for external sources to the Local frontends.
	clusterChain := tbl.Maps[genOf(tbl).of(ipKind.frontends)].FindElement("10.96.0.10 . tcp . 80").Value[0]
	for _, fe := range []struct{ m, k string }{
		{ipKind.frontends, "203.0.113.10 . tcp . 80"},
		{nodePortKind.frontends, "tcp . 30080"},
	} {
		if got := tbl.Maps[genOf(tbl).of(fe.m)].FindElement(fe.k).Value[0]; got != clusterChain {
			t.Errorf("%s in %s goes to %q, want the same chain as the cluster IP (%q)", fe.k, fe.m, got, clusterChain)
		}
	}
	localChain := tbl.Maps[genOf(tbl).of(externalIPKind.frontends)].FindElement("203.0.113.10 . tcp . 80").Value[0]
	if localChain == clusterChain || !strings.HasSuffix(localChain, "_local") {
		t.Errorf("external sources to the LB IP go to %q; want the local-endpoints chain", localChain)
	}
	chain := tbl.Chains[strings.TrimPrefix(clusterChain, "goto ")]
	if chain == nil || len(chain.Rules) != 3 {
		t.Fatalf("affinity chain %q: %+v; want one rule per endpoint and a random pick", clusterChain, chain)
	}
	sets := 0
	for name, set := range tbl.Sets {
		if strings.HasPrefix(name, "affinity_") {
			sets++
			if set.Timeout == nil || *set.Timeout != 3*time.Hour {
				t.Errorf("set %s timeout %v, want 3h", name, set.Timeout)
			}
		}
	}
	if sets != 2 {
		t.Errorf("%d client sets, want one per endpoint (2)", sets)
	}

	// b goes away: its set and chain go with it, and clients it had pick anew.
	if err := dp.Apply(ctx, nodeState(func() *Service { s := localService(a); s.SessionAffinityTimeout = 3 * time.Hour; return s }())); err != nil {
		t.Fatal(err)
	}
	tbl = v4.Table // the fake replaces its table on every transaction
	sets = 0
	for name := range tbl.Sets {
		if strings.HasPrefix(name, "affinity_") {
			sets++
		}
	}
	if sets != 1 {
		t.Errorf("after removing an endpoint: %d client sets, want 1", sets)
	}
	// The service goes: nothing of it remains.
	if err := dp.Apply(ctx, nodeState()); err != nil {
		t.Fatal(err)
	}
	tbl = v4.Table
	for name := range tbl.Chains {
		if strings.HasPrefix(name, "affinity_") {
			t.Errorf("chain %s left after the service was deleted", name)
		}
	}
	for name := range tbl.Sets {
		if strings.HasPrefix(name, "affinity_") {
			t.Errorf("set %s left after the service was deleted", name)
		}
	}
}

func TestNodePortAddresses(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  Config
		node []netip.Addr
		want []string // elements of nodeport_addresses (IPv4)
	}{
		{"default: the node's own addresses, never loopback", Config{},
			[]netip.Addr{nodeAddr, netip.MustParseAddr("127.0.0.1")}, []string{"192.0.2.11"}},
		{"--nodeport-addresses CIDRs", Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
			[]netip.Addr{nodeAddr}, []string{"198.51.100.0/24"}},
		// An interval set refuses overlapping elements: the whole sync
		// would fail on a careless flag.
		{"overlapping CIDRs: the outermost", Config{NodePortAddresses: []netip.Prefix{
			netip.MustParsePrefix("198.51.100.7/32"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("198.51.100.0/25")}},
			[]netip.Addr{nodeAddr}, []string{"198.51.100.0/24"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v4 := knftables.NewFake(knftables.IPv4Family, TableName)
			dp := New(v4, nil, tc.cfg)
			st := nodeState(webService(ep("10.244.1.11", true)))
			st.Node.Addresses = tc.node
			if err := dp.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range v4.Table.Sets[genOf(v4.Table).of(nodePortAddressesSet)].Elements {
				got = append(got, e.Key[0])
			}
			if !cmp.Equal(tc.want, got) {
				t.Errorf("node-port addresses %v, want %v", got, tc.want)
			}
		})
	}
}

// The tracer follows "update": a client's second connection goes where its
// first went, on every frontend and for every first choice, as the kernel
// keeps it; another client is free to go anywhere.
func TestSessionAffinityIsTraced(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newFakeDatapath(t)
	a, b := ep("10.244.1.11", true), ep("10.244.1.12", true)
	s := localService(a, b)
	s.SessionAffinityTimeout = 3 * time.Hour
	if err := dp.Apply(ctx, nodeState(s)); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("198.51.100.7")
	for _, dst := range []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("203.0.113.10:80")} {
		got := traceAffinity(t, v4, client, "tcp", dst)
		if len(got) != 2 {
			t.Fatalf("%s: a first connection reaches %v; want either endpoint", dst, got)
		}
		for first, again := range got {
			if !slices.Equal(again, []string{first}) {
				t.Errorf("%s: after a first connection to %s, the client's next reaches %v; want %s alone", dst, first, again, first)
			}
		}
		if other := trace(t, v4, netip.MustParseAddr("198.51.100.8"), "tcp", dst); len(other.Endpoints) != 2 {
			t.Errorf("%s: another client reaches %v; want either endpoint", dst, other.Endpoints)
		}
	}
}
