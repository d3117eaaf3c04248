package nodestate

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// TestFlowRingNamesTheNextNodes: every node with an address is on the
// ring, in name order, drained and deleting ones included (they still
// serve what they hold); each node is told the ring's size and its next
// three nodes, wrapping round; a node without an address is not on it and
// passes nothing on.
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
	next := func(name string) (int, []string) {
		var ring int
		var peers []string
		reg.Read(func(v registry.View) {
			info := Node(v, name)
			ring = info.FlowRing
			for _, p := range info.FlowPeers {
				peers = append(peers, p.Name)
				if len(p.Addresses) != 2 {
					t.Errorf("%s's peer %s: addresses %v, want one per family", name, p.Name, p.Addresses)
				}
			}
		})
		return ring, peers
	}
	for name, want := range map[string][]string{
		"node-a": {"node-b", "node-c", "node-d"},
		"node-d": {"node-e", "node-a", "node-b"},
		"node-e": {"node-a", "node-b", "node-c"},
	} {
		ring, peers := next(name)
		if ring != 5 {
			t.Errorf("%s: ring of %d, want 5", name, ring)
		}
		if diff := cmp.Diff(want, peers); diff != "" {
			t.Errorf("%s's next nodes (-want +got):\n%s", name, diff)
		}
	}
	if ring, peers := next("bare"); ring != 0 || peers != nil {
		t.Errorf("a node without an address: ring %d, peers %v", ring, peers)
	}
}
