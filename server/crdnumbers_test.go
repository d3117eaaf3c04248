package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/weirlb/weir/internal/bgpcommunity"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/servertest"
)

// TestCustomResourcesTakeEveryNumberTheProtocolHas: a WeirBGPPeer takes
// 4-byte ASNs (RFC 6793; RFC 6996's private range is where a fabric's
// per-rack ASNs live) and a WeirAddressPool a 32-bit local preference, and
// reads them back the same; the apiserver refuses, naming the field, a
// number BGP cannot carry, ASN 0 (RFC 7607) and AS_TRANS.
func TestCustomResourcesTakeEveryNumberTheProtocolHas(t *testing.T) {
	_, _, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	peer := func(name, asn, myASN string) string {
		return "apiVersion: weir.dev/v1alpha1\nkind: WeirBGPPeer\nmetadata:\n  name: " + name + "\nspec:\n  address: 192.0.2.1\n  asn: " + asn + "\n  myASN: " + myASN + "\n"
	}
	pool := func(name, localPref string) string {
		return "apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: " + name + "\nspec:\n  addresses: [203.0.113.0/28]\n  bgpAdvertisement:\n    localPreference: " + localPref + "\n"
	}

	if err := createDoc(t, ctx, dyn, v1alpha1.BGPPeers, peer("rack-1", "4200000100", "4200000001"), false); err != nil {
		t.Fatalf("a peer with 4-byte ASNs: %v", err)
	}
	if err := createDoc(t, ctx, dyn, v1alpha1.AddressPools, pool("preferred", "4000000000"), false); err != nil {
		t.Fatalf("a pool with local preference 4000000000: %v", err)
	}
	u, err := dyn.Resource(v1alpha1.BGPPeers).Get(ctx, "rack-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var p v1alpha1.WeirBGPPeer
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.ASN != 4200000100 || p.Spec.MyASN != 4200000001 {
		t.Errorf("peer read back with asn %d, myASN %d; want 4200000100, 4200000001", p.Spec.ASN, p.Spec.MyASN)
	}
	u, err = dyn.Resource(v1alpha1.AddressPools).Get(ctx, "preferred", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ap v1alpha1.WeirAddressPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ap); err != nil {
		t.Fatal(err)
	}
	if got := ap.Spec.BGPAdvertisement.LocalPreference; got != 4000000000 {
		t.Errorf("pool read back with localPreference %d; want 4000000000", got)
	}

	for _, tc := range []struct {
		doc, field, says string
	}{
		{peer("asn-zero", "0", "64512"), "spec.asn", ""},
		{peer("asn-wide", "4294967296", "64512"), "spec.asn", ""},
		{peer("asn-negative", "-1", "64512"), "spec.asn", ""},
		{peer("asn-trans", "23456", "64512"), "spec.asn", "AS_TRANS"},
		{peer("my-asn-zero", "64500", "0"), "spec.myASN", ""},
		{peer("my-asn-wide", "64500", "4294967296"), "spec.myASN", ""},
		{peer("my-asn-negative", "64500", "-1"), "spec.myASN", ""},
		{peer("my-asn-trans", "64500", "23456"), "spec.myASN", "AS_TRANS"},
		{pool("pref-wide", "4294967296"), "spec.bgpAdvertisement.localPreference", ""},
		{pool("pref-negative", "-1"), "spec.bgpAdvertisement.localPreference", ""},
	} {
		err := createDoc(t, ctx, dyn, resourceOf(tc.doc), tc.doc, true)
		if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v; want a refusal naming %s %s", nameOf(tc.doc), err, tc.field, tc.says)
		}
	}
	// The widest numbers still fit.
	for _, doc := range []string{peer("asn-widest", "4294967295", "4294967295"), pool("pref-widest", "4294967295")} {
		if err := createDoc(t, ctx, dyn, resourceOf(doc), doc, true); err != nil {
			t.Errorf("%s: %v", nameOf(doc), err)
		}
	}
}

