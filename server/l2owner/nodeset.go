package l2owner

import (
	"cmp"
	"maps"
	"math/bits"
	"net/netip"
	"slices"
)

// The choice works on sets of nodes as bits: with every node of a large
// segment a candidate of every address (a Cluster service), a failover's
// choice at 5,000 nodes and 5,000 addresses is 25 million (address,
// node) pairs, too many to look up one by one within a lease's margin.

// nodeIndex numbers the nodes in name order, so that a set's bits in
// order are its nodes in name order: the candidates' ranks.
type nodeIndex struct {
	names []string
	of    map[string]int
}

func newNodeIndex(names []string) nodeIndex {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	ix := nodeIndex{names: names, of: make(map[string]int, len(names))}
	for i, n := range names {
		ix.of[n] = i
	}
	return ix
}

// words is how many words a set of the index's nodes takes.
func (ix nodeIndex) words() int { return (len(ix.names) + 63) / 64 }

// setOf is the set of names (each in the index).
func (ix nodeIndex) setOf(names []string) nodeSet {
	s := make(nodeSet, ix.words())
	for _, n := range names {
		s.add(ix.of[n])
	}
	return s
}

// nodeSet is a set of nodes of a nodeIndex, one bit each.
type nodeSet []uint64

func (s nodeSet) add(i int)      { s[i/64] |= 1 << (i % 64) }
func (s nodeSet) remove(i int)   { s[i/64] &^= 1 << (i % 64) }
func (s nodeSet) has(i int) bool { return i >= 0 && i/64 < len(s) && s[i/64]&(1<<(i%64)) != 0 }

func (s nodeSet) count() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// below counts s's nodes before i: i's rank among them.
func (s nodeSet) below(i int) int {
	n := 0
	for _, w := range s[:i/64] {
		n += bits.OnesCount64(w)
	}
	return n + bits.OnesCount64(s[i/64]&(1<<(i%64)-1))
}

// next is s's first node from i on, or -1.
func (s nodeSet) next(i int) int {
	for k := i / 64; k < len(s); k++ {
		w := s[k]
		if k == i/64 {
			w &^= 1<<(i%64) - 1
		}
		if w != 0 {
			return k*64 + bits.TrailingZeros64(w)
		}
	}
	return -1
}

// firstOfBoth is the first node in both s and t, or -1.
func firstOfBoth(s, t nodeSet) int {
	for k := range s {
		if w := s[k] & t[k]; w != 0 {
			return k*64 + bits.TrailingZeros64(w)
		}
	}
	return -1
}

// assignSets is Assign over sets of nodes of width words: each address's
// candidates, the current owners by index.
func assignSets(candidates map[netip.Addr]nodeSet, words int, current map[netip.Addr]int) map[netip.Addr]int {
	all := make(nodeSet, words)
	m := 0
	for _, cs := range candidates {
		empty := true
		for k, w := range cs {
			all[k] |= w
			empty = empty && w == 0
		}
		if !empty {
			m++
		}
	}
	// The addresses in address order, once for every round.
	order := slices.SortedFunc(maps.Keys(candidates), netip.Addr.Compare)
	owner := assignSetsOnce(candidates, order, all, m, current)
	for range 8 {
		next := assignSetsOnce(candidates, order, all, m, owner)
		if maps.Equal(next, owner) {
			break
		}
		owner = next
	}
	return owner
}

// assignSetsOnce is one round of assignSets (assignOnce's rules), over
// the nodes of all and m addresses with candidates.
func assignSetsOnce(candidates map[netip.Addr]nodeSet, order []netip.Addr, all nodeSet, m int, current map[netip.Addr]int) map[netip.Addr]int {
	owner := make(map[netip.Addr]int, m)
	nodes := all.count()
	if nodes == 0 {
		return owner
	}
	floor, extra := m/nodes, m%nodes
	load := make([]int, len(all)*64)
	atCeil := 0
	// room are the nodes that can take one more: below floor, or at it
	// while fewer than extra nodes went past it.
	room := slices.Clone(all)
	canTake := func(n int) bool { return load[n] < floor || (load[n] == floor && atCeil < extra) }
	take := func(a netip.Addr, n int) {
		crossed := load[n] == floor
		if crossed {
			atCeil++
		}
		load[n]++
		owner[a] = n
		if !canTake(n) {
			room.remove(n)
		}
		if crossed && atCeil == extra {
			// No node may go past floor any more: those at it are full.
			for i := room.next(0); i >= 0; i = room.next(i + 1) {
				if !canTake(i) {
					room.remove(i)
				}
			}
		}
	}
	// Current owners keep their best-ranked addresses, up to Keep each.
	keep := Keep(m, nodes)
	kept := map[int][]netip.Addr{}
	for a, n := range current {
		if candidates[a].has(n) {
			kept[n] = append(kept[n], a)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(kept)) {
		as := kept[n]
		if len(as) > keep {
			slices.SortFunc(as, func(x, y netip.Addr) int {
				return cmp.Or(cmp.Compare(candidates[x].below(n), candidates[y].below(n)), x.Compare(y))
			})
			as = as[:keep]
		}
		for _, a := range as {
			take(a, n)
		}
	}
	// Then every address without an owner, in address order: its
	// best-ranked candidate with room, or its best-ranked one.
	for _, a := range order {
		if _, ok := owner[a]; ok {
			continue
		}
		cs := candidates[a]
		pick := firstOfBoth(cs, room)
		if pick < 0 {
			if pick = cs.next(0); pick < 0 {
				continue
			}
		}
		take(a, pick)
	}
	return owner
}
