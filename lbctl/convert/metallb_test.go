package convert

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// TestEveryKindMapsOrIsNamed: the example covers every MetalLB kind; each
// object becomes Weir's equivalent, and what has none is in a note naming
// the object and the field.
func TestEveryKindMapsOrIsNamed(t *testing.T) {
	data, err := os.ReadFile("testdata/metallb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := FromMetalLB(string(data))
	if err != nil {
		t.Fatal(err)
	}
	meta := func(name string, labels map[string]string) *weirv1.ObjectMeta {
		return &weirv1.ObjectMeta{Name: name, Labels: labels}
	}
	wantPools := []*weirv1.AddressPool{
		{Metadata: meta("public", map[string]string{"tier": "edge"}), Addresses: []string{"203.0.113.0/28", "2001:db8:113::10-2001:db8:113::1f"},
			BgpAdvertisement: &weirv1.BgpAdvertisement{AggregationLength: 28, AggregationLengthV6: 124, LocalPreference: 150,
				Communities: []string{"65535:65281", "64512:100"}, Peers: []string{"tor-a"}}},
		{Metadata: meta("reserved", nil), Addresses: []string{"198.51.100.10-198.51.100.19"}, ManualOnly: true,
			BgpAdvertisement:  &weirv1.BgpAdvertisement{},
			ServiceAllocation: &weirv1.ServiceAllocation{Priority: 10, Namespaces: []string{"payments"}}},
		{Metadata: meta("office-lan", nil), Addresses: []string{"192.0.2.200-192.0.2.209"},
			L2Advertisement: &weirv1.L2Advertisement{Interfaces: []string{"eth1"}, NodeSelector: map[string]string{"l2": "yes"}}},
		{Metadata: meta("unannounced", nil), Addresses: []string{"198.51.100.128/28"}},
	}
	if diff := cmp.Diff(wantPools, r.Pools, protocmp.Transform()); diff != "" {
		t.Errorf("pools (-want +got):\n%s", diff)
	}
	wantPeers := []*weirv1.BgpPeer{
		{Metadata: meta("tor-a", nil), Address: "192.0.2.1", Asn: 64500, MyAsn: 64512, HoldTimeSeconds: 90, Password: "s3cret",
			GracefulRestart: true, NodeSelector: map[string]string{"rack": "r1"}},
		{Metadata: meta("tor-b", nil), Address: "2001:db8:2::1", Asn: 64501, MyAsn: 64512, Port: 1179},
	}
	if diff := cmp.Diff(wantPeers, r.Peers, protocmp.Transform()); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	var notes []string
	for _, n := range r.Notes {
		notes = append(notes, n.Object+" "+n.Field)
	}
	for _, want := range []string{
		"BFDProfile/fast ",
		"IPAddressPool/public spec.avoidBuggyIPs",
		"IPAddressPool/public ", // the second advertisement, L2Advertisement/edge-too
		"BGPAdvertisement/edge spec.communities",
		"IPAddressPool/reserved spec.serviceAllocation.namespaceSelectors",
		"BGPAdvertisement/reserved-routes spec.nodeSelectors",
		"IPAddressPool/unannounced ",
		"BGPPeer/tor-b spec.nodeSelectors",
		"BGPPeer/tor-b spec.bfdProfile",
		"BGPPeer/tor-b spec.ebgpMultiHop",
		"BGPPeer/tor-b spec.passwordSecret",
	} {
		if !slices.Contains(notes, want) {
			t.Errorf("no note on %q; notes:\n%s", want, strings.Join(notes, "\n"))
		}
	}
	if len(notes) != 11 {
		t.Errorf("%d notes, want 11:\n%s", len(notes), strings.Join(notes, "\n"))
	}
}

func TestBadInputIsRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"not YAML":         "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nspec: [",
		"a bad field type": "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\nspec:\n  addresses: 10.0.0.0/8\n",
		"an unknown selector operator": "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\nspec:\n  addresses: [10.0.0.0/8]\n---\n" +
			"apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: a\nspec:\n  ipAddressPoolSelectors:\n  - matchExpressions:\n    - {key: a, operator: Near}\n",
	} {
		if _, err := FromMetalLB(doc); err == nil {
			t.Errorf("%s: converted without error", name)
		}
	}
}
