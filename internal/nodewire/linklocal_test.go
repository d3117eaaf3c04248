package nodewire

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpnumbers"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// An unnumbered peer (no address), a link-local one with its interface, a
// dynamic AS and a VRF cross the stream as they are; a zone in the
// address (the interface's place) is refused.
func TestNodeRoundTripKeepsLinkLocalPeers(t *testing.T) {
	in := datapath.NodeInfo{Name: "node1", Registered: true, BGPPeers: []datapath.BGPPeer{
		{Name: "unnumbered", Interface: "eth1", DynamicASN: bgpnumbers.External, MyASN: 4200000001, VRF: "red"},
		{Name: "link-local", Address: netip.MustParseAddr("fe80::1"), Interface: "eth2", DynamicASN: bgpnumbers.Internal, MyASN: 64512},
	}}
	out, err := DecodeNode(EncodeNode(in))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("round trip changed the node (-in +out):\n%s", diff)
	}
	bad := &weirv1.NodePeer{Address: "fe80::1%eth0", Interface: "eth0", Asn: 64500, MyAsn: 64512}
	if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", BgpPeers: []*weirv1.NodePeer{bad}}); err == nil || !strings.Contains(err.Error(), "node.bgp_peers[0].address") {
		t.Errorf("a zoned address: %v; want an error naming node.bgp_peers[0].address", err)
	}
}
