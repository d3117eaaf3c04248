package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

var (
	clusterIPv4 = netip.MustParseAddr("10.96.0.10")
	clusterIPv6 = netip.MustParseAddr("fd00:96::10")
	lbIP        = netip.MustParseAddr("203.0.113.10")
)

const nodePort = 30080

// startCluster runs Weir on two nodes with pods [2, 1] and returns it with
// a cleanup registered even for failing tests.
func startCluster(t *testing.T, agentArgs ...string) *weirlab.Cluster {
	t.Helper()
	return startClusterWith(t, func(c *weirlab.Cluster) { c.AgentArgs = func(*lab.Node) []string { return agentArgs } })
}

// startClusterWith is startCluster with the cluster's settings adjusted.
func startClusterWith(t *testing.T, adjust func(*weirlab.Cluster)) *weirlab.Cluster {
	t.Helper()
	return startClusterOn(t, 1, adjust)
}

// startClusterOn is startClusterWith with servers control hosts.
func startClusterOn(t *testing.T, servers int, adjust func(*weirlab.Cluster)) *weirlab.Cluster {
	t.Helper()
	lab.SkipUnlessPrivileged(t)
	ctx := context.Background()
	c, err := weirlab.Start(ctx, lab.Config{Nodes: 2, PodsPerNode: []int{2, 1}, Servers: servers, Dir: t.TempDir()}, bin, adjust)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", c.Server.Log())
			for i, a := range c.Agents {
				t.Logf("agent %d log:\n%s", i+1, a.Log())
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("tearing down the lab: %v", err)
		}
	})
	// The router sends the load-balancer IP to both nodes (ECMP), as a BGP
	// speaker would.
	if _, err := c.Router.Run(ctx, "ip", "route", "add", lbIP.String()+"/32",
		"nexthop", "via", c.Nodes[0].IPv4.String(), "nexthop", "via", c.Nodes[1].IPv4.String()); err != nil {
		t.Fatal(err)
	}
	return c
}

// webService is a dual-stack LoadBalancer service in front of every pod.
func webService() *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
			ClusterIps: []string{clusterIPv4.String(), clusterIPv6.String()},
			Ports:      []*weirv1.ServicePort{{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: weirlab.PodPort, NodePort: nodePort}},
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{lbIP.String()}},
	}
}

// endpointSlices lists pods as ready endpoints of a service's "http" port,
// one slice per family.
func endpointSlices(service string, pods []*lab.Pod) []*weirv1.EndpointSlice {
	v4 := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: service + "-v4"}, ServiceName: service,
		Ports: []*weirv1.EndpointPort{{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: weirlab.PodPort}}}
	v6 := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: service + "-v6"}, ServiceName: service, Ports: v4.Ports}
	for _, p := range pods {
		v4.Endpoints = append(v4.Endpoints, &weirv1.Endpoint{Addresses: []string{p.IPv4.String()}, NodeName: p.Node.Name})
		v6.Endpoints = append(v6.Endpoints, &weirv1.Endpoint{Addresses: []string{p.IPv6.String()}, NodeName: p.Node.Name})
	}
	return []*weirv1.EndpointSlice{v4, v6}
}

func createWeb(t *testing.T, c *weirlab.Cluster) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: webService()}); err != nil {
		t.Fatal(err)
	}
	for _, s := range endpointSlices("web", c.Pods()) {
		if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitServiceProgrammed(ctx, "default", "web"); err != nil {
		t.Fatal(err)
	}
}

// eventually retries f until it succeeds, for at most 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	wait.For(t, 10*time.Second, what, f)
}

// waitEveryNodeProgrammed waits until every node of the lab is connected
// and programmed through rev: WaitProgrammed alone speaks of the connected
// ones, and a node whose agent has not connected yet, or was cut off its
// server, is not connected.
func waitEveryNodeProgrammed(t *testing.T, c *weirlab.Cluster, what string, rev uint64) {
	t.Helper()
	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, what+" reaches every node", func() error {
		r, err := status.WaitProgrammed(context.Background(), &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(time.Second)})
		if err != nil {
			return err
		}
		for _, n := range r.GetNodes() {
			if !n.GetConnected() || n.GetReason() != "" {
				return fmt.Errorf("%s at revision %d: %s", n.GetName(), n.GetProgrammedVersion(), n.GetReason())
			}
		}
		if len(r.GetNodes()) != len(c.Nodes) || !r.GetProgrammed() {
			return fmt.Errorf("%v", r)
		}
		return nil
	})
}

