package l2owner

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func addrs(n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)})
	}
	return out
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node%03d", i)
	}
	return out
}

func everyNode(as []netip.Addr, nodes []string) map[netip.Addr][]string {
	c := map[netip.Addr][]string{}
	for _, a := range as {
		c[a] = nodes
	}
	return c
}

func loads(owner map[netip.Addr]string, nodes []string) []float64 {
	count := map[string]int{}
	for _, n := range owner {
		count[n]++
	}
	out := make([]float64, len(nodes))
	for i, n := range nodes {
		out[i] = float64(count[n])
	}
	return out
}

func cv(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
	}
	return math.Sqrt(sq/float64(len(xs))) / mean
}

// 256 nodes and 1,000 addresses: every node owns 3 or 4 (rendezvous alone
// would give some nodes none and others ten).
func TestAssignSpreadsEvenly(t *testing.T) {
	as, nodes := addrs(1000), names(256)
	owner := Assign(everyNode(as, nodes), nil)
	l := loads(owner, nodes)
	if got := cv(l); got >= 0.10 {
		t.Errorf("owned addresses per node: coefficient of variation %.3f, want < 0.10", got)
	}
	if lo, hi := slices.Min(l), slices.Max(l); hi-lo > 1 {
		t.Errorf("owned addresses per node from %v to %v; want within one", lo, hi)
	}
	if len(owner) != len(as) {
		t.Errorf("%d of %d addresses have an owner", len(owner), len(as))
	}
}

// A node that goes moves only the addresses it owned; one that comes back
// takes nothing while no node holds more than Keep.
func TestAssignMovesOnlyWhatItMust(t *testing.T) {
	as, nodes := addrs(1000), names(256)
	before := Assign(everyNode(as, nodes), nil)
	gone := nodes[17]
	after := Assign(everyNode(as, slices.Delete(slices.Clone(nodes), 17, 18)), before)
	for _, a := range as {
		if before[a] != gone && after[a] != before[a] {
			t.Fatalf("%s moved from %s to %s when %s went", a, before[a], after[a], gone)
		}
		if after[a] == gone {
			t.Fatalf("%s is still owned by %s, which went", a, gone)
		}
	}
	back := Assign(everyNode(as, nodes), after)
	for _, a := range as {
		if back[a] != after[a] {
			t.Errorf("%s moved from %s to %s when %s came back, though no node held more than %d", a, after[a], back[a], gone, Keep(len(as), len(nodes)))
		}
	}
}

// The lab's case: a Local service's two addresses (IPv4 and IPv6) over
// three nodes. The owner of both fails, another takes them; when it
// comes back, nothing moves back to it.
func TestAssignDoesNotMoveBackToANodeThatCameBack(t *testing.T) {
	as := []netip.Addr{netip.MustParseAddr("192.0.2.200"), netip.MustParseAddr("2001:db8:2::200")}
	nodes := []string{"node1", "node2", "node3"}
	for _, failed := range nodes {
		before := map[netip.Addr]string{as[0]: failed, as[1]: failed}
		rest := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == failed })
		during := Assign(everyNode(as, rest), before)
		after := Assign(everyNode(as, nodes), during)
		if !maps.Equal(after, during) {
			t.Errorf("%s failed, the owners became %v; when it came back they became %v", failed, during, after)
		}
	}
}

// Past Keep, a node that came back takes what the others hold past it,
// and no more: three nodes, 30 addresses; one goes (the others hold 15
// each), and when it comes back, each gives it 2 (Keep is 10 + 3).
func TestAssignRebalancesPastTheThreshold(t *testing.T) {
	as, nodes := addrs(30), names(3)
	before := Assign(everyNode(as, nodes), nil)
	during := Assign(everyNode(as, nodes[1:]), before)
	after := Assign(everyNode(as, nodes), during)
	got := loads(after, nodes)
	if want := []float64{4, 13, 13}; !slices.Equal(got, want) {
		t.Errorf("addresses per node when %s came back: %v, want %v", nodes[0], got, want)
	}
	for a, n := range after {
		if n != during[a] && n != nodes[0] {
			t.Errorf("%s moved from %s to %s, not to the node that came back", a, during[a], n)
		}
	}
}

// Keep: the share, and a quarter more, at least one.
func TestKeep(t *testing.T) {
	for _, c := range []struct{ m, n, want int }{{0, 3, 1}, {1, 3, 2}, {2, 3, 2}, {30, 3, 13}, {1000, 256, 5}, {100, 1, 125}, {5, 0, 0}} {
		if got := Keep(c.m, c.n); got != c.want {
			t.Errorf("Keep(%d, %d) = %d, want %d", c.m, c.n, got, c.want)
		}
	}
}

