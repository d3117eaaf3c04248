package convert

import (
	"errors"
	"fmt"
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
		// Selected by a BGPAdvertisement and an L2Advertisement: both ways.
		{Metadata: meta("public", map[string]string{"tier": "edge"}), Addresses: []string{"203.0.113.0/28", "2001:db8:113::10-2001:db8:113::1f"}, AvoidBuggyIps: true,
			BgpAdvertisements: []*weirv1.BgpAdvertisement{{AggregationLength: 28, AggregationLengthV6: 124, LocalPreference: 150,
				Communities: []string{"65535:65281", "64512:100"}, Peers: []string{"tor-a"}}},
			L2Advertisement: &weirv1.L2Advertisement{}},
		{Metadata: meta("reserved", nil), Addresses: []string{"198.51.100.10-198.51.100.19"}, ManualOnly: true,
			BgpAdvertisements: []*weirv1.BgpAdvertisement{{NodeSelector: map[string]string{"rack": "r1"}}},
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
		{Metadata: meta("tor-b", nil), Address: "2001:db8:2::1", Asn: 64501, MyAsn: 64512, Port: 1179, EbgpMultihopTtl: 255,
			// BFDProfile/fast, inlined; no echo mode.
			Bfd: &weirv1.BfdProfile{ReceiveIntervalMs: 100, TransmitIntervalMs: 150, DetectMultiplier: 4, MinimumTtl: 250}},
	}
	if diff := cmp.Diff(wantPeers, r.Peers, protocmp.Transform()); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	var notes []string
	for _, n := range r.Notes {
		notes = append(notes, n.Object+" "+n.Field)
	}
	for _, want := range []string{
		"BFDProfile/fast spec.echoMode",
		"BFDProfile/fast spec.echoInterval",
		"IPAddressPool/office-lan ",                                        // its second L2 advertisement, L2Advertisement/office-too
		"L2Advertisement/office-too ",                                      // the second L2 advertisement of office-lan, kept nowhere
		"IPAddressPool/reserved spec.serviceAllocation.namespaceSelectors", // for custom resources only
		"IPAddressPool/unannounced ",
		"BGPPeer/tor-b spec.nodeSelectors",
		"BGPPeer/tor-b spec.passwordSecret",
	} {
		if !slices.Contains(notes, want) {
			t.Errorf("no note on %q; notes:\n%s", want, strings.Join(notes, "\n"))
		}
	}
	if len(notes) != 8 {
		t.Errorf("%d notes, want 8:\n%s", len(notes), strings.Join(notes, "\n"))
	}
}

