package e2e

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

const (
	routerASN = 64500
	nodeASN   = 64512
)

// startBGPCluster runs Weir with node speakers peering with a real FRR
// router in the router namespace, configured on the agents' command line.
func startBGPCluster(t *testing.T) (*weirlab.Cluster, *frr.Router) {
	return startBGPClusterWith(t, func(n *lab.Node) []string {
		return []string{"--bgp-peers", fmt.Sprintf("%s/%d,%s/%d", lab.RouterLANv4, routerASN, lab.RouterLANv6, routerASN)}
	}, labRouter)
}

// labRouter accepts the nodes' sessions from the rack LAN.
var labRouter = frr.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), PeerASN: nodeASN,
	ListenRanges: []string{"192.0.2.0/24", "2001:db8:2::/64"}}

// startBGPClusterWith runs node speakers with extra agent flags and the
// router configured by router; options change the cluster further.
func startBGPClusterWith(t *testing.T, agentArgs func(*lab.Node) []string, router frr.Config, options ...func(*weirlab.Cluster)) (*weirlab.Cluster, *frr.Router) {
	t.Helper()
	return startBGPClusterOf(t, speakingLab(t), agentArgs, router, options...)
}

// speakingLab is the lab the BGP tests run in unless they say otherwise:
// two nodes, with two pods and one.
func speakingLab(t *testing.T) lab.Config {
	return lab.Config{Nodes: 2, PodsPerNode: []int{2, 1}, Dir: t.TempDir()}
}

// startBGPClusterOf is startBGPClusterWith in the lab cfg.
func startBGPClusterOf(t *testing.T, cfg lab.Config, agentArgs func(*lab.Node) []string, router frr.Config, options ...func(*weirlab.Cluster)) (*weirlab.Cluster, *frr.Router) {
	t.Helper()
	requireFRR(t)
	c := startSpeakingClusterOf(t, cfg, agentArgs, options...)
	r, err := frr.StartTemp(context.Background(), c.Router, router)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return c, r
}

// requireFRR fails the test in CI, or skips it elsewhere, when FRR is
// not installed.
func requireFRR(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/lib/frr/bgpd"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("FRR is required (Debian package frr)")
		}
		t.Skip("needs FRR (apt-get install frr)")
	}
}

// requireBIRD fails the test in CI, or skips it elsewhere, when BIRD is
// not installed.
func requireBIRD(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bird"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("BIRD is required (Debian package bird2)")
		}
		t.Skip("needs BIRD (apt-get install bird2)")
	}
}

// startSpeakingCluster runs a cluster whose agents speak BGP (AS nodeASN)
// with extra agent flags, and no router yet.
func startSpeakingCluster(t *testing.T, agentArgs func(*lab.Node) []string, options ...func(*weirlab.Cluster)) *weirlab.Cluster {
	t.Helper()
	return startSpeakingClusterOf(t, speakingLab(t), agentArgs, options...)
}

func startSpeakingClusterOf(t *testing.T, cfg lab.Config, agentArgs func(*lab.Node) []string, options ...func(*weirlab.Cluster)) *weirlab.Cluster {
	t.Helper()
	lab.SkipUnlessPrivileged(t)
	c, err := weirlab.Start(context.Background(), cfg, bin, append([]func(*weirlab.Cluster){func(c *weirlab.Cluster) {
		c.AgentArgs = func(n *lab.Node) []string {
			return append([]string{"--bgp-asn", strconv.Itoa(nodeASN), "--bgp-router-id", n.IPv4.String()}, agentArgs(n)...)
		}
	}}, options...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, a := range c.Agents {
				t.Logf("agent %d log:\n%s", i+1, a.Log())
			}
		}
		c.Close()
	})
	return c
}

