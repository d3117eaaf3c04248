package l2owner

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
	"github.com/weirlb/weir/test/wait"
)

// fakeStatus is the hub's status of the nodes, set by the test; it counts
// the leader's looks at it (one per computation of the candidates).
type fakeStatus struct {
	mu      sync.Mutex
	nodes   []observed.Node
	looks   int
	changed notify.Signal
}

func (f *fakeStatus) Status() []observed.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.looks++
	return slices.Clone(f.nodes)
}

func (f *fakeStatus) StatusChanged() <-chan struct{} { return f.changed.Changed() }

// set makes nodes the status, each connected and programmed through
// revision 1, healthy.
func (f *fakeStatus) set(nodes ...string) {
	f.mu.Lock()
	f.nodes = nil
	for _, n := range nodes {
		f.nodes = append(f.nodes, observed.Node{Node: n, Connected: true, SentVersion: 1, AppliedVersion: 1,
			Health: observed.Health{LivezCode: 200, NodeEligible: true}})
	}
	f.mu.Unlock()
	f.changed.Broadcast()
}

func (f *fakeStatus) looked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.looks
}

func l2Pool() *model.AddressPool {
	return &model.AddressPool{Meta: model.Meta{Name: "l2"}, L2: &model.L2Advertisement{},
		Ranges: []model.AddressRange{{First: netip.MustParseAddr("192.0.2.100"), Last: netip.MustParseAddr("192.0.2.110")}}}
}

func testNode(name, addr string) *model.Node {
	return &model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.MustParseAddr(addr)}}
}

func loadBalancer(name, vip string) *model.Service {
	s := &model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.LoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	if vip != "" {
		s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(vip)}
	}
	return s
}

// running is a leader over reg and st on a fake clock, run until the
// test ends.
func running(t *testing.T, reg *registry.Registry, st *fakeStatus, warmUp time.Duration) (*Leader, *Owners, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	o := NewOwners(clk, testTTL, testMargin, slog.New(slog.DiscardHandler), nil)
	l := NewLeader(LeaderConfig{Owners: o, Registry: reg, Status: st, Clock: clk, WarmUp: warmUp})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wait.Until(t, 5*time.Second, "leading", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.table != nil
	})
	return l, o, clk
}

func warm(o *Owners) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.warm
}

// A new leader decides the owners as soon as every registered node has
// asked for its leases, on no timer: with a clock that never moves, the
// asks alone end the warm-up.
func TestLeaderWarmUpEndsWhenEveryNodeHasAsked(t *testing.T) {
	reg := registrytest.Open(t)
	st := &fakeStatus{}
	st.set("n1", "n2")
	for _, obj := range []model.Object{l2Pool(), testNode("n1", "198.51.100.1"), testNode("n2", "198.51.100.2"), loadBalancer("web", "192.0.2.100")} {
		if _, _, err := reg.Apply([]model.Object{obj}, false); err != nil {
			t.Fatal(err)
		}
	}
	_, o, _ := running(t, reg, st, time.Hour)
	open(t, o, "n1").Ask(Asked{})
	// A change after n1's ask has the leader look again.
	looks := st.looked()
	st.set("n1", "n2")
	wait.Until(t, 5*time.Second, "the leader looking again after n1's ask", func() bool { return st.looked() > looks })
	time.Sleep(50 * time.Millisecond)
	if warm(o) {
		t.Fatal("the owners decided before n2 asked")
	}
	open(t, o, "n2").Ask(Asked{})
	wait.Until(t, 5*time.Second, "the owners deciding once every node asked", func() bool { return warm(o) })
}

