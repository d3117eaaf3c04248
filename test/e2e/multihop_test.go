package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
)

// TestEBGPMultihopFromTheNodesLoopback: a node speaker peers with a
// router one routed hop away (the node, the lab's Linux router, FRR or
// BIRD in the client's namespace) from an address on the node's loopback,
// as a fabric peers with a route reflector: the router knows the node only
// by that address, with ebgp-multihop 2 and update-source (BIRD: multihop
// 2, source address). With the peer's
// ebgp_multihop_ttl 0 the session does not come up (its packets die at
// the router); set to 2 it does, and the router's RIB holds the pool's
// address from the node's AS; set back to 0, the established session
// ends and stays down.
func TestEBGPMultihopFromTheNodesLoopback(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) { testEBGPMultihop(t, impl) })
	}
}

// multihopRouter is a lab router of either implementation, as the
// multi-hop test reads it.
type multihopRouter interface {
	Established(ctx context.Context) (int, error)
	Describe(ctx context.Context, prefix string) string
}

func testEBGPMultihop(t *testing.T, impl string) {
	requireRouter(t, impl)
	c := startSpeakingCluster(t, func(*lab.Node) []string { return nil })
	ctx := context.Background()
	node1 := c.Nodes[0]
	const loopback = "10.255.0.11"
	reflector := lab.ClientIPv4.String()
	if _, err := node1.Run(ctx, "ip", "addr", "add", loopback+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Router.Run(ctx, "ip", "route", "add", loopback+"/32", "via", node1.IPv4.String()); err != nil {
		t.Fatal(err)
	}
	var r multihopRouter
	var attributes func(ctx context.Context, prefix string) (string, error)
	if impl == "FRR" {
		f, err := frr.StartTemp(ctx, c.Client, frr.Config{Text: fmt.Sprintf(`frr defaults traditional
hostname reflector
log stdout
ip nht resolve-via-default
!
router bgp %[1]d
 bgp router-id %[2]s
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 timers bgp 3 9
 neighbor %[3]s remote-as %[4]d
 neighbor %[3]s passive
 neighbor %[3]s ebgp-multihop 2
 neighbor %[3]s update-source %[2]s
 neighbor %[3]s advertisement-interval 0
 address-family ipv4 unicast
  neighbor %[3]s activate
 exit-address-family
!
`, routerASN, reflector, loopback, nodeASN)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.Close)
		r, attributes = f, func(ctx context.Context, prefix string) (string, error) { return frrAttributes(ctx, f, prefix) }
	} else {
		b := startBIRDIn(t, c.Client, bird.Config{ASN: routerASN, RouterID: reflector, ListenRanges4: []string{loopback + "/32"}, PeerASN: nodeASN,
			Multihop: 2, SourceAddress: reflector})
		r, attributes = b, func(ctx context.Context, prefix string) (string, error) { return birdAttributes(ctx, b, prefix) }
	}

	// Only node1 has the loopback address, so only node1 peers.
	got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: node1.Name})
	if err != nil {
		t.Fatal(err)
	}
	n := got.GetNode()
	n.Metadata.Labels = map[string]string{"loopback": "10.255.0.11"}
	if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "fabric"}, Addresses: []string{"203.0.113.96/29"}, BgpAdvertisement: &weirv1.BgpAdvertisement{}}}); err != nil {
		t.Fatal(err)
	}
	createService(t, c, lbService("multihop", 30130, []string{"10.96.0.97"}, []string{"203.0.113.97"}), c.Pods())

	peer := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "reflector"}, Address: reflector, Asn: routerASN, MyAsn: nodeASN,
		SourceAddress: loopback, HoldTimeSeconds: 9, KeepaliveSeconds: 3, ConnectRetrySeconds: 1,
		NodeSelector: map[string]string{"loopback": "10.255.0.11"}}
	created, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer})
	if err != nil {
		t.Fatal(err)
	}
	// Directly connected (TTL 1): the router drops every packet, however
	// often the speaker dials (a new speaker waits 1-2 s, then every
	// second).
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if up, err := r.Established(ctx); err != nil || up != 0 {
			t.Fatalf("with ebgp_multihop_ttl 0: %d sessions established (%v); want none\n%s", up, err, r.Describe(ctx, "203.0.113.97/32"))
		}
	}

	peer = created.GetBgpPeer()
	peer.EbgpMultihopTtl = 2
	updated, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: peer})
	if err != nil {
		t.Fatal(err)
	}
	waitSessions(t, c, map[string]string{node1.Name: reflector + " established", c.Nodes[1].Name: ""})
	eventually(t, "the router's RIB holds the pool's address from node1's AS", func() error {
		got, err := attributes(ctx, "203.0.113.97/32")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(got, fmt.Sprintf("as path %d;", nodeASN)) || strings.Count(got, "as path") != 1 {
			return fmt.Errorf("the router's paths for 203.0.113.97/32: %q; want one from AS %d\n%s", got, nodeASN, r.Describe(ctx, "203.0.113.97/32"))
		}
		return nil
	})
	// The router knows the node only by its loopback address (FRR's one
	// neighbor, BIRD's range of one address): the session is from there.
	if up, err := r.Established(ctx); err != nil || up != 1 {
		t.Errorf("%d sessions established (%v); want node1's\n%s", up, err, r.Describe(ctx, "203.0.113.97/32"))
	}

	// Back to 0 on the established session: the speaker opens it again
	// with TTL 1, which the router never hears, so the session ends, the
	// router drops the node's route and no session comes back.
	peer = updated.GetBgpPeer()
	peer.EbgpMultihopTtl = 0
	if _, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: peer}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the session ends and the router drops the route", func() error {
		if up, err := r.Established(ctx); err != nil || up != 0 {
			return fmt.Errorf("%d sessions established (%v); want none", up, err)
		}
		if got, err := attributes(ctx, "203.0.113.97/32"); err != nil || got != "" {
			return fmt.Errorf("the router's paths for 203.0.113.97/32: %q (%v); want none", got, err)
		}
		return nil
	})
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if up, err := r.Established(ctx); err != nil || up != 0 {
			t.Fatalf("back at ebgp_multihop_ttl 0: %d sessions established (%v); want none\n%s", up, err, r.Describe(ctx, "203.0.113.97/32"))
		}
	}
}
