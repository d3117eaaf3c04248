package drain

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
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/report"
	"github.com/weirlb/weir/test/wait"
)

// Run's goroutine ends with its context: none outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// state is a node with a load-balancer service (IPv4 and IPv6, an
// external IP, a node port), a UDP load-balancer service and a service
// with a cluster IP only.
func state(drained bool, deadline time.Time) datapath.NodeState {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	return datapath.NodeState{
		Node: datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11", "2001:db8::11"), Drained: drained, DrainDeadline: deadline},
		Services: map[datapath.ServiceKey]*datapath.Service{
			{Namespace: "shop", Name: "web"}: {ClusterIPs: addrs("10.96.0.10"), LoadBalancerIPs: addrs("203.0.113.7", "2001:db8:113::7"),
				ExternalIPs: addrs("198.51.100.7"), Ports: []datapath.ServicePort{{Protocol: datapath.TCP, Port: 80, NodePort: 30080}}},
			{Namespace: "shop", Name: "dns"}: {LoadBalancerIPs: addrs("203.0.113.8"),
				Ports: []datapath.ServicePort{{Protocol: datapath.UDP, Port: 53, NodePort: 30053}}},
			{Namespace: "shop", Name: "internal"}: {ClusterIPs: addrs("10.96.0.11"), Ports: []datapath.ServicePort{{Protocol: datapath.TCP, Port: 80}}},
		},
	}
}

// served are the external connections node1 serves in table.
var served = []Entry{
	{Src: ap("198.18.0.1:40001"), Dst: ap("203.0.113.7:80"), ReplySrc: ap("10.244.1.5:8080"), State: StateEstablished},
	{Src: ap("[2001:db8:18::1]:40002"), Dst: ap("[2001:db8:113::7]:80"), ReplySrc: ap("[fd00:244:1::5]:8080"), State: StateEstablished},
	{Src: ap("198.18.0.1:40003"), Dst: ap("198.51.100.7:80"), ReplySrc: ap("10.244.2.5:8080"), State: StateEstablished},
	{Src: ap("198.18.0.1:40004"), Dst: ap("192.0.2.11:30080"), ReplySrc: ap("10.244.1.5:8080"), State: StateEstablished},
	{Src: ap("198.18.0.1:40005"), Dst: ap("203.0.113.7:80"), ReplySrc: ap("10.244.2.5:8080"), State: StateFinWait},
}

// notServed are entries the drain must neither count nor end.
var notServed = []Entry{
	// Passed on unchanged to the node that holds it (a moved connection).
	{Src: ap("198.18.0.1:40010"), Dst: ap("203.0.113.7:80"), ReplySrc: ap("203.0.113.7:80"), State: StateEstablished},
	// Over: only waiting to expire.
	{Src: ap("198.18.0.1:40011"), Dst: ap("203.0.113.7:80"), ReplySrc: ap("10.244.1.5:8080"), State: StateTimeWait},
	{Src: ap("198.18.0.1:40012"), Dst: ap("203.0.113.7:80"), ReplySrc: ap("10.244.1.5:8080"), State: StateClose},
	// A cluster IP: not external.
	{Src: ap("10.244.1.9:40013"), Dst: ap("10.96.0.10:80"), ReplySrc: ap("10.244.2.5:8080"), State: StateEstablished},
	// Not a port of the service.
	{Src: ap("198.18.0.1:40014"), Dst: ap("203.0.113.7:443"), ReplySrc: ap("10.244.1.5:8443"), State: StateEstablished},
	// The node port on another node's address.
	{Src: ap("198.18.0.1:40015"), Dst: ap("192.0.2.12:30080"), ReplySrc: ap("10.244.1.5:8080"), State: StateEstablished},
	// A TCP connection to a UDP service's address and ports.
	{Src: ap("198.18.0.1:40016"), Dst: ap("203.0.113.8:53"), ReplySrc: ap("10.244.1.7:53"), State: StateEstablished},
	{Src: ap("198.18.0.1:40017"), Dst: ap("192.0.2.11:30053"), ReplySrc: ap("10.244.1.7:53"), State: StateEstablished},
	// The node's own ssh.
	{Src: ap("198.18.0.1:40018"), Dst: ap("192.0.2.11:22"), ReplySrc: ap("192.0.2.11:22"), State: StateEstablished},
}

func table() []Entry { return append(append([]Entry(nil), served...), notServed...) }