// bgpRouter is a lab router of either implementation.
type bgpRouter interface {
	NextHops(ctx context.Context, prefix string) ([]string, error)
	GracefulRestartFrom(ctx context.Context, neighbor string) (bool, error)
	// RestartDone: the neighbor's session is up and what it sent of
	// prefix is its current session's, not kept through a restart.
	RestartDone(ctx context.Context, neighbor, prefix string) (bool, error)
	Describe(ctx context.Context, prefix string) string
}

// waitNextHops waits until the router's kernel route for prefix goes
// through exactly want.
func waitNextHops(t *testing.T, r bgpRouter, prefix string, want ...string) {
	t.Helper()
	slices.Sort(want)
	var got []string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		got, _ = r.NextHops(context.Background(), prefix)
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("router route for %s goes via %v; want %v\n%s", prefix, got, want, r.Describe(context.Background(), prefix))
}

// TestNodeSpeakersAnnounceWhereEndpointsAre: with externalTrafficPolicy
// Local, the router reaches the VIP only through nodes with a ready local
// endpoint (ECMP across them), follows endpoints as they move, and the
// client's address reaches the pod.
func TestNodeSpeakersAnnounceWhereEndpointsAre(t *testing.T) {
	c, r := startBGPCluster(t)
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	n1p1, n2p1 := node1.Pods[0], node2.Pods[0]
	svc := lbService("bgp", 30098, []string{"10.96.0.60", "fd00:96::60"}, []string{"203.0.113.60", "2001:db8:113::60"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32103
	createService(t, c, svc, []*lab.Pod{n1p1})

	waitNextHops(t, r, "203.0.113.60", node1.IPv4.String())
	waitNextHops(t, r, "2001:db8:113::60", node1.IPv6.String())
	for _, dst := range []netip.AddrPort{netip.MustParseAddrPort("203.0.113.60:80"), netip.MustParseAddrPort("[2001:db8:113::60]:80")} {
		for _, rep := range sample(t, c.Client, dst, 5) {
			want := lab.ClientIPv4
			if dst.Addr().Is6() {
				want = lab.ClientIPv6
			}
			if rep.Pod != n1p1.Name || rep.RemoteAddr() != want {
				t.Errorf("via the router to %s: pod %s saw %s; want n1p1 seeing the client %s", dst, rep.Pod, rep.RemoteAddr(), want)
			}
		}
	}

	// A second endpoint on node2: both nodes, ECMP.
	for _, s := range endpointSlices("bgp", []*lab.Pod{n1p1, n2p1}) {
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	waitNextHops(t, r, "203.0.113.60", node1.IPv4.String(), node2.IPv4.String())

	// node1 labelled out of external load balancers (Kubernetes'
	// node.kubernetes.io/exclude-from-external-load-balancers): withdrawn,
	// with the reason in the status, and back once the label goes.
	label := func(excluded bool) {
		t.Helper()
		got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: node1.Name})
		if err != nil {
			t.Fatal(err)
		}
		n := got.GetNode()
		if n.Metadata.Labels == nil {
			n.Metadata.Labels = map[string]string{}
		}
		if excluded {
			n.Metadata.Labels["node.kubernetes.io/exclude-from-external-load-balancers"] = "true"
		} else {
			delete(n.Metadata.Labels, "node.kubernetes.io/exclude-from-external-load-balancers")
		}
		if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	label(true)
	waitNextHops(t, r, "203.0.113.60", node2.IPv4.String())
	waitNextHops(t, r, "2001:db8:113::60", node2.IPv6.String())
	eventually(t, "node1's status says it is excluded", func() error {
		st, err := weirv1.NewStatusServiceClient(c.Conn).GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "bgp"})
		if err != nil {
			return err
		}
		for _, n := range st.GetStatus().GetNodes() {
			if n.GetNode() == node1.Name && n.GetReason() != "NodeExcluded" {
				return fmt.Errorf("node1: %s %s", n.GetReason(), n.GetMessage())
			}
		}
		return nil
	})
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort("203.0.113.60:80"), 5) {
		if rep.Pod != n2p1.Name {
			t.Errorf("with node1 excluded: answered by %s, want n2p1 behind node2", rep.Pod)
		}
	}
	label(false)
	waitNextHops(t, r, "203.0.113.60", node1.IPv4.String(), node2.IPv4.String())

	// node1 loses its endpoint: its next hop goes; traffic keeps flowing
	// to node2's pod with the client's address.
	for _, s := range endpointSlices("bgp", []*lab.Pod{n2p1}) {
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	waitNextHops(t, r, "203.0.113.60", node2.IPv4.String())
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort("203.0.113.60:80"), 5) {
		if rep.Pod != n2p1.Name || rep.RemoteAddr() != lab.ClientIPv4 {
			t.Errorf("after the move: pod %s saw %s", rep.Pod, rep.RemoteAddr())
		}
	}

	// Draining node2 withdraws it; a killed agent's session drops at once.
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node2.Name}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.60")
}

