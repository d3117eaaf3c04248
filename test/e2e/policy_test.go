package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// family picks one address family's addresses in the lab.
type family struct {
	name        string
	clusterIP   netip.Addr
	lbIP        netip.Addr
	client      netip.Addr
	node        func(*lab.Node) netip.Addr
	pod         func(*lab.Pod) netip.Addr
	routePrefix string
}

func families(clusterIPv4, clusterIPv6, lbIPv4, lbIPv6 string) []family {
	return []family{
		{"IPv4", netip.MustParseAddr(clusterIPv4), netip.MustParseAddr(lbIPv4), lab.ClientIPv4,
			func(n *lab.Node) netip.Addr { return n.IPv4 }, func(p *lab.Pod) netip.Addr { return p.IPv4 }, "/32"},
		{"IPv6", netip.MustParseAddr(clusterIPv6), netip.MustParseAddr(lbIPv6), lab.ClientIPv6,
			func(n *lab.Node) netip.Addr { return n.IPv6 }, func(p *lab.Pod) netip.Addr { return p.IPv6 }, "/128"},
	}
}

func createService(t *testing.T, c *weirlab.Cluster, svc *weirv1.Service, endpoints []*lab.Pod) {
	t.Helper()
	createServiceWithSlices(t, c, svc, endpointSlices(svc.GetMetadata().GetName(), endpoints))
}

// createServiceWithSlices creates svc and its endpoint slices and waits
// until every node has programmed them.
func createServiceWithSlices(t *testing.T, c *weirlab.Cluster, svc *weirv1.Service, slices []*weirv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	created, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	rev := revisionOf(created.GetService().GetMetadata())
	for _, s := range slices {
		created, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: s})
		if err != nil {
			t.Fatal(err)
		}
		rev = max(rev, revisionOf(created.GetEndpointSlice().GetMetadata()))
	}
	if _, other := svc.GetMetadata().GetLabels()["service.kubernetes.io/service-proxy-name"]; other {
		return // no agent ever has it
	}
	// Tests send through particular nodes: each must hold the service and
	// its endpoints.
	if err := c.WaitServiceProgrammed(ctx, svc.GetMetadata().GetNamespace(), svc.GetMetadata().GetName()); err != nil {
		t.Fatal(err)
	}
	r, err := weirv1.NewStatusServiceClient(c.Conn).WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(10 * time.Second)})
	if err != nil || !r.GetProgrammed() {
		t.Fatalf("WaitProgrammed(%d): %v, %v", rev, r, err)
	}
}

func lbService(name string, nodePort int32, clusterIPs, lbIPs []string) *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: name},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
			ClusterIps: clusterIPs,
			Ports:      []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: weirlab.PodPort, NodePort: nodePort}},
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: lbIPs},
	}
}

// expectDropped asserts that a connection neither succeeds nor is refused:
// the SYN is dropped, so the dial times out.
func expectDropped(t *testing.T, ns *lab.Netns, dst netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	conn, err := ns.DialContext(ctx, "tcp", dst.String())
	if err == nil {
		conn.Close()
		t.Errorf("connection from %s to %s succeeded; want it dropped", ns, dst)
		return
	}
	var nerr net.Error
	if !(errors.As(err, &nerr) && nerr.Timeout()) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("connection from %s to %s failed with %v; want a timeout (dropped, not rejected)", ns, dst, err)
	}
}

func routeVIP(t *testing.T, c *weirlab.Cluster, vip netip.Addr, plen string, via netip.Addr) {
	t.Helper()
	if _, err := c.Router.Run(context.Background(), "ip", "route", "replace", vip.String()+plen, "via", via.String()); err != nil {
		t.Fatal(err)
	}
}