// Only candidates own; an address without one has no owner; assigning
// again what was assigned changes nothing.
func TestAssignKeepsToCandidatesAndSettles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := names(12)
	for round := range 50 {
		c := map[netip.Addr][]string{}
		for _, a := range addrs(40) {
			var cs []string
			for _, n := range nodes {
				if rng.IntN(4) == 0 { // a Local service: few nodes have its endpoints
					cs = append(cs, n)
				}
			}
			c[a] = cs
		}
		owner := Assign(c, nil)
		for a, cs := range c {
			switch n, ok := owner[a]; {
			case len(cs) == 0 && ok:
				t.Fatalf("round %d: %s has no candidate and is owned by %s", round, a, n)
			case len(cs) > 0 && !slices.Contains(cs, n):
				t.Fatalf("round %d: %s is owned by %q, not one of its candidates %v", round, a, n, cs)
			}
		}
		if again := Assign(c, owner); !maps.Equal(again, owner) {
			t.Fatalf("round %d: assigning again moved addresses", round)
		}
	}
}

func TestLeasesAreFenced(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	const ttl, margin = 2 * time.Second, 500 * time.Millisecond
	tbl := NewTable(clk, ttl, margin)
	a := netip.MustParseAddr("192.0.2.50")

	// A table that just started knows of no lease it may have given
	// before: nothing is granted until such a lease has surely ended.
	if v, _ := tbl.Request(a, "n1", "n1"); v != Fenced {
		t.Fatalf("a fresh table granted at once (%v)", v)
	}
	clk.SetTime(t0.Add(ttl + margin))
	v, first := tbl.Request(a, "n1", "n1")
	if v != Granted || first.Node != "n1" || !first.Expires.Equal(clk.Now().Add(ttl)) {
		t.Fatalf("request of the chosen node: %v %+v", v, first)
	}
	if v, _ := tbl.Request(a, "n2", "n1"); v != NotChosen {
		t.Fatalf("a node not chosen: %v", v)
	}
	// Renewed while chosen, with the same epoch.
	clk.SetTime(clk.Now().Add(time.Second))
	if v, l := tbl.Request(a, "n1", "n1"); v != Granted || l.Epoch != first.Epoch || !l.Since.Equal(first.Since) {
		t.Fatalf("renewal: %v %+v (first %+v)", v, l, first)
	}
	end := clk.Now().Add(ttl)
	// n1 fails; n2 is chosen now. It waits until n1's lease has ended,
	// by the server's clock, plus the margin.
	for _, at := range []time.Time{clk.Now(), end, end.Add(margin - time.Millisecond)} {
		clk.SetTime(at)
		if v, _ := tbl.Request(a, "n2", "n2"); v != Fenced {
			t.Fatalf("at %v (n1's lease ends %v): n2 got %v", at.Sub(t0), end.Sub(t0), v)
		}
	}
	if _, held := tbl.Holder(a); held {
		t.Fatal("n1 still shown as holder after its lease ended")
	}
	clk.SetTime(end.Add(margin))
	v, second := tbl.Request(a, "n2", "n2")
	if v != Granted || second.Epoch <= first.Epoch {
		t.Fatalf("after the fence: %v %+v; want a grant of a newer epoch than %d", v, second, first.Epoch)
	}
	// A late renewal of the old owner, or its release of the old epoch,
	// changes nothing.
	if v, _ := tbl.Request(a, "n1", "n2"); v != NotChosen {
		t.Fatalf("the old owner renewed: %v", v)
	}
	tbl.Release(a, "n1", first.Epoch)
	if h, held := tbl.Holder(a); !held || h.Node != "n2" {
		t.Fatalf("holder after a stale release: %+v %v", h, held)
	}
	// A handover: n2 releases, n3 is granted at once.
	tbl.Release(a, "n2", second.Epoch)
	if v, l := tbl.Request(a, "n3", "n3"); v != Granted || l.Epoch <= second.Epoch {
		t.Fatalf("after a release: %v %+v", v, l)
	}
}

// A restarted server gives epochs no agent can still hold.
func TestEpochsGrowAcrossRestarts(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	a := netip.MustParseAddr("192.0.2.50")
	var last uint64
	for restart := range 3 {
		clk := clocktesting.NewFakePassiveClock(t0.Add(time.Duration(restart) * time.Minute))
		tbl := NewTable(clk, time.Second, time.Second)
		clk.SetTime(clk.Now().Add(2 * time.Second))
		v, l := tbl.Request(a, "n1", "n1")
		if v != Granted || l.Epoch <= last {
			t.Fatalf("restart %d: %v epoch %d after %d", restart, v, l.Epoch, last)
		}
		last = l.Epoch
	}
}

