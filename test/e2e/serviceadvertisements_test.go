package e2e

import (
	"context"
	"fmt"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// TestEachServiceGetsItsAdvertisement: one pool with three advertisements
// chosen by service labels, one of them for rack r1's nodes only, one
// naming the router's peer, one naming another peer. The router's RIB
// holds each service's address with its own community: the production
// service's from both nodes, the staging service's from node1 alone, and
// never the internal service's, which goes to the other peer alone; with
// FRR and with BIRD.
func TestEachServiceGetsItsAdvertisement(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			var c *weirlab.Cluster
			var r bgpRouter
			var attributes func(ctx context.Context, prefix string) (string, error)
			if impl == "FRR" {
				var f *frr.Router
				c, f = startBGPClusterWith(t, func(*lab.Node) []string { return nil }, labRouter)
				r, attributes = f, func(ctx context.Context, prefix string) (string, error) { return frrAttributes(ctx, f, prefix) }
			} else {
				requireBIRD(t)
				c = startSpeakingCluster(t, func(*lab.Node) []string { return nil })
				b := startBIRD(t, c, bird.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), ListenRanges4: []string{"192.0.2.0/24"}, PeerASN: nodeASN})
				r, attributes = b, func(ctx context.Context, prefix string) (string, error) { return birdAttributes(ctx, b, prefix) }
			}
			ctx := context.Background()
			if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
				Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN}}); err != nil {
				t.Fatal(err)
			}
			// A router never reached: the internal service's only peer.
			if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
				Metadata: &weirv1.ObjectMeta{Name: "collector"}, Address: "192.0.2.250", Asn: routerASN, MyAsn: nodeASN, ConnectRetrySeconds: 1}}); err != nil {
				t.Fatal(err)
			}
			node1, node2 := c.Nodes[0], c.Nodes[1]
			got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: node1.Name})
			if err != nil {
				t.Fatal(err)
			}
			n := got.GetNode()
			n.Metadata.Labels = map[string]string{"rack": "r1"}
			if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
				Metadata: &weirv1.ObjectMeta{Name: "split"}, Addresses: []string{"203.0.113.144/28"},
				BgpAdvertisements: []*weirv1.BgpAdvertisement{
					{ServiceSelector: map[string]string{"environment": "production"}, Communities: []string{"64512:1"}, Peers: []string{"tor"}},
					{ServiceSelector: map[string]string{"environment": "staging"}, NodeSelector: map[string]string{"rack": "r1"}, Communities: []string{"64512:2"}},
					{ServiceSelector: map[string]string{"environment": "internal"}, Communities: []string{"64512:3"}, Peers: []string{"collector"}},
				}}}); err != nil {
				t.Fatal(err)
			}
			for i, env := range []string{"production", "staging", "internal"} {
				svc := lbService(env, int32(30150+i), []string{fmt.Sprintf("10.96.0.%d", 150+i)}, []string{fmt.Sprintf("203.0.113.%d", 145+i)})
				svc.Metadata.Labels = map[string]string{"environment": env}
				createService(t, c, svc, c.Pods())
			}
			waitNextHops(t, r, "203.0.113.145", node1.IPv4.String(), node2.IPv4.String())
			waitNextHops(t, r, "203.0.113.146", node1.IPv4.String())
			for prefix, want := range map[string]string{
				"203.0.113.145/32": fmt.Sprintf("as path %d; communities 64512:1; large communities \nas path %d; communities 64512:1; large communities ", nodeASN, nodeASN),
				"203.0.113.146/32": fmt.Sprintf("as path %d; communities 64512:2; large communities ", nodeASN),
			} {
				eventually(t, prefix+"'s paths carry its service's community", func() error {
					got, err := attributes(ctx, prefix)
					if err != nil {
						return err
					}
					if got != want {
						return fmt.Errorf("the router's paths of %s:\n%s\nwant\n%s\n%s", prefix, got, want, r.Describe(ctx, prefix))
					}
					return nil
				})
			}
			if got, err := attributes(ctx, "203.0.113.147/32"); err != nil || got != "" {
				t.Errorf("the router's paths of the internal service's 203.0.113.147/32, kept to another peer: %q (%v); want none\n%s", got, err, r.Describe(ctx, "203.0.113.147"))
			}
			// The service relabelled: it moves to the advertisement of
			// the router's peer, and back, which takes it away again (the
			// router hears a withdrawal, not only a new rule).
			relabel := func(env string) {
				t.Helper()
				got, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "internal"})
				if err != nil {
					t.Fatal(err)
				}
				svc := got.GetService()
				svc.Metadata.Labels = map[string]string{"environment": env}
				if _, err := c.Registry.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: svc}); err != nil {
					t.Fatal(err)
				}
			}
			relabel("production")
			waitNextHops(t, r, "203.0.113.147", node1.IPv4.String(), node2.IPv4.String())
			relabel("internal")
			waitNextHops(t, r, "203.0.113.147")
		})
	}
}