func newDrain(t *testing.T, ct Conntrack) (*Drain, *clocktesting.FakeClock, *prometheus.Registry) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	reg := prometheus.NewRegistry()
	return New(ct, clk, slog.New(slog.DiscardHandler), reg), clk, reg
}

// runDrain is newDrain with Run going until the test ends.
func runDrain(t *testing.T, ct Conntrack) (*Drain, *clocktesting.FakeClock) {
	t.Helper()
	d, clk, _ := newDrain(t, ct)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return d, clk
}

// drainOf is the drain part of a report, nil when it has none.
func drainOf(r *report.Report) *report.DrainReport {
	if r == nil {
		return nil
	}
	return r.Drain
}

func TestCountsOnlyExternalConnectionsDNATedHere(t *testing.T) {
	ct := NewFake(table()...)
	d, _, _ := newDrain(t, ct)
	d.Received(state(true, time.Time{}))
	d.Check()
	want := &report.DrainReport{Connections: len(served), CountedAt: t0}
	if diff := cmp.Diff(want, drainOf(d.Report(true))); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(d.connections); got != float64(len(served)) {
		t.Errorf("weir_drain_connections = %v, want %d", got, len(served))
	}
	if del := ct.Deleted(); len(del) != 0 {
		t.Errorf("a drain without a deadline deleted %v", del)
	}
}

func TestNothingWhileNotDrained(t *testing.T) {
	ct := NewFake(table()...)
	d, clk, _ := newDrain(t, ct)
	// Not drained, though a deadline (of an earlier drain) is known.
	d.Received(state(false, t0.Add(time.Second)))
	clk.Step(time.Minute)
	d.Check()
	if n := ct.Calls(); n != 0 {
		t.Errorf("the conntrack table was read or changed %d times while the node was not drained", n)
	}
	for _, full := range []bool{true, false} {
		if r := d.Report(full); r != nil {
			t.Errorf("Report(%v) = %+v while not drained, want nil", full, r)
		}
	}
	if got := testutil.ToFloat64(d.connections); got != 0 {
		t.Errorf("weir_drain_connections = %v, want 0", got)
	}
}