// answerOnRouter has the rack router accept TCP connections at dst, an
// address beyond every node: a connection that gets there left its node
// as it was sent. It returns the number accepted so far.
func answerOnRouter(t *testing.T, c *weirlab.Cluster, dst netip.AddrPort) func() int64 {
	t.Helper()
	if _, err := c.Router.Run(context.Background(), "ip", "addr", "add", dst.Addr().String()+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	return acceptOn(t, c.Router, dst)
}

// acceptOn accepts TCP connections at dst in ns until the test ends, and
// returns the number accepted so far.
func acceptOn(t *testing.T, ns *lab.Netns, dst netip.AddrPort) func() int64 {
	t.Helper()
	var lis net.Listener
	if err := ns.Do(func() error {
		var err error
		lis, err = net.Listen("tcp", dst.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	return accepted.Load
}

// sample makes n connections from ns to dst and returns the replies.
func sample(t *testing.T, ns *lab.Netns, dst netip.AddrPort, n int) []weirlab.Reply {
	t.Helper()
	var out []weirlab.Reply
	for range n {
		r, err := weirlab.Get(context.Background(), ns, dst)
		if err != nil {
			t.Fatalf("connection from %s to %s: %v", ns, dst, err)
		}
		out = append(out, r)
	}
	return out
}

func isNodeIP(c *weirlab.Cluster, a netip.Addr) bool {
	for _, n := range c.Nodes {
		if n.IPv4 == a {
			return true
		}
	}
	return false
}

func podByName(c *weirlab.Cluster, name string) *lab.Pod {
	for _, p := range c.Pods() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// TestServiceFrontendsMasqueradeAsKubeProxy: by default a connection to
// a node port or load-balancer IP of an externalTrafficPolicy Cluster
// service reaches every pod from an address of the node it entered, never
// the client's, whichever node the pod runs on (kube-proxy's behaviour);
// a pod calling a cluster IP keeps its own address.
func TestServiceFrontendsMasqueradeAsKubeProxy(t *testing.T) {
	c, lbDst := startWeb(t)
	node1 := c.Nodes[0]
	for _, tc := range []struct {
		name    string
		src     *lab.Netns
		dst     netip.AddrPort
		entered *lab.Node // nil: either node (the router's ECMP)
	}{
		{"load-balancer IP from outside", c.Client, lbDst, nil},
		{"node port from outside", c.Client, netip.AddrPortFrom(node1.IPv4, nodePort), node1},
		{"IPv6 node port from outside", c.Client, netip.AddrPortFrom(node1.IPv6, nodePort), node1},
		// From a pod too: node ports and load-balancer IPs of Cluster
		// services are masqueraded whatever the source.
		{"node port from a pod of the other node", c.Nodes[1].Pods[0].Netns, netip.AddrPortFrom(node1.IPv4, nodePort), node1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachReply(t, c, tc.src, tc.dst, func(pod *lab.Pod, got netip.Addr) {
				from := nodeOf(c, got, pod)
				if from == nil || (tc.entered != nil && from != tc.entered) {
					t.Errorf("pod %s on %s saw source %s; want an address of the node the connection entered", pod.Name, pod.Node.Name, got)
				}
			})
		})
	}
	clusterIPFromAPod(t, c)

	t.Run("cluster IP from outside the cluster", func(t *testing.T) {
		// A router with a static route for the service range (here one
		// address) through node1: node1 bridges into the service, and
		// masquerades so that replies come back through it.
		if _, err := c.Router.Run(context.Background(), "ip", "route", "add", clusterIPv4.String()+"/32", "via", node1.IPv4.String()); err != nil {
			t.Fatal(err)
		}
		for _, r := range sample(t, c.Client, netip.AddrPortFrom(clusterIPv4, 80), 20) {
			pod := podByName(c, r.Pod)
			if nodeOf(c, r.RemoteAddr(), pod) != node1 {
				t.Errorf("pod %s saw %s; want an address of node1", r.Pod, r.RemoteAddr())
			}
		}
	})

	t.Run("load-balancer IP of a Local service from a pod keeps the pod's address", func(t *testing.T) {
		svc := lbService("local", 30121, []string{"10.96.0.81"}, []string{"203.0.113.81"})
		svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		svc.Spec.HealthCheckNodePort = 32121
		createService(t, c, svc, c.Pods())
		caller := c.Nodes[1].Pods[0]
		eventually(t, "the endpoints are programmed", func() error {
			_, err := weirlab.Get(context.Background(), caller.Netns, netip.MustParseAddrPort("203.0.113.81:80"))
			return err
		})
		seen := map[string]bool{}
		for _, r := range sample(t, caller.Netns, netip.MustParseAddrPort("203.0.113.81:80"), 40) {
			seen[r.Pod] = true
			if r.Pod != caller.Name && r.RemoteAddr() != caller.IPv4 {
				t.Errorf("pod %s saw %s; want the calling pod's %s (short-circuited, not masqueraded)", r.Pod, r.RemoteAddr(), caller.IPv4)
			}
		}
		if len(seen) != 3 {
			t.Errorf("40 connections from a pod reached %v; want every pod (a pod's traffic ignores the Local policy)", seen)
		}
	})
}

// TestMasqueradeAll: with --masquerade-all, a pod calling a cluster IP
// reaches the endpoints from its node's address, as kube-proxy's flag.
func TestMasqueradeAll(t *testing.T) {
	c := startCluster(t, "--masquerade-all")
	createWeb(t, c)
	caller := c.Nodes[0].Pods[0]
	for _, r := range sample(t, caller.Netns, netip.AddrPortFrom(clusterIPv4, 80), 30) {
		if r.RemoteAddr() == caller.IPv4 {
			t.Errorf("pod %s saw the caller's own address %s; want it masqueraded", r.Pod, r.RemoteAddr())
		}
		if nodeOf(c, r.RemoteAddr(), podByName(c, r.Pod)) != caller.Node {
			t.Errorf("pod %s saw %s; want an address of the caller's node", r.Pod, r.RemoteAddr())
		}
	}
}

// TestPreserveLocalKeepsTheClientAddressOnTheReceivingNode: with
// --masquerade-mode preserve-local, a pod on the node the connection
// entered sees the client; a pod on the other node sees the node that
// forwarded it (masquerade keeps the reply on the DNAT'ing node's path).
func TestPreserveLocalKeepsTheClientAddressOnTheReceivingNode(t *testing.T) {
	c, lbDst := startWeb(t, "--masquerade-mode", "preserve-local")
	node1 := c.Nodes[0]
	for _, tc := range []struct {
		name   string
		dst    netip.AddrPort
		client netip.Addr
	}{
		{"load-balancer IP", lbDst, lab.ClientIPv4},
		{"node port", netip.AddrPortFrom(node1.IPv4, nodePort), lab.ClientIPv4},
		{"IPv6 node port", netip.AddrPortFrom(node1.IPv6, nodePort), lab.ClientIPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachReply(t, c, c.Client, tc.dst, func(pod *lab.Pod, got netip.Addr) {
				if tc.name != "load-balancer IP" {
					want := tc.client
					if pod.Node != node1 {
						want = node1.IPv4
						if tc.client.Is6() {
							want = node1.IPv6
						}
					}
					if got != want {
						t.Errorf("pod %s on %s saw source %s, want %s", pod.Name, pod.Node.Name, got, want)
					}
					return
				}
				// The router picks either node: the pod sees the client
				// when it runs on that node, else the node that
				// forwarded it, never its own node.
				if got != tc.client && (!isNodeIP(c, got) || got == pod.Node.IPv4) {
					t.Errorf("pod %s on %s saw source %s, want the client or the other node", pod.Name, pod.Node.Name, got)
				}
			})
		})
	}
	clusterIPFromAPod(t, c)
}

// startWeb starts a cluster whose agents get agentArgs, with the web
// service, and returns once its load-balancer IP answers the client.
func startWeb(t *testing.T, agentArgs ...string) (*weirlab.Cluster, netip.AddrPort) {
	t.Helper()
	c := startCluster(t, agentArgs...)
	createWeb(t, c)
	lbDst := netip.AddrPortFrom(lbIP, 80)
	eventually(t, "the load-balancer IP answers", func() error {
		_, err := weirlab.Get(context.Background(), c.Client, lbDst)
		return err
	})
	return c, lbDst
}

// eachReply makes 40 connections from ns to dst and calls check with the
// pod that answered each and the source it saw; every pod must answer
// (uniform random choice).
func eachReply(t *testing.T, c *weirlab.Cluster, ns *lab.Netns, dst netip.AddrPort, check func(pod *lab.Pod, saw netip.Addr)) {
	t.Helper()
	seen := map[string]int{}
	for _, r := range sample(t, ns, dst, 40) {
		seen[r.Pod]++
		pod := podByName(c, r.Pod)
		if pod == nil {
			t.Fatalf("reply from unknown pod %q", r.Pod)
		}
		check(pod, r.RemoteAddr())
	}
	if len(seen) != 3 {
		t.Errorf("40 connections reached %v; want all 3 pods (uniform random choice)", seen)
	}
}

// nodeOf is the node one of whose addresses a is, as a pod on pod's node
// sees it: another node's LAN address, or its own node's address on the
// pod's side of the link (169.254.1.1 for IPv4, the node's LAN address
// for IPv6); nil for any other address.
func nodeOf(c *weirlab.Cluster, a netip.Addr, pod *lab.Pod) *lab.Node {
	if a == netip.MustParseAddr("169.254.1.1") {
		return pod.Node
	}
	for _, n := range c.Nodes {
		if a == n.IPv4 || a == n.IPv6 {
			return n
		}
	}
	return nil
}

// clusterIPFromAPod: a pod calling a cluster IP keeps its address in
// every mode, and one reaching itself is masqueraded.
func clusterIPFromAPod(t *testing.T, c *weirlab.Cluster) {
	n1p1 := c.Nodes[0].Pods[0]
	t.Run("cluster IP from a pod keeps the pod's address", func(t *testing.T) {
		for _, fam := range []struct {
			vip, src netip.Addr
		}{{clusterIPv4, n1p1.IPv4}, {clusterIPv6, n1p1.IPv6}} {
			seen := map[string]int{}
			for _, r := range sample(t, n1p1.Netns, netip.AddrPortFrom(fam.vip, 80), 40) {
				seen[r.Pod]++
				got := r.RemoteAddr()
				if r.Pod == n1p1.Name {
					// Hairpin: the pod reached itself, so it must not see
					// its own address (it would answer itself directly).
					if got == fam.src {
						t.Errorf("hairpin connection to %s was not masqueraded", fam.vip)
					}
				} else if got != fam.src {
					t.Errorf("pod %s saw %s via %s, want the caller's %s", r.Pod, got, fam.vip, fam.src)
				}
			}
			if len(seen) != 3 {
				t.Errorf("40 connections to %s reached %v; want all 3 pods", fam.vip, seen)
			}
		}
	})
}

func TestServiceWithoutEndpointsRejects(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	svc := webService()
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(clusterIPv4, 80),
		netip.AddrPortFrom(c.Nodes[0].IPv4, nodePort),
	} {
		eventually(t, "connection to "+dst.String()+" is refused", func() error {
			start := time.Now()
			_, err := weirlab.Get(ctx, c.Nodes[0].Pods[0].Netns, dst)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				return errors.New("got " + errString(err) + ", want connection refused")
			}
			if d := time.Since(start); d > time.Second {
				return errors.New("refusal took " + d.String() + ": dropped, not rejected?")
			}
			return nil
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "success"
	}
	return err.Error()
}

// TestForwardingSurvivesServerAndAgentRestarts: the server going away stops
// nothing; it comes back with every service; an agent killed and restarted
// converges without a window where the service is unreachable.
func TestForwardingSurvivesServerAndAgentRestarts(t *testing.T) {
	c := startCluster(t)
	createWeb(t, c)
	ctx := context.Background()
	dst := netip.AddrPortFrom(c.Nodes[0].IPv4, nodePort)
	eventually(t, "node port answers", func() error {
		_, err := weirlab.Get(ctx, c.Client, dst)
		return err
	})

	if err := c.Server.Stop(); err != nil {
		t.Fatal(err)
	}
	sample(t, c.Client, dst, 10) // fails the test on any error

	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatalf("service lost across restart: %v", err)
	}
	if ips := got.GetService().GetSpec().GetClusterIps(); len(ips) != 2 || ips[0] != clusterIPv4.String() {
		t.Errorf("restored service has cluster IPs %v", ips)
	}
	// Agents resync from the restarted server: drop node2's pod and see
	// node1's agent stop sending there.
	v4 := endpointSlices("web", c.Nodes[0].Pods)[0]
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: v4}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node1 stops using the removed endpoint", func() error {
		for _, r := range sample(t, c.Client, dst, 15) {
			if r.Pod == "n2p1" {
				return errors.New("still reached n2p1")
			}
		}
		return nil
	})

	// Restart node1's agent while a client keeps connecting.
	markerBefore := generationMarker(t, c.Nodes[0])
	done := keepConnecting(c.Client, dst)
	time.Sleep(200 * time.Millisecond)
	if err := c.RestartAgent(0); err != nil {
		t.Fatal(err)
	}
	// Give the new agent time to connect and apply its full state.
	time.Sleep(2 * time.Second)
	if failures, total := done(); failures != 0 || total < 20 {
		t.Errorf("%d of %d connections failed across the agent restart; want 0 of at least 20", failures, total)
	}
	// Nothing changed while it was away: it adopted the table it found,
	// where a switch would have loaded the other generation.
	if after := generationMarker(t, c.Nodes[0]); after != markerBefore {
		t.Errorf("the restarted agent's table carries marker %s, before %s; want the table adopted as it was", after, markerBefore)
	}
	// The new agent took over the table: a later change reaches the kernel.
	v4all := endpointSlices("web", c.Pods())[0]
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: v4all}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted agent programs a new endpoint", func() error {
		for _, r := range sample(t, c.Client, dst, 15) {
			if r.Pod == "n2p1" {
				return nil
			}
		}
		return errors.New("n2p1 not reached")
	})
}

