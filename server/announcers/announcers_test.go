package announcers

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// Stats is what a choice over many addresses looks like: per-node load
// and how many addresses change announcers when one node goes.
type stats struct {
	exactlyK   bool
	cv         float64 // coefficient of variation of addresses per node
	movedShare float64 // addresses whose announcers changed when a node went
}

func measure(nodes, addrs []string, k int) stats {
	per := map[string]int{}
	before := make([][]string, len(addrs))
	st := stats{exactlyK: true}
	for i, a := range addrs {
		before[i] = Choose(a, nodes, k)
		if len(before[i]) != k {
			st.exactlyK = false
		}
		for _, n := range before[i] {
			per[n]++
		}
	}
	mean := float64(len(addrs)*k) / float64(len(nodes))
	var sq float64
	for _, n := range nodes {
		d := float64(per[n]) - mean
		sq += d * d
	}
	st.cv = math.Sqrt(sq/float64(len(nodes))) / mean
	gone := nodes[len(nodes)/2]
	rest := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == gone })
	moved := 0
	for i, a := range addrs {
		after := Choose(a, rest, k)
		a, b := slices.Clone(before[i]), slices.Clone(after)
		slices.Sort(a)
		slices.Sort(b)
		if !slices.Equal(a, b) {
			moved++
		}
	}
	st.movedShare = float64(moved) / float64(len(addrs))
	return st
}

// TestChoiceAtScale: 256 nodes, 10,000 addresses, K = 16 (the issue's
// figures): every address has exactly K announcers, the load per node
// varies by less than 5 %, and removing one node changes the announcers of
// at most 1/16 + 2 % of the addresses.
func TestChoiceAtScale(t *testing.T) {
	nodes := names("node-", 256)
	var addrs []string
	for i := range 10000 {
		addrs = append(addrs, fmt.Sprintf("203.%d.%d.%d", i>>16, (i>>8)&255, i&255))
	}
	st := measure(nodes, addrs, 16)
	t.Logf("exactly K: %v; per-node CV %.2f%%; moved when one node went: %.2f%% (1/16 = 6.25%%)", st.exactlyK, 100*st.cv, 100*st.movedShare)
	if !st.exactlyK {
		t.Error("an address without exactly K announcers")
	}
	if st.cv >= 0.05 {
		t.Errorf("per-node load CV %.2f%%, want < 5%%", 100*st.cv)
	}
	if st.movedShare > 1.0/16+0.02 {
		t.Errorf("%.2f%% of addresses changed announcers when one node went, want at most %.2f%%", 100*st.movedShare, 100*(1.0/16+0.02))
	}
}

// TestChoiceIsStable: the choice depends on the set of nodes, not their
// order, and every node is chosen when there are no more than K.
func TestChoiceIsStable(t *testing.T) {
	nodes := names("n", 20)
	got := Choose("198.51.100.7", nodes, 4)
	rev := slices.Clone(nodes)
	slices.Reverse(rev)
	if again := Choose("198.51.100.7", rev, 4); !slices.Equal(got, again) {
		t.Errorf("choice %v, with the nodes reversed %v", got, again)
	}
	if all := Choose("198.51.100.7", nodes[:3], 4); len(all) != 3 {
		t.Errorf("3 nodes, K 4: %v, want all three", all)
	}
	if all := Choose("198.51.100.7", nodes, 0); len(all) != 20 {
		t.Errorf("K 0 (no limit): %d nodes, want 20", len(all))
	}
}