// TestCustomResourcesTakeTheCommunitiesTheServerTakes walks community
// spellings through the CRD's schema on a real apiserver and through the
// server's parser: each must be taken by both or refused by both, so that
// kubectl refuses at once what the server would refuse later.
func TestCustomResourcesTakeTheCommunitiesTheServerTakes(t *testing.T) {
	_, _, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	for i, c := range []string{
		"64512:100", "0:0", "65535:65535", "65536:1", "70000:1", "1:65536", "1:99999", "1:", ":1", "1", "1:2:3", "-1:2", "+1:2", " 1:2", "1:2 ",
		"01:2", "1:02", "no-export", "no-advertise", "no-export-subconfed", "no-peer", "NO-EXPORT", "no-exports", "local-as", "blackhole",
		"large:64512:1:2", "large:4200000001:4294967295:0", "large:4294967296:1:2", "large:1:4294967296:2", "large:1:2:4294967296",
		"large:1:2", "large:1:2:3:4", "large:-1:2:3", "large::1:2", "LARGE:1:2:3", "large:01:2:3", "large:99999999999:1:2",
		"large:no-export", "",
	} {
		_, perr := bgpcommunity.Parse(c)
		doc := fmt.Sprintf("apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: c%d\nspec:\n  addresses: [203.0.113.0/28]\n  bgpAdvertisement:\n    communities: [%q]\n", i, c)
		cerr := createDoc(t, ctx, dyn, v1alpha1.AddressPools, doc, true)
		if (perr == nil) != (cerr == nil) {
			t.Errorf("community %q: the server's parser says %v, the CRD %v", c, perr, cerr)
		}
		if cerr != nil && !strings.Contains(cerr.Error(), "spec.bgpAdvertisement.communities[0]") {
			t.Errorf("community %q: refused with %v; want the entry named", c, cerr)
		}
	}
}

// resourceOf is the resource a document's kind is stored as.
func resourceOf(doc string) schema.GroupVersionResource {
	if strings.Contains(doc, "kind: WeirBGPPeer") {
		return v1alpha1.BGPPeers
	}
	return v1alpha1.AddressPools
}

// nameOf is a document's metadata.name.
func nameOf(doc string) string {
	name, _, _ := strings.Cut(strings.SplitN(doc, "name: ", 2)[1], "\n")
	return name
}

// TestTheAPITakesEveryNumberTheProtocolHas: the native API takes 4-byte
// ASNs, a 32-bit local preference and large communities beside standard
// ones, and gives them back as written; it refuses AS_TRANS and a
// community BGP cannot carry with InvalidArgument naming the field.
func TestTheAPITakesEveryNumberTheProtocolHas(t *testing.T) {
	ts := servertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	peer := func(name string, asn, myASN uint32) *weirv1.BgpPeer {
		return &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: name}, Address: "192.0.2.1", Asn: asn, MyAsn: myASN}
	}
	if _, err := ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer("rack-1", 4200000100, 4200000001)}); err != nil {
		t.Fatal(err)
	}
	got, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "rack-1"})
	if err != nil {
		t.Fatal(err)
	}
	if p := got.GetBgpPeer(); p.GetAsn() != 4200000100 || p.GetMyAsn() != 4200000001 {
		t.Errorf("peer read back with asn %d, my_asn %d", p.GetAsn(), p.GetMyAsn())
	}
	_, err = ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer("trans", 23456, 64512)})
	wantInvalid(t, "asn 23456", err, "bgp_peer.asn", "AS_TRANS")
	_, err = ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer("my-trans", 64500, 23456)})
	wantInvalid(t, "my_asn 23456", err, "bgp_peer.my_asn", "AS_TRANS")

	communities := []string{"64512:100", "no-export", "large:4200000001:4294967295:0"}
	pool := func(name string, communities ...string) *weirv1.AddressPool {
		return &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: name}, Addresses: []string{"203.0.113.0/28"},
			BgpAdvertisement: &weirv1.BgpAdvertisement{Communities: communities, LocalPreference: 4000000000}}
	}
	if _, err := ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: pool("public", communities...)}); err != nil {
		t.Fatal(err)
	}
	gotPool, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "public"})
	if err != nil {
		t.Fatal(err)
	}
	if adv := gotPool.GetAddressPool().GetBgpAdvertisement(); !slices.Equal(adv.GetCommunities(), communities) || adv.GetLocalPreference() != 4000000000 {
		t.Errorf("pool read back with communities %q, local preference %d", adv.GetCommunities(), adv.GetLocalPreference())
	}
	for _, bad := range []string{"70000:1", "large:1:2", "large:4294967296:1:2"} {
		_, err := ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: pool("bad", "64512:1", bad)})
		wantInvalid(t, bad, err, "address_pool.bgp_advertisement.communities[1]", bad)
	}
}
