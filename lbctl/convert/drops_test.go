package convert

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// notesOf is r's notes as "Kind/name field" lines.
func notesOf(r *Result) []string {
	var out []string
	for _, n := range r.Notes {
		out = append(out, n.Object+" "+n.Field)
	}
	return out
}

// hasNote tells whether r has a note on object naming field (or, field
// "", the whole object).
func hasNote(r *Result, object, field string) bool {
	for _, n := range r.Notes {
		if n.Object == object && n.Field == field {
			return true
		}
	}
	return false
}

const poolDoc = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: first-pool\n  namespace: metallb-system\nspec:\n  addresses: [192.168.10.0/24]\n---\n"

// TestNothingIsDroppedSilently: each MetalLB field Weir does not carry
// over whole, and a field MetalLB does not have, is a note naming the
// object and the field's path.
func TestNothingIsDroppedSilently(t *testing.T) {
	// object, field: the note; field "" for the object left out.
	for name, tc := range map[string]struct{ in, object, field string }{
		"a made-up field": {poolDoc + "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\nspec:\n  addresses: [10.0.0.0/24]\n  bogus: 1\n",
			"IPAddressPool/p", "spec.bogus"},
		"a made-up field in a selector": {poolDoc + "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: a\nspec:\n  ipAddressPools: [first-pool]\n  nodeSelectors:\n  - matchLabels: {a: b}\n    matchLabelz: {c: d}\n",
			"L2Advertisement/a", "spec.nodeSelectors[0].matchLabelz"},
		"a made-up top-level field": {"apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\nspec:\n  addresses: [10.0.0.0/24]\nspecs:\n  autoAssign: false\n",
			"IPAddressPool/p", "specs"},
		"BGPAdvertisement serviceSelectors with expressions": {poolDoc + "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata:\n  name: a\nspec:\n  ipAddressPools: [first-pool]\n  serviceSelectors:\n  - matchExpressions: [{key: env, operator: Exists}]\n",
			"BGPAdvertisement/a", "spec.serviceSelectors"},
		"L2Advertisement serviceSelectors, two of them": {poolDoc + "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: a\nspec:\n  ipAddressPools: [first-pool]\n  serviceSelectors:\n  - matchLabels: {environment: production}\n  - matchLabels: {environment: staging}\n",
			"L2Advertisement/a", "spec.serviceSelectors"},
		"L2Advertisement preferredNodeSelectors": {poolDoc + "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: a\nspec:\n  ipAddressPools: [first-pool]\n  preferredNodeSelectors:\n  - weight: 100\n    preference:\n      matchLabels: {zone: a}\n",
			"L2Advertisement/a", "spec.preferredNodeSelectors"},
		"BGPPeer dualStackAddressFamily false": {"apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: p\nspec:\n  myASN: 64512\n  peerASN: 64513\n  peerAddress: 192.0.2.1\n  dualStackAddressFamily: false\n",
			"BGPPeer/p", "spec.dualStackAddressFamily"},
		"a BGPPeer in a Kubernetes List": {"apiVersion: v1\nkind: List\nitems:\n- apiVersion: metallb.io/v1beta2\n  kind: BGPPeer\n  metadata:\n    name: p\n  spec:\n    myASN: 64512\n    peerASN: 64513\n    peerAddress: 192.0.2.1\n    bfdProfile: fast\n",
			"BGPPeer/p", "spec.bfdProfile"},
		"a BGPPeer in a VRF with a BFDProfile": {"apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata:\n  name: fast\nspec:\n  receiveInterval: 100\n---\n" +
			"apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: p\nspec:\n  myASN: 64512\n  peerASN: 64513\n  peerAddress: 192.0.2.1\n  vrf: red\n  bfdProfile: fast\n",
			"BGPPeer/p", "spec.bfdProfile"},
	} {
		r, err := FromMetalLB(tc.in)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !hasNote(r, tc.object, tc.field) {
			t.Errorf("%s: no note on %s %s; notes: %q", name, tc.object, tc.field, notesOf(r))
		}
	}
}

// TestLocalASNIsTheSessionsASN: MetalLB's localASN is the AS a node says
// to this one peer, which is what a Weir BgpPeer's my_asn is.
func TestLocalASNIsTheSessionsASN(t *testing.T) {
	r, err := FromMetalLB("apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: p\nspec:\n  myASN: 64512\n  localASN: 4200000001\n  peerASN: 64513\n  peerAddress: 192.0.2.1\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Peers) != 1 || r.Peers[0].GetMyAsn() != 4200000001 {
		t.Errorf("peers %v; want one with my_asn 4200000001 (the localASN)", r.Peers)
	}
}