// generationMarker is the name of the marker chain of node's IPv4 table:
// the generation that forwards, and the digest of what it holds.
func generationMarker(t *testing.T, node *lab.Node) string {
	t.Helper()
	out, err := node.Run(context.Background(), "nft", "list", "chains", "ip")
	if err != nil {
		t.Fatalf("nft list chains: %v", err)
	}
	var markers []string
	for _, line := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "chain generation_"); ok {
			markers = append(markers, "generation_"+strings.TrimSuffix(name, " {"))
		}
	}
	if len(markers) != 1 {
		t.Fatalf("node %s's table has markers %v; want one", node.Name, markers)
	}
	return markers[0]
}

func TestInvalidServiceIsRejectedAndNotStored(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	_, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "bad"},
		Spec:     &weirv1.ServiceSpec{ClusterIps: []string{"10.96.0.300"}, Ports: []*weirv1.ServicePort{{Port: 80}}},
	}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	if _, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "bad"}); status.Code(err) != codes.NotFound {
		t.Errorf("rejected service was stored: %v", err)
	}
}

// keepConnecting connects from ns to dst every 10 ms until done is called,
// which tells how many of how many connections failed.
func keepConnecting(ns *lab.Netns, dst netip.AddrPort) (done func() (failures, total int64)) {
	var fails, all atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := weirlab.Get(context.Background(), ns, dst); err != nil {
				fails.Add(1)
			}
			all.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func() (int64, int64) {
		close(stop)
		wg.Wait()
		return fails.Load(), all.Load()
	}
}

