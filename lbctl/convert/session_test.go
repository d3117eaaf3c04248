package convert

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// TestAFabricsSessionOptionsCarryOver: MetalLB's ebgpMultiHop (FRR's
// ebgp-multihop, TTL 255), sourceAddress, keepaliveTime and connectTime
// become the BgpPeer's own fields; routerID, which Weir sets per node and
// not per peer, is a note; a time that is no duration is a note and left
// to Weir's default.
func TestAFabricsSessionOptionsCarryOver(t *testing.T) {
	r, err := FromMetalLB("apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: rr\nspec:\n  myASN: 64512\n  peerASN: 64513\n" +
		"  peerAddress: 198.51.100.1\n  ebgpMultiHop: true\n  sourceAddress: 192.0.2.11\n  holdTime: 30s\n  keepaliveTime: 10s\n  connectTime: 5s\n" +
		"  routerID: 10.0.0.1\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []*weirv1.BgpPeer{{Metadata: &weirv1.ObjectMeta{Name: "rr"}, Address: "198.51.100.1", Asn: 64513, MyAsn: 64512,
		EbgpMultihopTtl: 255, SourceAddress: "192.0.2.11", HoldTimeSeconds: 30, KeepaliveSeconds: 10, ConnectRetrySeconds: 5}}
	if diff := cmp.Diff(want, r.Peers, protocmp.Transform()); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	if notes := notesOf(r); !cmp.Equal(notes, []string{"BGPPeer/rr spec.routerID"}) {
		t.Errorf("notes %q; want only spec.routerID", notes)
	}
	crds, err := r.CustomResources("weir-system")
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"ebgpMultihopTTL: 255", "sourceAddress: 192.0.2.11", "keepaliveSeconds: 10", "connectRetrySeconds: 5"} {
		if !strings.Contains(crds, "\n  "+field+"\n") {
			t.Errorf("--to crds: no %q in\n%s", field, crds)
		}
	}

	r, err = FromMetalLB("apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: rr\nspec:\n  myASN: 64512\n  peerASN: 64513\n" +
		"  peerAddress: 198.51.100.1\n  ebgpMultiHop: false\n  keepaliveTime: soon\n  connectTime: -5s\n")
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Peers[0]; p.GetEbgpMultihopTtl() != 0 || p.GetKeepaliveSeconds() != 0 || p.GetConnectRetrySeconds() != 0 {
		t.Errorf("peer %v; want a directly connected one with the default timers", p)
	}
	if notes := notesOf(r); !cmp.Equal(notes, []string{"BGPPeer/rr spec.keepaliveTime", "BGPPeer/rr spec.connectTime"}) {
		t.Errorf("notes %q; want spec.keepaliveTime and spec.connectTime", notes)
	}
}
