package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// TestAnL2PoolAnnouncedOverBGPToo: one pool answered over L2 by rack a
// and announced over BGP by rack b (MetalLB's pool selected by an
// L2Advertisement and a BGPAdvertisement). For a Local service with pods
// on node1 (rack a) and node3 (rack b), a host on the nodes' segment
// resolves the address by ARP to node1 and is served by node1's pod,
// while the router hears it from node3 alone (node2 has no endpoint,
// node1 is not selected) and a client behind the router is served by
// node3's pod, both seeing the client's own address. The pool made L2
// alone withdraws the route and leaves L2 answering; an advertisement for
// every node brings node1 in. With FRR and with BIRD.
func TestAnL2PoolAnnouncedOverBGPToo(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			cfg := lab.Config{Nodes: 3, PodsPerNode: []int{1, 1, 1}, Dir: t.TempDir()}
			var c *weirlab.Cluster
			var r bgpRouter
			if impl == "FRR" {
				c, r = startBGPClusterOf(t, cfg, func(*lab.Node) []string { return nil }, labRouter)
			} else {
				requireBIRD(t)
				c = startSpeakingClusterOf(t, cfg, func(*lab.Node) []string { return nil })
				r = startBIRD(t, c, bird.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), ListenRanges4: []string{"192.0.2.0/24"}, PeerASN: nodeASN})
			}
			testL2AndBGPOnOnePool(t, c, r)
		})
	}
}

func testL2AndBGPOnOnePool(t *testing.T, c *weirlab.Cluster, r bgpRouter) {
	ctx := context.Background()
	node1, node3 := c.Nodes[0], c.Nodes[2]
	for i, rack := range []string{"a", "b", "b"} {
		got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: c.Nodes[i].Name})
		if err != nil {
			t.Fatal(err)
		}
		n := got.GetNode()
		n.Metadata.Labels = map[string]string{"rack": rack}
		if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN}}); err != nil {
		t.Fatal(err)
	}
	pool := &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: "both"}, Addresses: []string{"192.0.2.200-192.0.2.209"},
		L2Advertisement:   &weirv1.L2Advertisement{NodeSelector: map[string]string{"rack": "a"}},
		BgpAdvertisements: []*weirv1.BgpAdvertisement{{NodeSelector: map[string]string{"rack": "b"}}}}
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: pool}); err != nil {
		t.Fatal(err)
	}
	pod1, pod3 := node1.Pods[0], node3.Pods[0]
	createL2Service(t, c, "web", weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, []*lab.Pod{pod1, pod3}, l2VIP)
	dst := netip.AddrPortFrom(l2VIP, 80)

	// Routed: the router hears the address from node3 alone, and the
	// client behind it is served by node3's pod.
	waitNextHops(t, r, l2VIP.String(), node3.IPv4.String())
	servedBy := func(ns *lab.Netns, from netip.Addr, pod *lab.Pod) func() error {
		return func() error {
			got, err := weirlab.Get(ctx, ns, dst)
			if err == nil && (got.Pod != pod.Name || got.RemoteAddr() != from) {
				err = fmt.Errorf("served by %s seeing %s; want %s seeing %s", got.Pod, got.Remote, pod.Name, from)
			}
			return err
		}
	}
	eventually(t, "the client behind the router served by node3", servedBy(c.Client, lab.ClientIPv4, pod3))

	// On the segment: the control host's kernel resolves the address to
	// node1's MAC, and node1's pod serves it.
	eventually(t, "the host on the segment served by node1", servedBy(c.Control, lab.ControlIPv4, pod1))
	neighbour := func() string {
		out, err := c.Control.Run(ctx, "ip", "neigh", "show", l2VIP.String())
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	mac1 := macOf(t, node1.Netns, "eth0")
	if got := neighbour(); !strings.Contains(got, mac1) {
		t.Errorf("the segment's neighbour entry for %s is %q; want node1's %s", l2VIP, got, mac1)
	}

	// lbctl tells both ways apart, each with its nodes.
	out, err := c.Lbctl(ctx, "describe", "service", "default/web")
	if err != nil {
		t.Fatalf("lbctl describe service: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`192\.0\.2\.200 +node1 +[0-9]+ `).MatchString(out) ||
		!regexp.MustCompile(`192\.0\.2\.200/32 +node3 +`+regexp.QuoteMeta(node3.IPv4.String())+` `).MatchString(out) ||
		regexp.MustCompile(`192\.0\.2\.200/32 +node[12] `).MatchString(out) {
		t.Errorf("describe service does not give node1 as the L2 owner and node3 alone as the BGP announcer:\n%s", out)
	}
	if out, err := c.Lbctl(ctx, "get", "pools"); err != nil || !regexp.MustCompile(`both +192\.0\.2\.200-192\.0\.2\.209 +l2\+bgp `).MatchString(out) {
		t.Errorf("lbctl get pools: %v\n%s", err, out)
	}

	// The pool made L2 alone: the route goes, L2 stays.
	update := func(edit func(*weirv1.AddressPool)) {
		t.Helper()
		got, err := c.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "both"})
		if err != nil {
			t.Fatal(err)
		}
		p := got.GetAddressPool()
		edit(p)
		if _, err := c.Registry.UpdateAddressPool(ctx, &weirv1.UpdateAddressPoolRequest{AddressPool: p}); err != nil {
			t.Fatal(err)
		}
	}
	update(func(p *weirv1.AddressPool) { p.BgpAdvertisements = nil })
	waitNextHops(t, r, l2VIP.String())
	if err := servedBy(c.Control, lab.ControlIPv4, pod1)(); err != nil {
		t.Errorf("the host on the segment, the route withdrawn: %v", err)
	}

	// An advertisement for every node: node1 announces too (node2 still
	// has no endpoint), and keeps answering ARP.
	update(func(p *weirv1.AddressPool) { p.BgpAdvertisements = []*weirv1.BgpAdvertisement{{}} })
	waitNextHops(t, r, l2VIP.String(), node1.IPv4.String(), node3.IPv4.String())
	if got := neighbour(); !strings.Contains(got, mac1) {
		t.Errorf("the segment's neighbour entry for %s is %q; want node1's %s still", l2VIP, got, mac1)
	}
}