// TestExternalTrafficPolicyLocal: external clients reach only the node's
// own endpoints and keep their address; a node without one drops; pods
// reach the VIP from any node.
func TestExternalTrafficPolicyLocal(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	svc := lbService("local", 30090, []string{"10.96.0.20", "fd00:96::20"}, []string{"203.0.113.20", "2001:db8:113::20"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32000
	node1, node2 := c.Nodes[0], c.Nodes[1]
	n1p1, n2p1 := node1.Pods[0], node2.Pods[0]
	createService(t, c, svc, []*lab.Pod{n1p1}) // the only endpoint is on node1

	for _, fam := range families("10.96.0.20", "fd00:96::20", "203.0.113.20", "2001:db8:113::20") {
		t.Run(fam.name, func(t *testing.T) {
			vip := netip.AddrPortFrom(fam.lbIP, 80)
			routeVIP(t, c, fam.lbIP, fam.routePrefix, fam.node(node1))
			eventually(t, "the VIP answers through node1", func() error {
				_, err := weirlab.Get(ctx, c.Client, vip)
				return err
			})
			for _, dst := range []netip.AddrPort{vip, netip.AddrPortFrom(fam.node(node1), 30090)} {
				for _, r := range sample(t, c.Client, dst, 5) {
					if r.Pod != n1p1.Name || r.RemoteAddr() != fam.client {
						t.Errorf("via %s: pod %s saw %s; want n1p1 seeing the client %s", dst, r.Pod, r.RemoteAddr(), fam.client)
					}
				}
			}
			// node2 has no local endpoint: external traffic is dropped
			// there, through the VIP and on its node port.
			routeVIP(t, c, fam.lbIP, fam.routePrefix, fam.node(node2))
			expectDropped(t, c.Client, vip)
			expectDropped(t, c.Client, netip.AddrPortFrom(fam.node(node2), 30090))
			// A pod on node2 still reaches the VIP (short-circuited to
			// every endpoint) and keeps its address.
			for _, r := range sample(t, n2p1.Netns, vip, 3) {
				if r.Pod != n1p1.Name || r.RemoteAddr() != fam.pod(n2p1) {
					t.Errorf("pod n2p1 via the VIP reached %s seeing %s; want n1p1 seeing %s", r.Pod, r.RemoteAddr(), fam.pod(n2p1))
				}
			}
			// node2 itself too (host_services): to every endpoint, not
			// dropped for want of a local one.
			for _, r := range sample(t, node2.Netns, vip, 3) {
				if r.Pod != n1p1.Name || r.RemoteAddr() != fam.node(node2) {
					t.Errorf("node2 via the VIP reached %s seeing %s; want n1p1 seeing %s", r.Pod, r.RemoteAddr(), fam.node(node2))
				}
			}
		})
	}
}

// TestInternalTrafficPolicyLocal: in-cluster traffic stays on the node and
// is dropped where the service has no endpoint.
func TestInternalTrafficPolicyLocal(t *testing.T) {
	c := startCluster(t)
	svc := lbService("itp", 0, []string{"10.96.0.21", "fd00:96::21"}, nil)
	svc.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP
	svc.Status = nil
	svc.Spec.InternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	n1p1, n1p2, n2p1 := c.Nodes[0].Pods[0], c.Nodes[0].Pods[1], c.Nodes[1].Pods[0]
	createService(t, c, svc, []*lab.Pod{n1p1, n2p1})
	for _, fam := range families("10.96.0.21", "fd00:96::21", "203.0.113.21", "2001:db8:113::21") {
		t.Run(fam.name, func(t *testing.T) {
			dst := netip.AddrPortFrom(fam.clusterIP, 80)
			eventually(t, "the cluster IP answers", func() error {
				_, err := weirlab.Get(context.Background(), n1p2.Netns, dst)
				return err
			})
			for _, r := range sample(t, n1p2.Netns, dst, 10) {
				if r.Pod != n1p1.Name {
					t.Errorf("pod n1p2 reached %s through an internal-Local service; want only node1's n1p1", r.Pod)
				}
			}
		})
	}
	// Remove node1's endpoint: node1's pods are dropped, not sent to node2.
	ctx := context.Background()
	for _, s := range endpointSlices("itp", []*lab.Pod{n2p1}) {
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.21"), 80)
	eventually(t, "node1 stops answering", func() error {
		if _, err := weirlab.Get(ctx, n1p2.Netns, dst); err == nil {
			return errors.New("still answered")
		}
		return nil
	})
	expectDropped(t, n1p2.Netns, dst)
}

// TestLoadBalancerSourceRanges: only sources in the ranges reach the VIP,
// in both families; the node port is not a load-balancer IP and stays open.
func TestLoadBalancerSourceRanges(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	svc := lbService("fw", 30091, []string{"10.96.0.22", "fd00:96::22"}, []string{"203.0.113.22", "2001:db8:113::22"})
	podRanges := map[string]string{"IPv4": "10.0.0.0/8", "IPv6": "fd00:244::/32"}
	clientRanges := map[string]string{"IPv4": lab.ClientIPv4.String() + "/32", "IPv6": "2001:db8:100::/64"}
	svc.Spec.LoadBalancerSourceRanges = []string{podRanges["IPv4"], podRanges["IPv6"]}
	createService(t, c, svc, c.Pods())
	fams := families("10.96.0.22", "fd00:96::22", "203.0.113.22", "2001:db8:113::22")
	for _, fam := range fams {
		vip := netip.AddrPortFrom(fam.lbIP, 80)
		routeVIP(t, c, fam.lbIP, fam.routePrefix, fam.node(c.Nodes[0]))
		eventually(t, "a pod (inside "+podRanges[fam.name]+") reaches the VIP", func() error {
			_, err := weirlab.Get(ctx, c.Nodes[1].Pods[0].Netns, vip)
			return err
		})
		expectDropped(t, c.Client, vip)
		sample(t, c.Client, netip.AddrPortFrom(fam.node(c.Nodes[0]), 30091), 2)
	}

	got, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "fw"})
	if err != nil {
		t.Fatal(err)
	}
	upd := got.GetService()
	upd.Spec.LoadBalancerSourceRanges = append(upd.Spec.LoadBalancerSourceRanges, clientRanges["IPv4"], clientRanges["IPv6"])
	if _, err := c.Registry.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: upd}); err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		eventually(t, "the client is let in once its network is in the ranges", func() error {
			_, err := weirlab.Get(ctx, c.Client, netip.AddrPortFrom(fam.lbIP, 80))
			return err
		})
	}
}
