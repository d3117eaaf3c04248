package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/servertest"
)

// fabricPeer is a peer with every session option of a fabric set: a
// route reflector two hops away, peered from the node's loopback.
func fabricPeer(name string) *weirv1.BgpPeer {
	return &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: name}, Address: "192.0.2.1", Asn: 4200000100, MyAsn: 4200000001,
		HoldTimeSeconds: 30, EbgpMultihopTtl: 2, SourceAddress: "198.51.100.7", KeepaliveSeconds: 10, ConnectRetrySeconds: 5,
		Bfd: &weirv1.BfdProfile{ReceiveIntervalMs: 100, TransmitIntervalMs: 150, DetectMultiplier: 4, Passive: true, MinimumTtl: 253}}
}

// ignoreMeta leaves out the metadata the server writes.
var ignoreMeta = protocmp.IgnoreFields(&weirv1.ObjectMeta{}, "resource_version", "create_time", "source", "revision")

// TestTheAPITakesAFabricsSessionOptions: a BgpPeer's eBGP multi-hop TTL,
// source address, keepalive and connect-retry times are kept and read
// back as written; a value out of range is refused with InvalidArgument
// naming the field, and changes nothing.
func TestTheAPITakesAFabricsSessionOptions(t *testing.T) {
	ts := servertest.Start(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := fabricPeer("rr-1")
	if _, err := ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: want}); err != nil {
		t.Fatal(err)
	}
	got, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "rr-1"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got.GetBgpPeer(), protocmp.Transform(), ignoreMeta); d != "" {
		t.Errorf("peer read back (-written +read):\n%s", d)
	}

	for _, tc := range []struct {
		what        string
		set         func(*weirv1.BgpPeer)
		field, says string
	}{
		{"TTL 256", func(p *weirv1.BgpPeer) { p.EbgpMultihopTtl = 256 }, "ebgp_multihop_ttl", "1-255"},
		{"a source address that is no address", func(p *weirv1.BgpPeer) { p.SourceAddress = "lo" }, "source_address", "not an IP address"},
		{"a source address of the other family", func(p *weirv1.BgpPeer) { p.SourceAddress = "2001:db8::7" }, "source_address", "family"},
		{"a multicast source address", func(p *weirv1.BgpPeer) { p.SourceAddress = "224.0.0.5" }, "source_address", "unicast"},
		{"keepalive as long as the hold time", func(p *weirv1.BgpPeer) { p.KeepaliveSeconds = 30 }, "keepalive_seconds", "less than the hold time"},
		{"keepalive as long as the default hold time", func(p *weirv1.BgpPeer) { p.HoldTimeSeconds, p.KeepaliveSeconds = 0, 90 }, "keepalive_seconds", "less than the hold time"},
		{"a negative keepalive", func(p *weirv1.BgpPeer) { p.KeepaliveSeconds = -1 }, "keepalive_seconds", ""},
		{"a negative connect retry", func(p *weirv1.BgpPeer) { p.ConnectRetrySeconds = -1 }, "connect_retry_seconds", "1-65535"},
		{"a connect retry of a day", func(p *weirv1.BgpPeer) { p.ConnectRetrySeconds = 86400 }, "connect_retry_seconds", "1-65535"},
		{"a BFD interval of 5 ms", func(p *weirv1.BgpPeer) { p.Bfd.ReceiveIntervalMs = 5 }, "bfd.receive_interval_ms", "10ms"},
		{"a BFD interval of two minutes", func(p *weirv1.BgpPeer) { p.Bfd.TransmitIntervalMs = 120000 }, "bfd.transmit_interval_ms", "1m0s"},
		{"a BFD multiplier of 1", func(p *weirv1.BgpPeer) { p.Bfd.DetectMultiplier = 1 }, "bfd.detect_multiplier", "first lost packet"},
		{"a BFD multiplier of 256", func(p *weirv1.BgpPeer) { p.Bfd.DetectMultiplier = 256 }, "bfd.detect_multiplier", "2-255"},
		{"a BFD minimum TTL of 256", func(p *weirv1.BgpPeer) { p.Bfd.MinimumTtl = 256 }, "bfd.minimum_ttl", "1-255"},
		{"a BFD minimum TTL on a single hop", func(p *weirv1.BgpPeer) { p.EbgpMultihopTtl = 0 }, "bfd.minimum_ttl", "multi-hop"},
	} {
		p := fabricPeer("bad")
		tc.set(p)
		_, err := ts.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: p})
		wantInvalid(t, tc.what, err, "bgp_peer."+tc.field, tc.says)
		if _, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "bad"}); err == nil {
			t.Errorf("%s: the refused peer was kept", tc.what)
		}
		p.Metadata.Name = "rr-1"
		_, err = ts.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: p})
		wantInvalid(t, tc.what+" (update)", err, "bgp_peer."+tc.field, tc.says)
	}
	got, err = ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "rr-1"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got.GetBgpPeer(), protocmp.Transform(), ignoreMeta); d != "" {
		t.Errorf("refused updates changed the peer (-written +read):\n%s", d)
	}
}