// TestPoolAddressIsAssignedAndAnnounced: a LoadBalancer service with no
// address gets one from a pool, the nodes announce it, and the client
// reaches the service through the router.
func TestPoolAddressIsAssignedAndAnnounced(t *testing.T) {
	c, r := startBGPCluster(t)
	ctx := context.Background()
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.80/30", "2001:db8:113::80/126"},
		BgpAdvertisement: &weirv1.BgpAdvertisement{Communities: []string{"64512:100", "no-export"}}}}); err != nil {
		t.Fatal(err)
	}
	svc := lbService("pooled", 30099, []string{"10.96.0.61", "fd00:96::61"}, nil)
	svc.Status = nil
	createService(t, c, svc, c.Pods())
	var vips []string
	eventually(t, "the service gets addresses from the pool", func() error {
		got, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "pooled"})
		if err != nil {
			return err
		}
		vips = got.GetService().GetStatus().GetLoadBalancerIps()
		if len(vips) != 2 {
			return fmt.Errorf("status %v", got.GetService().GetStatus())
		}
		return nil
	})
	if vips[0] != "203.0.113.80" || vips[1] != "2001:db8:113::80" {
		t.Errorf("assigned %v, want the first address of each family", vips)
	}
	// externalTrafficPolicy Cluster: every healthy node announces.
	waitNextHops(t, r, vips[0], c.Nodes[0].IPv4.String(), c.Nodes[1].IPv4.String())
	waitNextHops(t, r, vips[1], c.Nodes[0].IPv6.String(), c.Nodes[1].IPv6.String())
	sample(t, c.Client, netip.AddrPortFrom(netip.MustParseAddr(vips[0]), 80), 5)
	sample(t, c.Client, netip.AddrPortFrom(netip.MustParseAddr(vips[1]), 80), 5)

	// The pool's communities ride on every path; changing them re-announces.
	waitCommunities(t, r, vips[0], "64512:100 no-export")
	waitCommunities(t, r, vips[1], "64512:100 no-export")
	pool, err := c.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "public"})
	if err != nil {
		t.Fatal(err)
	}
	pool.GetAddressPool().BgpAdvertisement.Communities = []string{"64512:200"}
	if _, err := c.Registry.UpdateAddressPool(ctx, &weirv1.UpdateAddressPoolRequest{AddressPool: pool.GetAddressPool()}); err != nil {
		t.Fatal(err)
	}
	waitCommunities(t, r, vips[0], "64512:200")
	// A bad community is refused, naming the field.
	pool.GetAddressPool().BgpAdvertisement.Communities = []string{"64512:70000"}
	if _, err := c.Registry.UpdateAddressPool(ctx, &weirv1.UpdateAddressPoolRequest{AddressPool: pool.GetAddressPool()}); err == nil ||
		!strings.Contains(err.Error(), "bgp_advertisement.communities[0]") {
		t.Errorf("bad community: %v, want an error naming bgp_advertisement.communities[0]", err)
	}
}