// go test -run '^$' -bench Assign ./server/l2owner
func BenchmarkAssign(b *testing.B) {
	for _, size := range []struct{ nodes, addrs int }{{16, 64}, {256, 1000}, {1000, 1000}} {
		b.Run(fmt.Sprintf("%dnodes_%daddrs", size.nodes, size.addrs), func(b *testing.B) {
			c := everyNode(addrs(size.addrs), names(size.nodes))
			owner := Assign(c, nil)
			b.ResetTimer()
			for range b.N {
				Assign(c, owner)
			}
		})
	}
}

// TestAssignOverSetsAgreesWithTheListsRule: Assign works on sets of
// nodes as bits; over random candidates (every node, a few, none, nodes
// past 64 and 128 so that sets span several words) and random current
// owners (some no candidate any more, some unknown), it chooses exactly
// what the rule written over lists of names chooses.
func TestAssignOverSetsAgreesWithTheListsRule(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 50))
	for round := range 3000 {
		all := names(1 + r.IntN(150))
		c := map[netip.Addr][]string{}
		current := map[netip.Addr]string{}
		for _, a := range addrs(r.IntN(120)) {
			var cs []string
			switch r.IntN(4) {
			case 0:
				cs = slices.Clone(all)
			case 1:
				// none
			default:
				for _, n := range all {
					if r.IntN(4) == 0 {
						cs = append(cs, n)
					}
				}
			}
			c[a] = cs
			switch r.IntN(3) {
			case 0:
				current[a] = all[r.IntN(len(all))]
			case 1:
				current[a] = "gone"
			}
		}
		want := assignReference(c, current)
		if got := Assign(c, current); !maps.Equal(got, want) {
			t.Fatalf("round %d: Assign chose\n%v\nthe rule over lists\n%v\nfor candidates %v, current %v", round, got, want, c, current)
		}
	}
}

// assignReference is Assign as it was written over lists of names, one
// (address, node) pair at a time: the oracle the sets must agree with.
func assignReference(candidates map[netip.Addr][]string, current map[netip.Addr]string) map[netip.Addr]string {
	// The ranks are the candidates' own order (name order, as the cluster
	// rules give them), the same on every replica; the bounded loads
	// spread the addresses. The nodes and the addresses with candidates
	// are counted once for every round: a failover's choice walks every
	// address with every candidate.
	nodes := map[string]bool{}
	m := 0
	for _, cs := range candidates {
		for _, n := range cs {
			nodes[n] = true
		}
		if len(cs) > 0 {
			m++
		}
	}
	owner := assignOnceReference(candidates, len(nodes), m, current)
	for range 8 {
		next := assignOnceReference(candidates, len(nodes), m, owner)
		if maps.Equal(next, owner) {
			break
		}
		owner = next
	}
	return owner
}

// assignOnce is one round of Assign, with each address's candidates
// ranked best first, over nodes nodes and m addresses with candidates.
func assignOnceReference(ranked map[netip.Addr][]string, nodes, m int, current map[netip.Addr]string) map[netip.Addr]string {
	owner := make(map[netip.Addr]string, m)
	if nodes == 0 {
		return owner
	}
	floor, extra := m/nodes, m%nodes
	load, atCeil := map[string]int{}, 0
	canTake := func(n string) bool { return load[n] < floor || (load[n] == floor && atCeil < extra) }
	take := func(a netip.Addr, n string) {
		if load[n] == floor {
			atCeil++
		}
		load[n]++
		owner[a] = n
	}
	// Current owners keep their best-ranked addresses, up to Keep each.
	keep := Keep(m, nodes)
	kept := map[string][]netip.Addr{}
	for a, n := range current {
		if slices.Contains(ranked[a], n) {
			kept[n] = append(kept[n], a)
		}
	}
	byName := slices.Sorted(maps.Keys(kept))
	for _, n := range byName {
		slices.SortFunc(kept[n], func(x, y netip.Addr) int {
			return cmp.Or(cmp.Compare(slices.Index(ranked[x], n), slices.Index(ranked[y], n)), x.Compare(y))
		})
		for _, a := range kept[n][:min(len(kept[n]), keep)] {
			take(a, n)
		}
	}
	// Then every address without an owner, in address order: its
	// best-ranked candidate with room, or its best-ranked one.
	for _, a := range slices.SortedFunc(maps.Keys(ranked), netip.Addr.Compare) {
		if owner[a] != "" || len(ranked[a]) == 0 {
			continue
		}
		pick := ranked[a][0]
		for _, n := range ranked[a] {
			if canTake(n) {
				pick = n
				break
			}
		}
		take(a, pick)
	}
	return owner
}
