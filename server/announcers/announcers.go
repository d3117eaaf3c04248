// Package announcers chooses which nodes announce a load-balancer address
// when not every node may: a router installs only 8 to 64 next hops per
// prefix, so a pool can limit an address with externalTrafficPolicy
// Cluster to K announcing nodes (MetalLB's and GKE's subsetting do the
// same). The choice is rendezvous hashing: every node gets a score per
// address, and the K highest announce. It depends only on the address and
// the set of candidate nodes, so every replica and every restart agrees,
// and a node that comes or goes changes the announcers of only the
// addresses it is (or becomes) one of.
package announcers

import "slices"

// Choose returns the k of nodes that announce addr, highest score first;
// all of them when there are no more than k (or k is 0: no limit).
func Choose(addr string, nodes []string, k int) []string {
	if k <= 0 || len(nodes) <= k {
		return slices.Clone(nodes)
	}
	type scored struct {
		node  string
		score uint64
	}
	all := make([]scored, len(nodes))
	a := hash(addr)
	for i, n := range nodes {
		all[i] = scored{n, mix(a ^ hash(n))}
	}
	slices.SortFunc(all, func(x, y scored) int {
		switch {
		case x.score > y.score:
			return -1
		case x.score < y.score:
			return 1
		}
		return 0
	})
	out := make([]string, k)
	for i := range out {
		out[i] = all[i].node
	}
	return out
}

// hash is FNV-1a, 64 bits: fixed, so every process agrees.
func hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is splitmix64's finaliser: FNV of similar names differs in few
// bits, and the score must look random in all of them.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
