package e2e

import (
	"context"
	"net/netip"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/weirlab"
)

// TestSessionAffinityAcrossFrontends: with ClientIP affinity every new
// connection from one client reaches the same pod, whichever frontend of
// the service port it uses.
func TestSessionAffinityAcrossFrontends(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	svc := lbService("sticky", 30092, []string{"10.96.0.23", "fd00:96::23"}, []string{"203.0.113.23", "2001:db8:113::23"})
	svc.Spec.SessionAffinity = weirv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP
	createService(t, c, svc, c.Pods())
	node1 := c.Nodes[0]
	for _, fam := range families("10.96.0.23", "fd00:96::23", "203.0.113.23", "2001:db8:113::23") {
		t.Run(fam.name, func(t *testing.T) {
			routeVIP(t, c, fam.lbIP, fam.routePrefix, fam.node(node1))
			nodePort := netip.AddrPortFrom(fam.node(node1), 30092)
			eventually(t, "the node port answers", func() error {
				_, err := weirlab.Get(ctx, c.Client, nodePort)
				return err
			})
			seen := map[string]int{}
			for _, dst := range []netip.AddrPort{nodePort, netip.AddrPortFrom(fam.lbIP, 80)} {
				for _, r := range sample(t, c.Client, dst, 10) {
					seen[r.Pod]++
				}
			}
			if len(seen) != 1 {
				t.Errorf("20 connections from one client over two frontends reached %v; want one pod", seen)
			}
			// A pod as client: its own affinity, through the cluster IP.
			inner := map[string]int{}
			for _, r := range sample(t, node1.Pods[1].Netns, netip.AddrPortFrom(fam.clusterIP, 80), 10) {
				inner[r.Pod]++
			}
			if len(inner) != 1 {
				t.Errorf("10 connections from pod n1p2 reached %v; want one pod", inner)
			}
		})
	}
}
