package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/servertest"
)

// TestTheAPITakesLinkLocalAndDynamicPeers: an unnumbered peer (an
// interface, no address, with BFD), a link-local peer by address and interface
// (also written with a zone, read back in the canonical form), a dynamic
// AS instead of a fixed one and a VRF are kept; what cannot work is
// refused with InvalidArgument naming the field, and changes nothing.
func TestTheAPITakesLinkLocalAndDynamicPeers(t *testing.T) {
	ts := servertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		written, read *weirv1.BgpPeer
	}{
		{written: &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "unnumbered"}, Interface: "eth1", DynamicAsn: "external", MyAsn: 4200000001,
			Bfd: &weirv1.BfdProfile{ReceiveIntervalMs: 100, TransmitIntervalMs: 100, DetectMultiplier: 3}}},
		{written: &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "link-local"}, Address: "fe80::1", Interface: "eth0", Asn: 64512, MyAsn: 64513, Vrf: "red"}},
		{
			written: &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "zoned"}, Address: "fe80::2%eth2", DynamicAsn: "internal", MyAsn: 64513},
			read:    &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "zoned"}, Address: "fe80::2", Interface: "eth2", DynamicAsn: "internal", MyAsn: 64513},
		},
	} {
		if _, err := ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: tc.written}); err != nil {
			t.Fatalf("%s: %v", tc.written.Metadata.Name, err)
		}
		got, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: tc.written.Metadata.Name})
		if err != nil {
			t.Fatal(err)
		}
		want := tc.read
		if want == nil {
			want = tc.written
		}
		if d := cmp.Diff(want, got.GetBgpPeer(), protocmp.Transform(), ignoreMeta); d != "" {
			t.Errorf("%s read back (-want +read):\n%s", want.Metadata.Name, d)
		}
	}

	linkLocal := func() *weirv1.BgpPeer {
		return &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "bad"}, Address: "fe80::1", Interface: "eth0", Asn: 64512, MyAsn: 64513}
	}
	for _, tc := range []struct {
		what        string
		set         func(*weirv1.BgpPeer)
		field, says string
	}{
		{"no address and no interface", func(p *weirv1.BgpPeer) { p.Address, p.Interface = "", "" }, "address", "interface"},
		{"a link-local address without its interface", func(p *weirv1.BgpPeer) { p.Interface = "" }, "interface", "link-local"},
		{"a zone that is not the interface", func(p *weirv1.BgpPeer) { p.Address = "fe80::1%eth1" }, "interface", "eth1"},
		{"an interface with a global address", func(p *weirv1.BgpPeer) { p.Address = "2001:db8::1" }, "interface", "link-local"},
		{"an interface with an IPv4 address", func(p *weirv1.BgpPeer) { p.Address = "192.0.2.1" }, "interface", "link-local"},
		{"an interface name with a slash", func(p *weirv1.BgpPeer) { p.Interface = "eth/0" }, "interface", "interface name"},
		{"an interface name too long", func(p *weirv1.BgpPeer) { p.Interface = "a-very-long-name0" }, "interface", "interface name"},
		{"a multi-hop link-local session", func(p *weirv1.BgpPeer) { p.EbgpMultihopTtl = 2 }, "ebgp_multihop_ttl", "on the link"},
		{"a source address for a link-local session", func(p *weirv1.BgpPeer) { p.SourceAddress = "2001:db8::7" }, "source_address", "link-local"},
		{"both asn and dynamic_asn", func(p *weirv1.BgpPeer) { p.DynamicAsn = "external" }, "dynamic_asn", "not both"},
		{"neither asn nor dynamic_asn", func(p *weirv1.BgpPeer) { p.Asn = 0 }, "asn", "dynamic_asn"},
		{"a dynamic_asn of another kind", func(p *weirv1.BgpPeer) { p.Asn, p.DynamicAsn = 0, "confederation" }, "dynamic_asn", `"internal" or "external"`},
		{"a VRF name with a space", func(p *weirv1.BgpPeer) { p.Vrf = "red vrf" }, "vrf", "interface name"},
		{"BFD in a VRF", func(p *weirv1.BgpPeer) { p.Vrf, p.Bfd = "red", &weirv1.BfdProfile{} }, "bfd", "VRF"},
	} {
		p := linkLocal()
		tc.set(p)
		_, err := ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: p})
		wantInvalid(t, tc.what, err, "bgp_peer."+tc.field, tc.says)
		if _, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "bad"}); err == nil {
			t.Errorf("%s: the refused peer was kept", tc.what)
		}
		p.Metadata.Name = "link-local"
		_, err = ts.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: p})
		wantInvalid(t, tc.what+" (update)", err, "bgp_peer."+tc.field, tc.says)
	}
	got, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "link-local"})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetBgpPeer().GetAddress() != "fe80::1" || got.GetBgpPeer().GetInterface() != "eth0" || got.GetBgpPeer().GetVrf() != "red" {
		t.Errorf("refused updates changed the peer: %v", got.GetBgpPeer())
	}
}

