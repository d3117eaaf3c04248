package nodestate

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// TestFlowRingNamesTheNextNodes: every node with an address is on the
// ring, in name order, drained and deleting ones included (they still
// serve what they hold); each node is told the ring's size, its next
// three nodes and the three before it (the nodes that have it among
// their next ones: the only senders its tunnel takes), wrapping round; a
// node without an address is not on it and passes nothing on.
func TestFlowRingNamesTheNextNodes(t *testing.T) {
	reg := registrytest.Open(t)
	for i, name := range []string{"node-e", "node-a", "node-d", "node-c", "node-b", "bare"} {
		n := &model.Node{Meta: model.Meta{Name: name}}
		if name != "bare" {
			n.Addresses = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}), netip.MustParseAddr(fmt.Sprintf("2001:db8::%d", 10+i))}
		}
		n.Deleting = name == "node-c"
		if _, err := reg.Nodes.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	next := func(name string) (int, []string, []string) {
		var ring int
		var peers, senders []string
		reg.Read(func(v registry.View) {
			info := Node(v, name)
			ring = info.FlowRing
			for _, p := range info.FlowPeers {
				peers = append(peers, p.Name)
				if len(p.Addresses) != 2 {
					t.Errorf("%s's peer %s: addresses %v, want one per family", name, p.Name, p.Addresses)
				}
			}
			for _, p := range info.FlowSenders {
				senders = append(senders, p.Name)
				if len(p.Addresses) != 2 {
					t.Errorf("%s's sender %s: addresses %v, want one per family", name, p.Name, p.Addresses)
				}
			}
		})
		return ring, peers, senders
	}
	for name, want := range map[string]struct{ next, senders []string }{
		"node-a": {[]string{"node-b", "node-c", "node-d"}, []string{"node-e", "node-d", "node-c"}},
		"node-d": {[]string{"node-e", "node-a", "node-b"}, []string{"node-c", "node-b", "node-a"}},
		"node-e": {[]string{"node-a", "node-b", "node-c"}, []string{"node-d", "node-c", "node-b"}},
	} {
		ring, peers, senders := next(name)
		if ring != 5 {
			t.Errorf("%s: ring of %d, want 5", name, ring)
		}
		if diff := cmp.Diff(want.next, peers); diff != "" {
			t.Errorf("%s's next nodes (-want +got):\n%s", name, diff)
		}
		if diff := cmp.Diff(want.senders, senders); diff != "" {
			t.Errorf("%s's senders (-want +got):\n%s", name, diff)
		}
	}
	if ring, peers, senders := next("bare"); ring != 0 || peers != nil || senders != nil {
		t.Errorf("a node without an address: ring %d, peers %v, senders %v", ring, peers, senders)
	}
}

// TestFlowSendersAreTheNodesThatSendHere: whichever of its next nodes
// are alive, a node sends only to one that has it among its senders.
func TestFlowSendersAreTheNodesThatSendHere(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5, 9} {
		reg := registrytest.Open(t)
		for i := range n {
			if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: fmt.Sprintf("node-%d", i)},
				Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})}}); err != nil {
				t.Fatal(err)
			}
		}
		reg.Read(func(v registry.View) {
			senders := map[string][]string{}
			for i := range n {
				info := Node(v, fmt.Sprintf("node-%d", i))
				for _, p := range info.FlowSenders {
					senders[info.Name] = append(senders[info.Name], p.Name)
				}
			}
			for i := range n {
				from := Node(v, fmt.Sprintf("node-%d", i))
				for _, p := range from.FlowPeers {
					if !slices.Contains(senders[p.Name], from.Name) {
						t.Errorf("ring of %d: %s may send to %s, whose senders are %v", n, from.Name, p.Name, senders[p.Name])
					}
				}
				if len(from.FlowSenders) != len(from.FlowPeers) {
					t.Errorf("ring of %d: %s has %d senders and %d next nodes", n, from.Name, len(from.FlowSenders), len(from.FlowPeers))
				}
			}
		})
	}
}
