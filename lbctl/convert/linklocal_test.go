package convert

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// TestUnnumberedDynamicAndVRFPeersCarryOver: MetalLB's unnumbered peer (an
// interface, no address), its dynamicASN and its vrf become the BgpPeer's
// interface, dynamic_asn and vrf, with no note.
func TestUnnumberedDynamicAndVRFPeersCarryOver(t *testing.T) {
	r, err := FromMetalLB("apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: unnumbered\nspec:\n  myASN: 64512\n  dynamicASN: external\n  interface: eth1\n  vrf: red\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []*weirv1.BgpPeer{{Metadata: &weirv1.ObjectMeta{Name: "unnumbered"}, Interface: "eth1", DynamicAsn: "external", MyAsn: 64512, Vrf: "red"}}
	if d := cmp.Diff(want, r.Peers, protocmp.Transform()); d != "" {
		t.Errorf("peers (-want +got):\n%s", d)
	}
	if len(r.Notes) != 0 {
		t.Errorf("notes %q; want none", notesOf(r))
	}
}