// At the deadline the drain deletes exactly the entries of the external
// connections the node serves, not before, once per deadline; a new
// deadline ends what came since, and the count goes on after.
func TestEndsExactlyThoseAtTheDeadline(t *testing.T) {
	ct := NewFake(table()...)
	d, clk, _ := newDrain(t, ct)
	deadline := t0.Add(8 * time.Second)
	d.Received(state(true, deadline))
	d.Check()
	clk.Step(8*time.Second - time.Millisecond)
	d.Check()
	if del := ct.Deleted(); len(del) != 0 {
		t.Fatalf("deleted before the deadline: %v", del)
	}
	if got := drainOf(d.Report(false)); got == nil || got.Connections != len(served) || got.Ended != 0 {
		t.Errorf("before the deadline: %+v, want %d connections, none ended", got, len(served))
	}

	clk.Step(time.Millisecond)
	d.Check()
	if diff := cmp.Diff(served, ct.Deleted(), cmpopts.EquateComparable(Entry{})); diff != "" {
		t.Errorf("deleted at the deadline (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(notServed, ct.Entries(), cmpopts.EquateComparable(Entry{})); diff != "" {
		t.Errorf("left in the table (-want +got):\n%s", diff)
	}
	want := &report.DrainReport{Connections: 0, CountedAt: deadline, Deadline: deadline, Ended: len(served)}
	if diff := cmp.Diff(want, drainOf(d.Report(false))); diff != "" {
		t.Errorf("after the deadline (-want +got):\n%s", diff)
	}

	// A connection that comes after is counted, not ended: the deadline
	// ended what the node served then.
	late := Entry{Src: ap("198.18.0.2:41000"), Dst: ap("192.0.2.11:30080"), ReplySrc: ap("10.244.1.5:8080"), State: StateEstablished}
	ct.Set(append(ct.Entries(), late)...)
	clk.Step(CountPeriod)
	d.Check()
	if got := drainOf(d.Report(false)); got == nil || got.Connections != 1 || len(ct.Deleted()) != len(served) {
		t.Errorf("a connection after the deadline: report %+v, %d deleted; want it counted, not ended", got, len(ct.Deleted()))
	}

	// Drained again with a new deadline: it ends that one when due.
	later := clk.Now().Add(10 * time.Second)
	d.Received(state(true, later))
	d.Check()
	if got := drainOf(d.Report(false)); got == nil || got.Ended != 0 || !got.Deadline.Equal(later) || got.Connections != 1 {
		t.Errorf("drained again: %+v, want the new deadline, none ended yet, 1 connection", got)
	}
	clk.SetTime(later)
	d.Check()
	if del := ct.Deleted(); len(del) != len(served)+1 || del[len(del)-1] != late {
		t.Errorf("at the new deadline: deleted %v, want %v last", del, late)
	}
}

// A table that cannot be read or changed is no count and nothing ended;
// the deadline is kept once it answers again.
func TestATableThatFailsIsTriedAgain(t *testing.T) {
	ct := NewFake(table()...)
	d, clk, _ := newDrain(t, ct)
	d.Received(state(true, t0))
	ct.Fail(errors.New("operation not permitted"))
	d.Check()
	if got := drainOf(d.Report(true)); got == nil || !got.CountedAt.IsZero() || got.Ended != 0 {
		t.Errorf("with the table failing: %+v, want no count and nothing ended", got)
	}
	ct.Fail(nil)
	clk.Step(CountPeriod)
	d.Check()
	if got := drainOf(d.Report(false)); got == nil || got.Ended != len(served) || got.Connections != 0 {
		t.Errorf("the table answering again: %+v, want %d ended", got, len(served))
	}
}

// A report carries the drain when it changed, an unchanged count every
// ReportRefresh, a full report whenever the node is drained, and an empty
// drain once it no longer is.
func TestReportsWhatChanged(t *testing.T) {
	ct := NewFake(table()...)
	d, clk, _ := newDrain(t, ct)
	if r := d.Report(true); r != nil {
		t.Errorf("full report of an undrained node: %+v, want nil", r)
	}
	d.Received(state(true, time.Time{}))
	d.Check()
	if got := drainOf(d.Report(false)); got == nil || got.Connections != len(served) {
		t.Errorf("first count: %+v", got)
	}
	clk.Step(CountPeriod)
	d.Check()
	if r := d.Report(false); r != nil {
		t.Errorf("an unchanged count %v after the last report: %+v, want nil", CountPeriod, r)
	}
	if got := drainOf(d.Report(true)); got == nil || got.Connections != len(served) {
		t.Errorf("full report: %+v, want the drain", got)
	}
	clk.Step(ReportRefresh)
	d.Check()
	if got := drainOf(d.Report(false)); got == nil || !got.CountedAt.Equal(clk.Now()) {
		t.Errorf("an unchanged count %v after the last report: %+v, want it again", ReportRefresh, got)
	}
	ct.Set(served[1:]...)
	clk.Step(CountPeriod)
	d.Check()
	if got := drainOf(d.Report(false)); got == nil || got.Connections != len(served)-1 {
		t.Errorf("a connection ended: %+v, want %d", got, len(served)-1)
	}
	d.Received(state(false, time.Time{}))
	if got := drainOf(d.Report(false)); got == nil || *got != (report.DrainReport{}) {
		t.Errorf("uncordoned: %+v, want an empty drain", got)
	}
	if r := d.Report(false); r != nil {
		t.Errorf("uncordoned, reported: %+v, want nil", r)
	}
}

// Run ends the connections when the deadline passes, between two counts,
// and stops with its context.
func TestRunEndsAtTheDeadline(t *testing.T) {
	ct := NewFake(table()...)
	d, clk := runDrain(t, ct)

	d.Received(state(true, t0.Add(3*time.Second)))
	// The ticker and the deadline's timer.
	wait.Until(t, 5*time.Second, "Run waits for its next count and the deadline", func() bool { return clk.Waiters() == 2 })
	if del := ct.Deleted(); len(del) != 0 {
		t.Fatalf("deleted before the deadline: %v", del)
	}
	clk.Step(3 * time.Second) // past the deadline, before the second count
	wait.Until(t, 5*time.Second, "the connections are ended", func() bool { return len(ct.Deleted()) == len(served) })
	wait.For(t, 5*time.Second, "the count after the deadline", func() error {
		got := drainOf(d.Report(true))
		if got == nil || got.Connections != 0 || got.Ended != len(served) {
			return errors.New("not yet")
		}
		return nil
	})
}

// A deadline Run cannot keep (the table failing) is tried again at the
// next count, not in a loop.
func TestRunRetriesAFailedDeadlineAtTheNextCount(t *testing.T) {
	ct := NewFake(table()...)
	ct.Fail(errors.New("operation not permitted"))
	d, clk := runDrain(t, ct)

	d.Received(state(true, t0.Add(3*time.Second)))
	wait.Until(t, 5*time.Second, "Run waits for its next count and the deadline", func() bool { return clk.Waiters() == 2 })
	calls := ct.Calls()
	clk.Step(3 * time.Second)
	wait.Until(t, 5*time.Second, "Run tries to keep the deadline", func() bool { return ct.Calls() > calls })
	// Then it waits for its next count alone: a timer for a deadline
	// already past would fire at once, again and again.
	time.Sleep(200 * time.Millisecond)
	if n := clk.Waiters(); n != 1 {
		t.Errorf("after failing to keep the deadline Run waits on %d timers, want its ticker alone", n)
	}
	ct.Fail(nil)
	clk.Step(CountPeriod)
	wait.Until(t, 5*time.Second, "the connections are ended at the next count", func() bool { return len(ct.Deleted()) == len(served) })
}

// TestFrontendsFollowChangesAsAWholeStateWould: over random states handed
// over as changes (Changed naming the services that differ), drains that
// begin and end and node addresses that change, the frontends a drained
// node counts are those of the whole state at every step.
func TestFrontendsFollowChangesAsAWholeStateWould(t *testing.T) {
	// wanted is the whole state's frontends.
	wanted := func(st datapath.NodeState) map[netip.AddrPort]bool {
		out := map[netip.AddrPort]bool{}
		for _, svc := range st.Services {
			for _, p := range svc.Ports {
				if p.Protocol != datapath.TCP {
					continue
				}
				for _, ip := range append(slices.Clone(svc.LoadBalancerIPs), svc.ExternalIPs...) {
					out[netip.AddrPortFrom(ip, p.Port)] = true
				}
				if p.NodePort != 0 {
					for _, a := range st.Node.Addresses {
						out[netip.AddrPortFrom(a, p.NodePort)] = true
					}
				}
			}
		}
		return out
	}
	ip := func(a, b byte) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, a, b}) }
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 3))
		d := New(nil, clocktesting.NewFakeClock(t0), slog.New(slog.DiscardHandler), nil)
		st := datapath.NodeState{Node: datapath.NodeInfo{Addresses: []netip.Addr{ip(2, 1)}}, Services: map[datapath.ServiceKey]*datapath.Service{}}
		for step := range 300 {
			next := datapath.NodeState{Node: st.Node, Services: maps.Clone(st.Services), Changed: []datapath.ServiceKey{}}
			if rng.IntN(10) == 0 {
				next.Node.Drained = !next.Node.Drained
			}
			if rng.IntN(15) == 0 {
				next.Node.Addresses = []netip.Addr{ip(2, byte(1+rng.IntN(2)))}
			}
			for range rng.IntN(4) {
				key := datapath.ServiceKey{Namespace: "default", Name: fmt.Sprintf("s%d", rng.IntN(12))}
				next.Changed = append(next.Changed, key)
				if rng.IntN(4) == 0 {
					delete(next.Services, key)
					continue
				}
				svc := &datapath.Service{Key: key, Ports: []datapath.ServicePort{{Protocol: datapath.Protocol(1 + rng.IntN(2)), Port: uint16(80 + rng.IntN(2))}}}
				if rng.IntN(2) == 0 {
					svc.Ports[0].NodePort = uint16(30000 + rng.IntN(3))
				}
				if rng.IntN(2) == 0 {
					svc.LoadBalancerIPs = []netip.Addr{ip(113, byte(rng.IntN(4)))}
				}
				if rng.IntN(3) == 0 {
					svc.ExternalIPs = []netip.Addr{ip(100, byte(rng.IntN(4)))}
				}
				next.Services[key] = svc
			}
			if rng.IntN(20) == 0 {
				next.Changed = nil
			}
			d.Received(next)
			d.mu.Lock()
			got := map[netip.AddrPort]bool{}
			if d.frontends != nil {
				for fe, n := range d.frontends.count {
					got[fe] = n > 0
				}
			}
			d.mu.Unlock()
			want := map[netip.AddrPort]bool{}
			if next.Node.Drained {
				want = wanted(next)
			}
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Fatalf("seed %d, step %d: frontends (-want +got):\n%s", seed, step, diff)
			}
			st = next
		}
	}
}