// TestNamespaceSelectorsAreForCustomResources: MetalLB's namespace
// label selector becomes the custom resource's namespaceSelector; for
// lbctl's documents, whose API registers namespaces without labels, it is
// a note.
func TestNamespaceSelectorsAreForCustomResources(t *testing.T) {
	in := "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\nspec:\n  addresses: [10.0.0.0/24]\n  serviceAllocation:\n    namespaceSelectors:\n    - matchLabels: {tenant: a}\n"
	r, err := Convert(in, Options{CustomResources: true, Namespace: "weir-system"})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Pools[0].GetServiceAllocation().GetNamespaceSelector(); got["tenant"] != "a" || hasNote(r, "IPAddressPool/p", "spec.serviceAllocation.namespaceSelectors") {
		t.Errorf("custom resources: namespace selector %v, notes %q", got, notesOf(r))
	}
	crds, err := r.CustomResources("weir-system")
	if err != nil || !strings.Contains(crds, "namespaceSelector:\n      tenant: a") {
		t.Errorf("custom resources %s (%v); want a namespaceSelector", crds, err)
	}
	if r, err = FromMetalLB(in); err != nil || r.Pools[0].GetServiceAllocation().GetNamespaceSelector() != nil ||
		!hasNote(r, "IPAddressPool/p", "spec.serviceAllocation.namespaceSelectors") {
		t.Errorf("lbctl's documents: %v, notes %q (%v)", r.Pools, notesOf(r), err)
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

// TestAKeySaidTwiceIsRefused: YAML lets a mapping say a key twice and
// readers keep the last; a pool whose addresses are said twice, the
// second time all of IPv4, is refused, naming the document, the key and
// its line, wherever the mapping is.
func TestAKeySaidTwiceIsRefused(t *testing.T) {
	pool := "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: ok\nspec:\n  addresses: [192.0.2.0/28]\n---\n"
	for name, tc := range map[string]struct{ doc, want string }{
		// The second document's lines are the input's, from 8.
		"in the spec": {pool + "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: public\nspec:\n  addresses: [203.0.113.0/28]\n  addresses: [0.0.0.0/0]\n",
			`document 2: yaml: unmarshal errors: line 14: key "addresses" already set in map`},
		"at the top": {pool + "apiVersion: metallb.io/v1beta1\nkind: BGPPeer\nkind: IPAddressPool\nmetadata:\n  name: p\n",
			`document 2: yaml: unmarshal errors: line 10: key "kind" already set in map`},
		"in a list's mapping": {pool + "apiVersion: metallb.io/v1beta1\nkind: Community\nmetadata:\n  name: c\nspec:\n  communities:\n  - name: a\n    value: 64512:1\n    value: 64512:2\n",
			`document 2: yaml: unmarshal errors: line 16: key "value" already set in map`},
		"in the first document": {"apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: public\n  name: other\n",
			`document 1: yaml: unmarshal errors: line 5: key "name" already set in map`},
	} {
		_, err := FromMetalLB(tc.doc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", name, err, tc.want)
		}
	}
}

// TestTwoObjectsOfOneNameAreRefused: two objects of one kind and one name
// (in one namespace or not: MetalLB reads one, advertisements name pools
// without it, and Weir's pools and peers have none) are refused, naming
// both documents; so is a community name that two Communities define.
func TestTwoObjectsOfOneNameAreRefused(t *testing.T) {
	obj := func(kind, ns, name, spec string) string {
		return fmt.Sprintf("apiVersion: metallb.io/v1beta1\nkind: %s\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n%s---\n", kind, name, ns, spec)
	}
	pool := func(ns, addrs string) string { return obj("IPAddressPool", ns, "public", "  addresses: ["+addrs+"]\n") }
	for name, tc := range map[string]struct{ in, want string }{
		"two pools": {pool("metallb-system", "203.0.113.0/28") + pool("metallb-system", "0.0.0.0/0"),
			"document 2 (IPAddressPool metallb-system/public): the kind and name of document 1 (IPAddressPool metallb-system/public)"},
		"two pools in two namespaces": {pool("metallb-system", "203.0.113.0/28") + obj("BGPPeer", "metallb-system", "public", "  peerAddress: 192.0.2.1\n") + pool("other", "0.0.0.0/0"),
			"document 3 (IPAddressPool other/public): the kind and name of document 1 (IPAddressPool metallb-system/public)"},
		"two peers": {obj("BGPPeer", "metallb-system", "tor", "  peerAddress: 192.0.2.1\n") + obj("BGPPeer", "metallb-system", "tor", "  peerAddress: 192.0.2.66\n"),
			"document 2 (BGPPeer metallb-system/tor): the kind and name of document 1 (BGPPeer metallb-system/tor)"},
		"two advertisements": {obj("L2Advertisement", "metallb-system", "a", "  ipAddressPools: [x]\n") + obj("L2Advertisement", "metallb-system", "a", "  ipAddressPools: [y]\n"),
			"document 2 (L2Advertisement metallb-system/a): the kind and name of document 1 (L2Advertisement metallb-system/a)"},
		"a community defined twice": {obj("Community", "metallb-system", "c1", "  communities:\n  - {name: no-export, value: '65535:65281'}\n") +
			obj("Community", "metallb-system", "c2", "  communities:\n  - {name: no-export, value: '64512:1'}\n"),
			`document 2 (Community metallb-system/c2): spec.communities: "no-export" is defined by document 1 (Community metallb-system/c1) too`},
	} {
		_, err := FromMetalLB(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", name, err, tc.want)
		}
	}
	// One name in two kinds is two objects.
	if _, err := FromMetalLB(pool("metallb-system", "203.0.113.0/28") + obj("BGPAdvertisement", "metallb-system", "public", "  ipAddressPools: [public]\n")); err != nil {
		t.Errorf("a pool and an advertisement of one name: %v", err)
	}
}

// TestTheInputIsBounded: past MaxInputBytes or MaxDocuments the input is
// refused, saying so, before anything of it is converted.
func TestTheInputIsBounded(t *testing.T) {
	pool := "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\nspec:\n  addresses: [192.0.2.0/28]\n---\n"
	big := pool + "# " + strings.Repeat("x", MaxInputBytes) + "\n"
	if _, err := FromMetalLB(big); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 32 MiB") {
		t.Errorf("%d bytes: error %v, want %v saying more than 32 MiB", len(big), err, ErrTooLarge)
	}
	many := strings.Repeat(pool, MaxDocuments+1)
	if _, err := FromMetalLB(many); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "100001 documents, more than 100000") {
		t.Errorf("%d documents: error %v, want %v saying more than 100000 documents", MaxDocuments+1, err, ErrTooLarge)
	}
}

// manyPools is n pools, each with a BGP advertisement that names it.
func manyPools(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: pool%d\nspec:\n  addresses: [10.%d.%d.0/24]\n---\n", i, i/256, i%256)
	}
	for i := range n {
		fmt.Fprintf(&b, "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata:\n  name: ad%d\nspec:\n  ipAddressPools: [pool%d]\n  localPref: %d\n---\n", i, i, i+1)
	}
	return b.String()
}

// 10,000 pools and 10,000 advertisements (each naming its pool): each
// pool gets its own advertisement.
func TestTenThousandPoolsEachGetTheirOwnAdvertisement(t *testing.T) {
	r, err := FromMetalLB(manyPools(10_000))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pools) != 10_000 || len(r.Notes) != 0 {
		t.Fatalf("%d pools, %d notes; want 10000 pools, no notes", len(r.Pools), len(r.Notes))
	}
	for i, p := range r.Pools {
		if got := p.GetBgpAdvertisement().GetLocalPreference(); got != uint32(i+1) {
			t.Fatalf("pool %s: local preference %d, want %d (its own advertisement's)", p.GetMetadata().GetName(), got, i+1)
		}
	}
}

// The conversion's cost grows with the input, not with pools times
// advertisements: go test -bench FromMetalLB ./lbctl/convert (10,000 of
// each, about 0.6 s of CPU a run, most of it reading YAML; 7.4 s when
// every pool scanned every advertisement).
func BenchmarkFromMetalLB10kPools(b *testing.B) {
	in := manyPools(10_000)
	for b.Loop() {
		if _, err := FromMetalLB(in); err != nil {
			b.Fatal(err)
		}
	}
}