// waitCommunities waits until every path the router has for prefix
// carries exactly the communities want (FRR's spelling).
func waitCommunities(t *testing.T, r *frr.Router, prefix, want string) {
	t.Helper()
	family := "ipv4"
	if strings.Contains(prefix, ":") {
		family = "ipv6"
	}
	eventually(t, fmt.Sprintf("the router's paths for %s carry %q", prefix, want), func() error {
		out, err := r.Vtysh(context.Background(), fmt.Sprintf("show bgp %s unicast %s json", family, prefix))
		if err != nil {
			return err
		}
		var route struct {
			Paths []struct {
				Community struct {
					String string `json:"string"`
				} `json:"community"`
			} `json:"paths"`
		}
		if err := json.Unmarshal([]byte(out), &route); err != nil {
			return err
		}
		if len(route.Paths) == 0 {
			return fmt.Errorf("no paths")
		}
		for _, p := range route.Paths {
			if p.Community.String != want {
				return fmt.Errorf("a path has communities %q", p.Community.String)
			}
		}
		return nil
	})
}

// TestWeightsFollowLocalEndpoints: a node with two ready local endpoints
// announces twice the weight of a node with one; the router installs
// weighted next hops, and new connections split accordingly.
func TestWeightsFollowLocalEndpoints(t *testing.T) {
	c, r := startBGPCluster(t)
	node1, node2 := c.Nodes[0], c.Nodes[1]
	svc := lbService("weighted", 30101, []string{"10.96.0.62"}, []string{"203.0.113.62"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32104
	createService(t, c, svc, c.Pods()) // node1: n1p1, n1p2; node2: n2p1
	var w map[string]int
	eventually(t, "weighted next hops 2:1", func() error {
		var err error
		if w, err = r.Weights(context.Background(), "203.0.113.62"); err != nil {
			return err
		}
		w1, w2 := w[node1.IPv4.String()], w[node2.IPv4.String()]
		if len(w) != 2 || w2 == 0 || w1 != 2*w2 && (w1*100/w2 < 190 || w1*100/w2 > 210) {
			return fmt.Errorf("weights %v", w)
		}
		return nil
	})
	// Hash on ports too, so that one client's connections spread.
	if _, err := c.Router.Run(context.Background(), "sysctl", "-w", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatal(err)
	}
	onNode1 := 0
	const n = 300
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort("203.0.113.62:80"), n) {
		if podByName(c, rep.Pod).Node == node1 {
			onNode1++
		}
	}
	// Expected 2/3; four standard deviations either side.
	if f := float64(onNode1) / n; f < 0.557 || f > 0.776 {
		t.Errorf("%d of %d connections reached node1 (weights %v); want about two thirds", onNode1, n, w)
	}
}

// TestPeersComeFromTheAPI: BgpPeer resources, not flags, decide whom each
// node peers with: a node selector picks the nodes, an update widens it,
// and deleting the peer ends the sessions.
func TestPeersComeFromTheAPI(t *testing.T) {
	c, r := startBGPClusterWith(t, func(*lab.Node) []string { return nil }, labRouter)
	ctx := context.Background()
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
	svc := lbService("peered", 30102, []string{"10.96.0.63"}, []string{"203.0.113.63"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32105
	createService(t, c, svc, c.Pods())

	// A bad peer is refused, naming the field, and changes nothing.
	_, err = c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: lab.RouterLANv4.String(), Asn: routerASN}})
	if err == nil || !strings.Contains(err.Error(), "my_asn") {
		t.Fatalf("peer without my_asn: got %v, want an error naming my_asn", err)
	}

	peer := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN,
		HoldTimeSeconds: 9, NodeSelector: map[string]string{"rack": "r1"}}
	created, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer})
	if err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.63", node1.IPv4.String())
	waitSessions(t, c, map[string]string{node1.Name: lab.RouterLANv4.String() + " established", node2.Name: ""})
	// Both speakers announce, weighted by their ready local endpoints;
	// only node1's reaches a router.
	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "the status API shows each node's announcement", func() error {
		resp, err := status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "peered"})
		if err != nil {
			return err
		}
		var got []string
		for _, n := range resp.GetStatus().GetNodes() {
			for _, an := range n.GetAnnouncements() {
				got = append(got, fmt.Sprintf("%s %s via %s weight %d", n.GetNode(), an.GetPrefix(), an.GetNextHop(), an.GetWeight()))
			}
		}
		want := []string{node1.Name + " 203.0.113.63/32 via " + node1.IPv4.String() + " weight 2", node2.Name + " 203.0.113.63/32 via " + node2.IPv4.String() + " weight 1"}
		if !slices.Equal(got, want) {
			return fmt.Errorf("announcements %q", got)
		}
		return nil
	})
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort("203.0.113.63:80"), 5) {
		if podByName(c, rep.Pod).Node != node1 || rep.RemoteAddr() != lab.ClientIPv4 {
			t.Errorf("pod %s saw %s; want a pod of node1 seeing the client %s", rep.Pod, rep.RemoteAddr(), lab.ClientIPv4)
		}
	}

	// Every node, now.
	peer = created.GetBgpPeer()
	peer.NodeSelector = nil
	if _, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: peer}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.63", node1.IPv4.String(), node2.IPv4.String())

	waitSessions(t, c, map[string]string{node1.Name: lab.RouterLANv4.String() + " established", node2.Name: lab.RouterLANv4.String() + " established"})

	if _, err := c.Registry.DeleteBgpPeer(ctx, &weirv1.DeleteBgpPeerRequest{Name: "tor"}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.63")
	waitSessions(t, c, map[string]string{node1.Name: "", node2.Name: ""})

	// A peer nobody answers: the status API says why no router hears the
	// nodes.
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "wrong-port"}, Address: lab.RouterLANv4.String(), Port: 1790, Asn: routerASN, MyAsn: nodeASN}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both nodes marked BGPSessionsDown for the service", func() error {
		resp, err := status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "peered"})
		if err != nil {
			return err
		}
		var reasons []string
		for _, n := range resp.GetStatus().GetNodes() {
			reasons = append(reasons, n.GetNode()+" "+n.GetReason())
		}
		if want := []string{node1.Name + " BGPSessionsDown", node2.Name + " BGPSessionsDown"}; !slices.Equal(reasons, want) || len(resp.GetStatus().GetReceivingNodes()) != 0 {
			return fmt.Errorf("reasons %q, receiving %v", reasons, resp.GetStatus().GetReceivingNodes())
		}
		return nil
	})
}