// TestCustomResourcesTakeAFabricsSessionOptions: a WeirBGPPeer carries the
// same session options into the registry; the apiserver refuses, naming
// the field, what one object can tell is wrong.
func TestCustomResourcesTakeAFabricsSessionOptions(t *testing.T) {
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	peer := func(name, options string) string {
		return "apiVersion: weir.dev/v1alpha1\nkind: WeirBGPPeer\nmetadata:\n  name: " + name +
			"\nspec:\n  address: 192.0.2.1\n  asn: 4200000100\n  myASN: 4200000001\n  holdTimeSeconds: 30\n" + options
	}
	for _, tc := range []struct {
		doc, field string
	}{
		{peer("ttl-wide", "  ebgpMultihopTTL: 256\n"), "spec.ebgpMultihopTTL"},
		{peer("ttl-negative", "  ebgpMultihopTTL: -1\n"), "spec.ebgpMultihopTTL"},
		{peer("source-name", "  sourceAddress: lo\n"), "spec.sourceAddress"},
		{peer("source-family", "  sourceAddress: \"2001:db8::7\"\n"), "spec.sourceAddress"},
		{peer("keepalive-hold", "  keepaliveSeconds: 30\n"), "spec.keepaliveSeconds"},
		{peer("keepalive-default-hold", "  holdTimeSeconds: 0\n  keepaliveSeconds: 90\n"), "spec.keepaliveSeconds"},
		{peer("keepalive-negative", "  keepaliveSeconds: -1\n"), "spec.keepaliveSeconds"},
		{peer("connect-long", "  connectRetrySeconds: 65536\n"), "spec.connectRetrySeconds"},
		{peer("connect-negative", "  connectRetrySeconds: -1\n"), "spec.connectRetrySeconds"},
		{peer("bfd-fast", "  bfd:\n    receiveInterval: 5\n"), "spec.bfd.receiveInterval"},
		{peer("bfd-slow", "  bfd:\n    transmitInterval: 60001\n"), "spec.bfd.transmitInterval"},
		{peer("bfd-multiplier", "  bfd:\n    detectMultiplier: 1\n"), "spec.bfd.detectMultiplier"},
		{peer("bfd-ttl", "  bfd:\n    minimumTtl: 256\n"), "spec.bfd.minimumTtl"},
	} {
		doc := tc.doc
		if strings.Contains(doc, "holdTimeSeconds: 0") {
			doc = strings.Replace(doc, "  holdTimeSeconds: 30\n", "", 1)
		}
		if err := createDoc(t, ctx, dyn, v1alpha1.BGPPeers, doc, true); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v; want a refusal naming %s", nameOf(doc), err, tc.field)
		}
	}

	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default", Classes: kubernetes.Classes{Default: true}}
	})
	if err := createDoc(t, ctx, dyn, v1alpha1.BGPPeers, peer("rr-1",
		"  ebgpMultihopTTL: 2\n  sourceAddress: 198.51.100.7\n  keepaliveSeconds: 10\n  connectRetrySeconds: 5\n"+
			"  bfd:\n    receiveInterval: 100\n    transmitInterval: 150\n    detectMultiplier: 4\n    passiveMode: true\n    minimumTtl: 253\n"), false); err != nil {
		t.Fatalf("a peer with every session option: %v", err)
	}
	want := fabricPeer("rr-1")
	eventually(t, 15*time.Second, func() error {
		got, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "rr-1"})
		if err != nil {
			return err
		}
		p := got.GetBgpPeer()
		if p.GetEbgpMultihopTtl() != want.EbgpMultihopTtl || p.GetSourceAddress() != want.SourceAddress ||
			p.GetKeepaliveSeconds() != want.KeepaliveSeconds || p.GetConnectRetrySeconds() != want.ConnectRetrySeconds ||
			!proto.Equal(p.GetBfd(), want.GetBfd()) {
			return fmt.Errorf("rr-1 in the registry: %v; want %v", p, want)
		}
		return nil
	})
	// kubectl get -o wide shows where the session is made from.
	row, err := tableRow(ctx, kc, v1alpha1.BGPPeers.Resource, "rr-1")
	if err != nil || !strings.Contains(row, "Multihop TTL=2 Source=198.51.100.7") {
		t.Errorf("kubectl get weirbgppeers rr-1 -o wide: %s, %v; want Multihop TTL=2 Source=198.51.100.7", row, err)
	}
}