// TestDetectLocalModes: kube-proxy's --detect-local-mode decides whether a
// pod calling a Local service's load-balancer IP is short-circuited to
// every endpoint (a pod of the cluster) or held to its node's own
// endpoints like an outside client (here: none, so dropped). The service's
// endpoints are node1's pods; the caller is node2's pod, on interface p1.
func TestDetectLocalModes(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		local bool
	}{
		{[]string{"--detect-local-mode", "ClusterCIDR"}, true},
		{[]string{"--detect-local-mode", "NodeCIDR"}, true},
		{[]string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "p"}, true},
		{[]string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "cali"}, false},
		{[]string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"}, false},
		{[]string{"--detect-local-mode", "None"}, false},
	} {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			c := startCluster(t, tc.args...)
			node1 := c.Nodes[0]
			svc := lbService("detect", 30123, []string{"10.96.0.83"}, []string{"203.0.113.83"})
			svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
			svc.Spec.HealthCheckNodePort = 32123
			createService(t, c, svc, node1.Pods)
			caller := c.Nodes[1].Pods[0]
			vip := netip.MustParseAddrPort("203.0.113.83:80")
			// The cluster IP answers the caller either way: the rules are in.
			sample(t, caller.Netns, netip.MustParseAddrPort("10.96.0.83:80"), 3)
			if !tc.local {
				expectDropped(t, caller.Netns, vip)
				return
			}
			for _, r := range sample(t, caller.Netns, vip, 10) {
				if r.RemoteAddr() != caller.IPv4 {
					t.Errorf("pod %s saw %s; want the caller's %s", r.Pod, r.RemoteAddr(), caller.IPv4)
				}
			}
		})
	}
}