// waitSessions waits until the status API shows, per node, its BGP
// sessions as "PEER STATE" lines.
func waitSessions(t *testing.T, c *weirlab.Cluster, want map[string]string) {
	t.Helper()
	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, fmt.Sprintf("the status API shows BGP sessions %v", want), func() error {
		resp, err := status.ListNodeStatuses(context.Background(), &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, n := range resp.GetNodes() {
			var lines []string
			for _, s := range n.GetBgpSessions() {
				if s.GetSessionState() == weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED && s.GetEstablishedSince() == nil {
					return fmt.Errorf("%s: session with %s established at no time", n.GetName(), s.GetPeerAddress())
				}
				lines = append(lines, s.GetPeerAddress()+" "+string(nodewire.StateOf(s)))
			}
			got[n.GetName()] = strings.Join(lines, "\n")
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("sessions %q", got)
		}
		return nil
	})
}

// TestDrainBehindAnECMPRouter measures what draining a node does to the
// connections a BGP ECMP router spreads over the nodes, and checks what
// docs/operations.md says of it: the router withdraws the drained node at
// once and new connections avoid it, while established connections the
// router moves to the other node are passed back to the drained one,
// which serves them on: none breaks.
func TestDrainBehindAnECMPRouter(t *testing.T) {
	c, r := startBGPCluster(t)
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	createService(t, c, lbService("drained", 30113, []string{"10.96.0.73", "fd00:96::73"}, []string{"203.0.113.73", "2001:db8:113::73"}), c.Pods())
	waitNextHops(t, r, "203.0.113.73", node1.IPv4.String(), node2.IPv4.String())
	waitNextHops(t, r, "2001:db8:113::73", node1.IPv6.String(), node2.IPv6.String())
	// Hash on ports too, so that one client's connections spread.
	for _, sysctl := range []string{"net.ipv4.fib_multipath_hash_policy=1", "net.ipv6.fib_multipath_hash_policy=1"} {
		if _, err := c.Router.Run(ctx, "sysctl", "-w", sysctl); err != nil {
			t.Fatal(err)
		}
	}
	dsts := []netip.AddrPort{netip.MustParseAddrPort("203.0.113.73:80"), netip.MustParseAddrPort("[2001:db8:113::73]:80")}
	const n = 60
	conns := map[netip.AddrPort][]*keepAlive{}
	for _, dst := range dsts {
		for i := range n {
			k, err := dialKeepAlive(ctx, c.Client, dst)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			if err := k.Request(); err != nil {
				t.Fatalf("connection %d to %s before the drain: %v", i, dst, err)
			}
			conns[dst] = append(conns[dst], k)
		}
	}

	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node1.Name}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.73", node2.IPv4.String())
	waitNextHops(t, r, "2001:db8:113::73", node2.IPv6.String())
	for _, dst := range dsts {
		broken := 0
		for _, k := range conns[dst] {
			if k.Request() != nil {
				broken++
			}
		}
		moved := len(conntrackPorts(t, node2, dst.Addr(), false))
		t.Logf("draining node1 broke %d of %d established connections to %s through the router (%d moved to node2)", broken, n, dst, moved)
		if broken > 0 {
			t.Errorf("%s: %d of %d established connections broke", dst, broken, n)
		}
		if moved == 0 {
			t.Errorf("%s: no connection moved to node2: the drain tested nothing", dst)
		}
		for i := range 20 {
			if _, err := weirlab.Get(ctx, c.Client, dst); err != nil {
				t.Errorf("new connection %d to %s after the drain: %v", i, dst, err)
			}
		}
	}
}

