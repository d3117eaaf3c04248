package l2owner

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// BenchmarkLeaseAsks is the leader's side of the lease protocol at scale:
// nodes agents, each asking four times a lease's life (every 150 ms with
// the default 600 ms lease), over addrs L2 addresses that every node may
// answer for (a Cluster service), each held. One op is one node's
// renewal, taken in turn from every node: ns/op × nodes × 4 / lease is
// the share of one CPU the leader spends on asks (reported as
// leader-cpu-%). The failover sub-benchmark is the choice after a node
// owning its share of the addresses stops asking: one op is one
// reassignment, the server's part of a failover's time. The candidates
// sub-benchmark is the candidates given again after a change (one op:
// one address added or removed).
//
//	go test -run '^$' -bench LeaseAsks ./server/l2owner
func BenchmarkLeaseAsks(b *testing.B) {
	for _, size := range []struct{ nodes, addrs int }{{1000, 250}, {1000, 1000}, {5000, 1000}, {5000, 5000}} {
		o, clk, streams := heldLeases(b, size.nodes, size.addrs)
		b.Run(fmt.Sprintf("renew/nodes=%d/addrs=%d", size.nodes, size.addrs), func(b *testing.B) {
			held := make([][]Held, len(streams))
			for i, s := range streams {
				for _, g := range s.Ask(Asked{}) {
					held[i] = append(held[i], Held{Addr: g.Addr, Epoch: g.Epoch})
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := i % len(streams)
				streams[k].Ask(Asked{Held: held[k]})
			}
			b.StopTimer()
			perAsk := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			asksPerSecond := float64(size.nodes) * 4 / DefaultTTLForBench.Seconds()
			b.ReportMetric(perAsk*asksPerSecond/1e7, "leader-cpu-%")
		})
		b.Run(fmt.Sprintf("failover/nodes=%d/addrs=%d", size.nodes, size.addrs), func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				// A node stops asking, then comes back (owning nothing).
				s := streams[i%len(streams)]
				o.mu.Lock()
				s.stopping = true
				o.assignLocked()
				s.stopping = false
				o.mu.Unlock()
			}
		})
		b.Run(fmt.Sprintf("renew-while-handing-over/nodes=%d/addrs=%d", size.nodes, size.addrs), func(b *testing.B) {
			// A tenth of the nodes stop at once (a rolling restart, a
			// drain of a rack): their addresses are handed over, and
			// every other node keeps renewing meanwhile.
			o.mu.Lock()
			for i, s := range streams {
				if i%10 == 0 {
					s.stopping = true
				}
			}
			o.assignLocked()
			handing := len(o.handing)
			o.mu.Unlock()
			defer func() {
				o.mu.Lock()
				for _, s := range streams {
					s.stopping = false
				}
				o.assignLocked()
				o.mu.Unlock()
			}()
			if handing == 0 {
				b.Fatal("no handover under way")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := i % len(streams)
				if k%10 == 0 {
					k++
				}
				streams[k].Ask(Asked{})
			}
			b.ReportMetric(float64(handing), "handovers")
		})
		b.Run(fmt.Sprintf("candidates/nodes=%d/addrs=%d", size.nodes, size.addrs), func(b *testing.B) {
			// The candidates given again after a change of the registry:
			// one address more, then one fewer, each list a new slice
			// (as the leader works them out afresh every time).
			all := names(size.nodes)
			given := func(extra bool) map[netip.Addr][]string {
				c := map[netip.Addr][]string{}
				for _, a := range addrsOf(size.addrs) {
					c[a] = slices.Clone(all)
				}
				if extra {
					c[netip.MustParseAddr("192.0.2.1")] = slices.Clone(all)
				}
				return c
			}
			cs := []map[netip.Addr][]string{given(true), given(false)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				o.SetCandidates(cs[i%2])
			}
		})
		_ = clk
	}
}

// DefaultTTLForBench is the lease life the bench counts asks with (the
// server's default --l2-lease-duration).
const DefaultTTLForBench = 600 * time.Millisecond

// heldLeases is a leading Owners with nodes streams that asked, and addrs
// addresses every node is a candidate for, each granted to its owner.
func heldLeases(b *testing.B, nodes, addrs int) (*Owners, *clocktesting.FakeClock, []*Stream) {
	b.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	o := NewOwners(clk, DefaultTTLForBench, testMargin, slog.New(slog.DiscardHandler), nil)
	o.mu.Lock()
	o.table = NewTable(clk, o.ttl, o.margin)
	o.mu.Unlock()
	names := names(nodes)
	streams := make([]*Stream, nodes)
	for i, n := range names {
		s, err := o.Open(n, false)
		if err != nil {
			b.Fatal(err)
		}
		streams[i] = s
	}
	clk.Step(o.ttl + o.margin)
	for _, s := range streams {
		s.Ask(Asked{})
	}
	c := map[netip.Addr][]string{}
	for _, a := range addrsOf(addrs) {
		c[a] = names
	}
	o.mu.Lock()
	o.warm = true
	o.mu.Unlock()
	o.SetCandidates(c)
	granted := 0
	for _, s := range streams {
		granted += len(s.Ask(Asked{}))
	}
	if granted != addrs {
		b.Fatalf("%d of %d addresses granted", granted, addrs)
	}
	return o, clk, streams
}

// addrsOf is n addresses of 10.0.0.0/8.
func addrsOf(n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	return out
}
