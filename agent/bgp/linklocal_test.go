package bgp

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpnumbers"
)

// A link-local router reaches the speaker with its interface as the
// address's zone (the form the kernel dials), an unnumbered one with its
// interface alone; a dynamic AS and a VRF as the server sent them.
func TestLinkLocalPeersReachTheSpeakerZoned(t *testing.T) {
	sp := &failingSpeaker{}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	a.Received(datapath.NodeState{Node: datapath.NodeInfo{BGPPeers: []datapath.BGPPeer{
		{Address: netip.MustParseAddr("fe80::1"), Interface: "eth0", ASN: 64500, MyASN: 64512, VRF: "red"},
		{Interface: "eth1", DynamicASN: bgpnumbers.External, MyASN: 64512},
	}}})
	a.Applied(0)
	want := []Peer{
		{Address: netip.MustParseAddr("fe80::1%eth0"), ASN: 64500, MyASN: 64512, VRF: "red"},
		{Interface: "eth1", DynamicASN: bgpnumbers.External, MyASN: 64512},
	}
	if diff := cmp.Diff(want, sp.peers, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("the speaker's peers (-want +got):\n%s", diff)
	}
}