// TestAnnouncersWithinTheRoutersWidth: a pool limited to two announcing
// nodes in a three-node lab: the router reaches each Cluster service's
// address through exactly the two nodes the server names in its status,
// connections through it work; draining one of them brings the third
// into the addresses it announced and leaves the others' next hops alone.
func TestAnnouncersWithinTheRoutersWidth(t *testing.T) {
	c, r := startBGPClusterOf(t, lab.Config{Nodes: 3, PodsPerNode: []int{1, 1, 1}, Dir: t.TempDir()}, func(n *lab.Node) []string {
		return []string{"--bgp-peers", fmt.Sprintf("%s/%d", lab.RouterLANv4, routerASN)}
	}, labRouter)
	ctx := context.Background()
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "limited"}, Addresses: []string{"203.0.113.96/29"},
		BgpAdvertisement: &weirv1.BgpAdvertisement{MaxAnnouncingNodes: 2}}}); err != nil {
		t.Fatal(err)
	}
	hop := map[string]string{}
	for _, n := range c.Nodes {
		hop[n.Name] = n.IPv4.String()
	}
	// announcers reads the status of each service: its address and the
	// next hops its announcers give.
	announcers := func(name string) (vip string, hops []string) {
		t.Helper()
		var nodes []string
		eventually(t, name+" gets an address and its announcers", func() error {
			got, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: name})
			if err != nil {
				return err
			}
			st := got.GetService().GetStatus()
			if len(st.GetLoadBalancerIps()) != 1 || len(st.GetAnnouncers()) != 1 || len(st.GetAnnouncers()[0].GetNodes()) != 2 {
				return fmt.Errorf("status %v", st)
			}
			vip, nodes = st.GetLoadBalancerIps()[0], st.GetAnnouncers()[0].GetNodes()
			return nil
		})
		for _, n := range nodes {
			hops = append(hops, hop[n])
		}
		return vip, hops
	}
	const services = 4
	names := make([]string, services)
	vips := make([]string, services)
	hops := make([][]string, services)
	for i := range services {
		names[i] = fmt.Sprintf("limited-%d", i)
		svc := lbService(names[i], int32(30120+i), []string{fmt.Sprintf("10.96.0.%d", 120+i)}, nil)
		svc.Status = nil
		createService(t, c, svc, c.Pods())
		vips[i], hops[i] = announcers(names[i])
	}
	for i := range services {
		waitNextHops(t, r, vips[i], hops[i]...)
		sample(t, c.Client, netip.AddrPortFrom(netip.MustParseAddr(vips[i]), 80), 3)
	}

	// Drain one announcer of the first address.
	var drained string
	for n, h := range hop {
		if h == hops[0][0] {
			drained = n
		}
	}
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: drained}); err != nil {
		t.Fatal(err)
	}
	for i := range services {
		if !slices.Contains(hops[i], hop[drained]) {
			// Not the drained node's: the same two, untouched.
			if _, now := announcers(names[i]); !slices.Equal(now, hops[i]) {
				t.Errorf("%s (%s) was not %s's, yet its announcers moved from %v to %v", names[i], vips[i], drained, hops[i], now)
			}
			waitNextHops(t, r, vips[i], hops[i]...)
			continue
		}
		// The drained node's: the other announcer stays, the third joins.
		var want []string
		for n, h := range hop {
			if n != drained {
				want = append(want, h)
			}
		}
		eventually(t, names[i]+"'s announcers without "+drained, func() error {
			if _, now := announcers(names[i]); !slices.Equal(sorted(now), sorted(want)) {
				return fmt.Errorf("announcers %v", now)
			}
			return nil
		})
		waitNextHops(t, r, vips[i], want...)
	}
	for i := range services {
		sample(t, c.Client, netip.AddrPortFrom(netip.MustParseAddr(vips[i]), 80), 3)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// keepAlive is one HTTP/1.1 connection kept open for several requests.
type keepAlive struct {
	conn net.Conn
	r    *bufio.Reader
	// timeout bounds one request and its answer (0: 2 s).
	timeout time.Duration
}

func dialKeepAlive(ctx context.Context, ns *lab.Netns, dst netip.AddrPort) (*keepAlive, error) {
	conn, err := ns.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	return &keepAlive{conn: conn, r: bufio.NewReader(conn)}, nil
}

// Request sends one request and reads the whole answer.
func (k *keepAlive) Request() error {
	k.conn.SetDeadline(time.Now().Add(cmp.Or(k.timeout, 2*time.Second)))
	if _, err := fmt.Fprintf(k.conn, "GET / HTTP/1.1\r\nHost: weir\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err
}

func (k *keepAlive) Close() { k.conn.Close() }

// TestWrongASNIsNamed: a BgpPeer with the router's AS wrong never comes
// up, and the node's status says why, in the words of the NOTIFICATION
// that ended the session ("bad peer as").
func TestWrongASNIsNamed(t *testing.T) {
	// The case: the IPv4 peer has a wrong ASN (the router refuses
	// the session), the IPv6 peer is right. The node must not look as if
	// it received the service's IPv4 address. The router carries each
	// family only over sessions of its own transport, so nothing else
	// carries IPv4.
	router := labRouter
	router.FamilyPerTransport = true
	c, r := startBGPClusterWith(t, func(*lab.Node) []string { return nil }, router)
	ctx := context.Background()
	node1 := c.Nodes[0]
	svc := lbService("wrongas", 30109, []string{"10.96.0.69", "fd00:96::69"}, []string{"203.0.113.69", "2001:db8:113::69"})
	createService(t, c, svc, c.Pods())
	for _, p := range []*weirv1.BgpPeer{
		{Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN + 1, MyAsn: nodeASN},
		{Metadata: &weirv1.ObjectMeta{Name: "upstream-v6"}, Address: lab.RouterLANv6.String(), Asn: routerASN, MyAsn: nodeASN},
	} {
		if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: p}); err != nil {
			t.Fatal(err)
		}
	}
	waitNextHops(t, r, "2001:db8:113::69", node1.IPv6.String(), c.Nodes[1].IPv6.String())
	st := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "node1's session names the bad peer AS", func() error {
		r, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		for _, n := range r.GetNodes() {
			if n.GetName() != node1.Name {
				continue
			}
			for _, s := range n.GetBgpSessions() {
				if s.GetSessionState() != weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED && strings.Contains(s.GetLastError(), "bad peer as") {
					return nil
				}
			}
			return fmt.Errorf("node1's sessions: %v", n.GetBgpSessions())
		}
		return fmt.Errorf("node1 has no status")
	})
	eventually(t, "the service's status names the refused family on every node", func() error {
		resp, err := st.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "wrongas"})
		if err != nil {
			return err
		}
		if got := resp.GetStatus().GetReceivingNodes(); len(got) != 0 {
			hops, _ := r.NextHops(ctx, "203.0.113.69")
			return fmt.Errorf("receiving nodes %q; the IPv4 address reaches none (router: %v; %v)", got, hops, resp.GetStatus().GetNodes())
		}
		for _, n := range resp.GetStatus().GetNodes() {
			var fams []string
			for _, f := range n.GetFamilies() {
				fams = append(fams, fmt.Sprintf("%s %v %s", nodewire.FamilyOf(f), f.GetReceivesExternalTraffic(), f.GetReason()))
			}
			if want := []string{"ipv4 false BGPSessionsDown", "ipv6 true "}; !slices.Equal(fams, want) {
				return fmt.Errorf("%s: families %q, want %q", n.GetNode(), fams, want)
			}
			if n.GetReason() != "BGPSessionsDown" || !strings.Contains(n.GetMessage(), "bad peer as") {
				return fmt.Errorf("%s: reason %q, message %q; want BGPSessionsDown naming the bad peer AS", n.GetNode(), n.GetReason(), n.GetMessage())
			}
		}
		return nil
	})
	// The same through lbctl, as an operator reads it.
	out, err := c.Lbctl(ctx, "describe", "service", "default/wrongas")
	if err != nil {
		t.Fatalf("lbctl describe: %v\n%s", err, out)
	}
	if want := "Not receiving on " + node1.Name + ": ipv4: no established BGP session carries ipv4: " + lab.RouterLANv4.String(); !strings.Contains(out, want) ||
		!strings.Contains(out, "bad peer as") {
		t.Errorf("lbctl describe service: want %q and the bad peer AS\n%s", want, out)
	}

	// The ASN fixed: IPv4 reaches both nodes, and the old error is gone.
	fixed := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN}
	if _, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: fixed}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.69", node1.IPv4.String(), c.Nodes[1].IPv4.String())
	eventually(t, "both families received, no stale error", func() error {
		resp, err := st.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "wrongas"})
		if err != nil {
			return err
		}
		if got := resp.GetStatus().GetReceivingNodes(); len(got) != 2 {
			return fmt.Errorf("receiving nodes %q", got)
		}
		nodes, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		for _, n := range nodes.GetNodes() {
			for _, s := range n.GetBgpSessions() {
				if strings.Contains(s.GetLastError(), "bad peer as") {
					return fmt.Errorf("%s still shows %q for %s", n.GetName(), s.GetLastError(), s.GetPeerAddress())
				}
			}
		}
		return nil
	})
}