// TestUnallocatedClusterIPsAreDropped: with --service-cidr, a connection
// to an address of the range that no service holds is dropped on the node;
// without it the node routes it out by its default route (here to the
// rack router, which answers on that address: the control).
func TestUnallocatedClusterIPsAreDropped(t *testing.T) {
	for _, withRanges := range []bool{false, true} {
		t.Run(fmt.Sprintf("service-cidr %v", withRanges), func(t *testing.T) {
			var args []string
			if withRanges {
				args = []string{"--service-cidr", "10.96.0.0/16,fd00:96::/112"}
			}
			c := startCluster(t, args...)
			createWeb(t, c)
			ctx := context.Background()
			unallocated := netip.MustParseAddrPort("10.96.99.99:80")
			answerOnRouter(t, c, unallocated)
			pod := c.Nodes[0].Pods[0]
			// An allocated cluster IP still answers.
			sample(t, pod.Netns, netip.AddrPortFrom(clusterIPv4, 80), 3)
			if withRanges {
				expectDropped(t, pod.Netns, unallocated)
				return
			}
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			conn, err := pod.Netns.DialContext(dctx, "tcp", unallocated.String())
			if err != nil {
				t.Fatalf("without --service-cidr the connection should leave the node and reach the router: %v", err)
			}
			conn.Close()
			// The same range said once on the server (as the Kubernetes
			// source says the cluster's ServiceCIDR objects) reaches
			// every node: dropped from then on.
			created, err := c.Registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{
				Metadata: &weirv1.ObjectMeta{Name: "kubernetes"}, Cidrs: []string{"10.96.0.0/16", "fd00:96::/112"}}})
			if err != nil {
				t.Fatal(err)
			}
			rev, err := strconv.ParseUint(created.GetServiceCidr().GetMetadata().GetResourceVersion(), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			w, err := weirv1.NewStatusServiceClient(c.Conn).WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(10 * time.Second)})
			if err != nil || !w.GetProgrammed() {
				t.Fatalf("WaitProgrammed(%d): %v, %v", rev, w, err)
			}
			expectDropped(t, pod.Netns, unallocated)
			sample(t, pod.Netns, netip.AddrPortFrom(clusterIPv4, 80), 3)
		})
	}
}