// TestAPoolSplitByServiceSelectors: MetalLB's own example of one pool
// announced two ways by service labels becomes one pool with two
// advertisements, each with its service selector and attributes, and no
// note; several selectors in one list become one advertisement each.
func TestAPoolSplitByServiceSelectors(t *testing.T) {
	ad := func(name, pref, env string) string {
		return "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata:\n  name: " + name + "\n  namespace: metallb-system\nspec:\n  ipAddressPools:\n  - first-pool\n  localPref: " + pref +
			"\n  serviceSelectors:\n  - matchLabels:\n      environment: " + env + "\n---\n"
	}
	r, err := FromMetalLB(poolDoc + ad("production-services", "200", "production") + ad("staging-services", "100", "staging"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Notes) != 0 {
		t.Errorf("notes %q; want none", notesOf(r))
	}
	want := []*weirv1.AddressPool{{Metadata: &weirv1.ObjectMeta{Name: "first-pool"}, Addresses: []string{"192.168.10.0/24"},
		BgpAdvertisements: []*weirv1.BgpAdvertisement{
			{LocalPreference: 200, ServiceSelector: map[string]string{"environment": "production"}},
			{LocalPreference: 100, ServiceSelector: map[string]string{"environment": "staging"}},
		}}}
	if diff := cmp.Diff(want, r.Pools, protocmp.Transform()); diff != "" {
		t.Errorf("pools (-want +got):\n%s", diff)
	}
	// One advertisement whose selectors list two nodes' labels and two
	// services': four Weir advertisements, one per pair.
	r, err = FromMetalLB(poolDoc + "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata:\n  name: a\nspec:\n  communities: [\"64512:7\"]\n" +
		"  nodeSelectors:\n  - matchLabels: {rack: r1}\n  - matchLabels: {rack: r2}\n  serviceSelectors:\n  - matchLabels: {env: prod}\n  - matchLabels: {env: dev}\n")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range r.Pools[0].GetBgpAdvertisements() {
		got = append(got, fmt.Sprint(a.GetNodeSelector(), a.GetServiceSelector(), a.GetCommunities()))
	}
	wantPairs := []string{"map[rack:r1] map[env:prod] [64512:7]", "map[rack:r1] map[env:dev] [64512:7]", "map[rack:r2] map[env:prod] [64512:7]", "map[rack:r2] map[env:dev] [64512:7]"}
	if diff := cmp.Diff(wantPairs, got); diff != "" || len(r.Notes) != 0 {
		t.Errorf("advertisements (-want +got):\n%s\nnotes %q", diff, notesOf(r))
	}
}

// TestAKubectlListIsItsObjects: kubectl get -o yaml of several kinds is
// one List (kind List, or KindList); its items are converted as if each
// were a document, in order.
func TestAKubectlListIsItsObjects(t *testing.T) {
	in := `apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: metallb.io/v1beta1
  kind: IPAddressPool
  metadata:
    name: first-pool
    namespace: metallb-system
    uid: 4bd7a1f0-0000-4000-8000-000000000001
    resourceVersion: "1234"
    creationTimestamp: "2026-01-01T00:00:00Z"
    generation: 1
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: '{}'
  spec:
    addresses: [192.168.10.0/24]
    autoAssign: true
    avoidBuggyIPs: false
  status:
    assignedIPv4: 1
- apiVersion: metallb.io/v1beta1
  kind: BGPAdvertisement
  metadata:
    name: ad
    namespace: metallb-system
  spec:
    ipAddressPools: [first-pool]
    localPref: 150
---
apiVersion: metallb.io/v1beta2
kind: BGPPeerList
items:
- apiVersion: metallb.io/v1beta2
  kind: BGPPeer
  metadata:
    name: tor
  spec:
    myASN: 64512
    peerASN: 64513
    peerAddress: 192.0.2.1
`
	r, err := FromMetalLB(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pools) != 1 || r.Pools[0].GetBgpAdvertisement().GetLocalPreference() != 150 {
		t.Errorf("pools %v; want first-pool advertised with local preference 150", r.Pools)
	}
	if len(r.Peers) != 1 || r.Peers[0].GetAddress() != "192.0.2.1" {
		t.Errorf("peers %v; want tor", r.Peers)
	}
	if len(r.Notes) != 0 {
		t.Errorf("notes %q; want none (the apiserver's bookkeeping and status are no configuration)", notesOf(r))
	}
}

// TestCommunitiesAreCarriedVerbatim: standard and large communities, as
// values or by a Community's name, are the advertisement's communities as
// MetalLB spells them; a name no Community defines is noted.
func TestCommunitiesAreCarriedVerbatim(t *testing.T) {
	in := poolDoc + `apiVersion: metallb.io/v1beta1
kind: Community
metadata:
  name: aliases
spec:
  communities:
  - name: big
    value: large:4200000001:1:2
  - name: no-export
    value: "65535:65281"
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata:
  name: a
spec:
  ipAddressPools: [first-pool]
  communities: [big, no-export, "large:64512:7:8", "64512:100", undefined]
`
	r, err := FromMetalLB(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"large:4200000001:1:2", "65535:65281", "large:64512:7:8", "64512:100"}
	if got := r.Pools[0].GetBgpAdvertisement().GetCommunities(); !slices.Equal(got, want) {
		t.Errorf("communities %q, want %q", got, want)
	}
	if len(r.Notes) != 1 || r.Notes[0].Object != "BGPAdvertisement/a" || r.Notes[0].Field != "spec.communities[4]" {
		t.Errorf("notes %q; want one on spec.communities[4], the undefined name", notesOf(r))
	}
}
