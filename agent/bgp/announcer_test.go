package bgp

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpspeaker"
)

// failingSpeaker refuses peer sets until told otherwise and records the
// last one it took.
type failingSpeaker struct {
	fail  bool
	peers []Peer
}

func (f *failingSpeaker) Announce(context.Context, netip.Prefix, Announcement) error { return nil }
func (f *failingSpeaker) Withdraw(context.Context, netip.Prefix, Announcement) error { return nil }
func (f *failingSpeaker) Sessions(context.Context) ([]bgpspeaker.Session, error)     { return nil, nil }
func (f *failingSpeaker) Close()                                                     {}
func (f *failingSpeaker) SetPeers(_ context.Context, peers []Peer) error {
	if f.fail {
		return errors.New("peer refused")
	}
	f.peers = peers
	return nil
}

func TestPeersThatFailAreRetried(t *testing.T) {
	sp := &failingSpeaker{fail: true}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	router := datapath.BGPPeer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64512}
	a.Received(datapath.NodeState{Node: datapath.NodeInfo{BGPPeers: []datapath.BGPPeer{router}}})
	if sp.peers != nil {
		t.Fatal("a refused peer set was recorded")
	}
	a.Report(false) // still refused
	sp.fail = false
	a.Report(false)
	if len(sp.peers) != 1 || sp.peers[0].Address != router.Address || sp.peers[0].MyASN != 64512 {
		t.Errorf("after the retry the speaker has %+v; want the router", sp.peers)
	}
}
