package nodestate

import (
	"net/netip"
	"slices"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/server/registry"
)

// flowPeersSent is how many of the next nodes of the ring a node is told:
// a packet goes to the first of them that is alive.
const flowPeersSent = 3

// FlowRing is the ring the packets of moved connections go round: every
// node with an address to take them at, in name order. A router moves a
// connection to a node that holds no entry for it when the set of nodes
// behind its ECMP route changes; that node passes it to the next one, and
// so on until the node that holds it. Every node that may hold a
// connection is on it, drained and deleting ones included: they still
// serve what they hold.
type FlowRing []datapath.FlowPeer

// FlowRingOf is the registry's ring.
func FlowRingOf(v registry.View) FlowRing {
	names := v.NodeNames()
	slices.Sort(names)
	ring := make(FlowRing, 0, len(names))
	for _, name := range names {
		n := v.Node(name)
		var addrs []netip.Addr
		for _, is6 := range []bool{false, true} {
			if a, ok := datapath.NextHop(n.Addresses, is6); ok {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) > 0 {
			ring = append(ring, datapath.FlowPeer{Name: name, Addresses: addrs})
		}
	}
	return ring
}

// Equal reports whether two rings are the same.
func (r FlowRing) Equal(o FlowRing) bool { return slices.EqualFunc(r, o, datapath.FlowPeer.Equal) }

// place sets the node's ring size, next peers and senders; a node not on
// the ring (no address) passes nothing on and takes nothing.
func (r FlowRing) place(info *datapath.NodeInfo) {
	i, ok := slices.BinarySearchFunc(r, info.Name, func(p datapath.FlowPeer, name string) int {
		switch {
		case p.Name < name:
			return -1
		case p.Name > name:
			return 1
		}
		return 0
	})
	if !ok || len(r) < 2 {
		return
	}
	info.FlowRing = len(r)
	for k := 1; k < len(r) && k <= flowPeersSent; k++ {
		info.FlowPeers = append(info.FlowPeers, r[(i+k)%len(r)])
		// The node k before this one has it among its next nodes.
		info.FlowSenders = append(info.FlowSenders, r[(i-k+len(r))%len(r)])
	}
}