// TestCustomResourcesTakeLinkLocalAndDynamicPeers: a WeirBGPPeer carries an
// interface, a dynamic AS and a VRF into the registry; the apiserver
// refuses what one object can tell is wrong, naming the field.
func TestCustomResourcesTakeLinkLocalAndDynamicPeers(t *testing.T) {
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	peer := func(name, spec string) string {
		return "apiVersion: weir.dev/v1alpha1\nkind: WeirBGPPeer\nmetadata:\n  name: " + name + "\nspec:\n  myASN: 4200000001\n" + spec
	}
	for _, tc := range []struct {
		doc, field string
	}{
		{peer("no-address", "  asn: 64512\n"), "spec"},
		{peer("both-asns", "  interface: eth0\n  asn: 64512\n  dynamicASN: external\n"), "spec"},
		{peer("no-asn", "  interface: eth0\n"), "spec"},
		{peer("dynamic-other", "  interface: eth0\n  dynamicASN: confederation\n"), "spec.dynamicASN"},
		{peer("interface-slash", "  interface: eth/0\n  asn: 64512\n"), "spec.interface"},
		{peer("vrf-long", "  interface: eth0\n  asn: 64512\n  vrf: a-very-long-name0\n"), "spec.vrf"},
		{peer("vrf-bfd", "  address: 192.0.2.1\n  asn: 64512\n  vrf: red\n  bfd: {}\n"), "spec.bfd"},
	} {
		if err := createDoc(t, ctx, dyn, v1alpha1.BGPPeers, tc.doc, true); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v; want a refusal naming %s", nameOf(tc.doc), err, tc.field)
		}
	}

	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default", Classes: kubernetes.Classes{Default: true}}
	})
	for _, doc := range []string{
		peer("leaf-1", "  interface: eth1\n  dynamicASN: external\n  vrf: red\n"),
		peer("leaf-2", "  address: \"fe80::2\"\n  interface: eth2\n  asn: 4200000100\n"),
	} {
		if err := createDoc(t, ctx, dyn, v1alpha1.BGPPeers, doc, false); err != nil {
			t.Fatalf("%s: %v", nameOf(doc), err)
		}
	}
	for _, want := range []*weirv1.BgpPeer{
		{Metadata: &weirv1.ObjectMeta{Name: "leaf-1"}, Interface: "eth1", DynamicAsn: "external", MyAsn: 4200000001, Vrf: "red"},
		{Metadata: &weirv1.ObjectMeta{Name: "leaf-2"}, Address: "fe80::2", Interface: "eth2", Asn: 4200000100, MyAsn: 4200000001},
	} {
		eventually(t, 15*time.Second, func() error {
			got, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: want.Metadata.Name})
			if err != nil {
				return err
			}
			if d := cmp.Diff(want, got.GetBgpPeer(), protocmp.Transform(), ignoreMeta, protocmp.IgnoreFields(&weirv1.ObjectMeta{}, "labels")); d != "" {
				return fmt.Errorf("%s in the registry (-want +got):\n%s", want.Metadata.Name, d)
			}
			return nil
		})
	}
	// kubectl get shows where an unnumbered peer is and its dynamic AS.
	row, err := tableRow(ctx, kc, v1alpha1.BGPPeers.Resource, "leaf-1")
	if err != nil || !strings.Contains(row, "Interface=eth1") || !strings.Contains(row, "Dynamic ASN=external") {
		t.Errorf("kubectl get weirbgppeers leaf-1 -o wide: %s, %v; want Interface=eth1 and Dynamic ASN=external", row, err)
	}
}