// A node that never asks holds the owners back for WarmUp at most, by
// the leader's clock.
func TestLeaderWarmUpEndsAfterWarmUp(t *testing.T) {
	reg := registrytest.Open(t)
	st := &fakeStatus{}
	st.set("n1")
	for _, obj := range []model.Object{l2Pool(), testNode("n1", "198.51.100.1"), testNode("n2", "198.51.100.2"), loadBalancer("web", "192.0.2.100")} {
		if _, _, err := reg.Apply([]model.Object{obj}, false); err != nil {
			t.Fatal(err)
		}
	}
	_, o, clk := running(t, reg, st, 2*time.Second)
	open(t, o, "n1").Ask(Asked{})
	// The owners' timer and the warm-up's.
	wait.Until(t, 5*time.Second, "the warm-up waiting", func() bool { return clk.Waiters() == 2 })
	clk.Step(2*time.Second - time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	if warm(o) {
		t.Fatal("the owners decided before WarmUp passed")
	}
	clk.Step(time.Millisecond)
	wait.Until(t, 5*time.Second, "the owners deciding after WarmUp", func() bool { return warm(o) })
}

// Computations of the candidates are Period apart at least: a burst of
// status changes while the leader waits costs one more computation, and
// a lone change after a quiet spell is taken at once.
func TestLeaderBurstCostsOneMoreComputation(t *testing.T) {
	st := &fakeStatus{}
	reg := registrytest.Open(t)
	// An L2 pool, so that every computation reads the status.
	if _, _, err := reg.Apply([]model.Object{l2Pool()}, false); err != nil {
		t.Fatal(err)
	}
	_, _, clk := running(t, reg, st, 0)
	// sleeping: the leader computed looks times and waits out Period
	// (the owners' timer and its own).
	sleeping := func(looks int) {
		t.Helper()
		wait.Until(t, 5*time.Second, "the leader waiting out Period", func() bool { return st.looked() == looks && clk.Waiters() == 2 })
	}
	sleeping(2) // the warm-up's look (no node to wait for) and the first round's
	for range 5 {
		st.set("n1")
	}
	if got := st.looked(); got != 2 {
		t.Fatalf("%d computations during Period; want none", got-2)
	}
	clk.Step(DefaultPeriod)
	sleeping(3)
	clk.Step(DefaultPeriod)
	wait.Until(t, 5*time.Second, "the leader waiting for a change", func() bool { return clk.Waiters() == 1 })
	if got := st.looked(); got != 3 {
		t.Fatalf("a burst of 5 changes cost %d computations; want 1", got-2)
	}
	st.set("n1", "n2")
	sleeping(4)
}

// The L2 candidates are worked out again after a write of what they
// follow (a service's object, a node, its drain, a pool), never after an
// endpoint slice's, which reaches them through the agents' reports; and
// the candidates, from the load balancers alone, are those every service
// gives, at every step.
func TestLeaderCandidatesFollowTheirInputsOnly(t *testing.T) {
	reg := registrytest.Open(t)
	st := &fakeStatus{}
	st.set("n1", "n2")
	l := NewLeader(LeaderConfig{Owners: NewOwners(clocktesting.NewFakeClock(time.Unix(0, 0)), testTTL, testMargin, slog.New(slog.DiscardHandler), nil), Registry: reg, Status: st})
	web := loadBalancer("web", "192.0.2.100")
	other := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "db"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 5432}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	slice := func(addr string) *model.EndpointSlice {
		return &model.EndpointSlice{Meta: model.Meta{Namespace: "shop", Name: "web-1"}, ServiceName: "web",
			Endpoints: []model.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, NodeName: "n1"}}}
	}
	noIPs := *web
	noIPs.LoadBalancerIPs = nil
	for _, step := range []struct {
		what  string
		write func() error
		wake  bool
		want  map[netip.Addr][]string
	}{
		{"an L2 pool", func() error { _, err := reg.Pools.Create(l2Pool()); return err }, true, map[netip.Addr][]string{}},
		{"a node", func() error { _, err := reg.Nodes.Create(testNode("n1", "198.51.100.1")); return err }, true, map[netip.Addr][]string{}},
		{"another node", func() error { _, err := reg.Nodes.Create(testNode("n2", "198.51.100.2")); return err }, true, map[netip.Addr][]string{}},
		{"a load balancer", func() error { _, err := reg.Services.Create(web); return err }, true,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"a service of no L2 address", func() error { _, err := reg.Services.Create(other); return err }, true,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"its endpoints", func() error { _, err := reg.EndpointSlices.Create(slice("10.0.0.1")); return err }, false,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"one endpoint changed", func() error { _, err := reg.EndpointSlices.Update(slice("10.0.0.2")); return err }, false,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"a drain", func() error { _, _, err := reg.Drain("n1", time.Time{}); return err }, true,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n2"}}},
		{"the load balancer's address taken away", func() error { _, err := reg.Services.Update(&noIPs); return err }, true,
			map[netip.Addr][]string{}},
	} {
		if err := step.write(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		woke := false
		select {
		case <-l.inputChanged.C():
			woke = true
		default:
		}
		if woke != step.wake {
			t.Errorf("%s: the L2 job woken %v; want %v", step.what, woke, step.wake)
		}
		got := l.look(false).candidates
		pools, _ := reg.Pools.List("", nil)
		nodes, _ := reg.Nodes.List("", nil)
		services, _ := reg.Services.List("", nil)
		every := receive.L2Addresses(receive.Cluster{Nodes: nodes, Pools: pools, Services: services, Observed: st.Status(), Aside: reg.Aside})
		if diff := cmp.Diff(every, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: candidates from the load balancers (+) and from every service (-):\n%s", step.what, diff)
		}
		if diff := cmp.Diff(step.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: candidates (-want +got):\n%s", step.what, diff)
		}
	}
}

// Without an L2 pool there are no candidates to work out, and the leader,
// woken by every round of the agents' acknowledgements, leaves the hub's
// status alone: reading it takes the lock every state sent to an agent
// takes too. Once an L2 pool exists, it reads it again.
func TestLeaderWithoutAnL2PoolReadsNoStatus(t *testing.T) {
	st := &fakeStatus{}
	reg := registrytest.Open(t)
	if _, _, err := reg.Apply([]model.Object{testNode("n1", "198.51.100.1")}, false); err != nil {
		t.Fatal(err)
	}
	st.set("n1")
	_, o, clk := running(t, reg, st, time.Hour)
	wait.Until(t, 5*time.Second, "the warm-up ending once n1 applied a state", func() bool { return warm(o) })
	looks := st.looked()
	for range 5 {
		st.set("n1")
		wait.Until(t, 5*time.Second, "the leader waiting out Period", func() bool { return clk.Waiters() >= 2 })
		clk.Step(DefaultPeriod)
	}
	time.Sleep(50 * time.Millisecond)
	if got := st.looked() - looks; got != 0 {
		t.Fatalf("the leader read the hub's status %d times after the warm-up with no L2 pool; want none", got)
	}
	if _, _, err := reg.Apply([]model.Object{l2Pool()}, false); err != nil {
		t.Fatal(err)
	}
	clk.Step(DefaultPeriod)
	wait.Until(t, 5*time.Second, "the leader reading the status once an L2 pool exists", func() bool { return st.looked() > looks })
}