// TestFlushedRulesetIsRepaired: an nftables service reloading on a node
// (`nft flush ruleset`) takes Weir's tables with it, and the node stops
// forwarding its services. The agent puts them back within seconds,
// without a change from the server, and counts the repair.
func TestFlushedRulesetIsRepaired(t *testing.T) {
	c, _ := startWeb(t)
	ctx := context.Background()
	node1 := c.Nodes[0]
	viaNode1 := netip.AddrPortFrom(node1.IPv4, nodePort)
	if _, err := weirlab.Get(ctx, c.Client, viaNode1); err != nil {
		t.Fatalf("node1's node port before the flush: %v", err)
	}
	if _, err := node1.Run(ctx, "nft", "flush", "ruleset"); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	eventually(t, "node1's node port answers again", func() error {
		_, err := weirlab.Get(ctx, c.Client, viaNode1)
		return err
	})
	t.Logf("node1 forwarded again %s after the flush", time.Since(flushed).Round(time.Millisecond))
	// Counted once the repair is over (forwarding is back a little
	// before: stale UDP entries are cleared last).
	eventually(t, "node1 counts the repair", func() error {
		metrics, err := httpGet(t, node1.Netns, "http://127.0.0.1:10249/metrics")
		if err != nil {
			return err
		}
		if n, err := metricValue(metrics.body, "weir_datapath_table_repairs_total"); err != nil || n < 1 {
			return fmt.Errorf("weir_datapath_table_repairs_total %v (%v); want at least 1", n, err)
		}
		return nil
	})
}
