package datapath

import (
	"hash/fnv"
	"net/netip"
)

// A flow table maps the hash of a UDP flow (the client's address and port,
// FlowHashSeed) to one of a frontend's endpoints, the same on every node,
// so that a flow a router moves to another node reaches the endpoint it
// had. It is Maglev's table (Eisenbud et al., NSDI 2016): each endpoint
// claims slots in the order of its own permutation of the table, taking
// turns, so the endpoints hold the slots evenly, and an endpoint added or
// removed takes or gives up about its share while the others keep nearly
// all of theirs. Which slots an endpoint prefers depends on its address
// and port alone (never on the node, nor on the other endpoints), so
// every node that holds the same endpoints builds the same table.

// flowTableSizes are the sizes a table may have: primes (a permutation
// walks every slot of a prime size), each about four times the last.
// A table of another size shares no slot with the last, so a service
// whose endpoints cross a size (16, 64, 256, ... endpoints) moves every
// flow it has once: the sizes are few, and the first holds up to 15
// endpoints, so that most services never change size.
var flowTableSizes = []int{251, 1021, 4093, 16381, 65521, 262139, 1048573}

// flowTableSlotsPerEndpoint is how many slots a table has per endpoint at
// least: an endpoint holds one slot more than another at most, so they
// differ in share by 1/16 at most.
const flowTableSlotsPerEndpoint = 16

// flowTableSize is the size of the table of n endpoints: the smallest of
// flowTableSizes with flowTableSlotsPerEndpoint slots per endpoint (the
// largest beyond).
func flowTableSize(n int) int {
	for _, m := range flowTableSizes {
		if m >= flowTableSlotsPerEndpoint*n {
			return m
		}
	}
	return flowTableSizes[len(flowTableSizes)-1]
}

// flowTable fills a table of m slots (a prime) with the indexes of eps,
// which must be fewer than m: each slot the endpoint that holds it.
func flowTable(eps []netip.AddrPort, m int) []int32 {
	n := len(eps)
	offset, skip, next := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i, ep := range eps {
		offset[i] = endpointHash(ep, 'o') % uint64(m)
		skip[i] = endpointHash(ep, 's')%uint64(m-1) + 1
	}
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	for filled := 0; ; {
		for i := range n {
			slot := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[slot] >= 0 {
				next[i]++
				slot = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[slot] = int32(i)
			next[i]++
			if filled++; filled == m {
				return table
			}
		}
	}
}

// endpointHash is FNV-1a of the endpoint's address and port after a salt
// byte: two hashes of one endpoint, its table offset and step. Fixed for
// good, as every node and every release must agree on it.
func endpointHash(ep netip.AddrPort, salt byte) uint64 {
	h := fnv.New64a()
	h.Write([]byte{salt})
	b, _ := ep.MarshalBinary()
	h.Write(b)
	return h.Sum64()
}
