package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// udpClient is a UDP socket bound to one source port inside a namespace,
// so that every datagram belongs to the same conntrack entry.
type udpClient struct{ conn *net.UDPConn }

func newUDPClient(t *testing.T, ns *lab.Netns, port int) *udpClient {
	t.Helper()
	var conn *net.UDPConn
	if err := ns.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &udpClient{conn}
}

// ask sends one datagram to dst and returns the pod that answered, or an
// error when nothing answers within 300 ms.
func (c *udpClient) ask(dst netip.AddrPort) (string, error) {
	if _, err := c.conn.WriteToUDPAddrPort([]byte("hello"), dst); err != nil {
		return "", err
	}
	c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 512)
	n, _, err := c.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", err
	}
	var r weirlab.Reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return "", err
	}
	return r.Pod, nil
}

// answeredBy is a check for eventually: one datagram to dst is answered,
// by the pod named want.
func (c *udpClient) answeredBy(dst netip.AddrPort, want string) func() error {
	return func() error {
		pod, err := c.ask(dst)
		if err != nil {
			return err
		}
		if pod != want {
			return fmt.Errorf("answered by %s", pod)
		}
		return nil
	}
}

// sendUnanswered sends datagrams to dst that nothing answers yet, and
// checks that node kept a conntrack entry for them: the flow a later
// change must not leave where these went.
func (c *udpClient) sendUnanswered(t *testing.T, node *lab.Node, dst netip.AddrPort) {
	t.Helper()
	for range 3 {
		if pod, err := c.ask(dst); err == nil {
			t.Fatalf("%s answered from %s before it should", dst, pod)
		}
	}
	sport := fmt.Sprintf("sport=%d", c.conn.LocalAddr().(*net.UDPAddr).Port)
	if ct, err := node.Netns.Run(context.Background(), "conntrack", "-L", "-p", "udp", "--orig-dst", dst.Addr().String()); err != nil || !strings.Contains(ct, sport) {
		t.Fatalf("%s holds no entry for the datagrams sent to %s (%v):\n%s", node.Name, dst, err, ct)
	}
}

// createUDPServiceWhole creates slice, then svc: a node gets the service
// whole, with its endpoints, in one change. It returns the service's
// revision.
func createUDPServiceWhole(t *testing.T, c *weirlab.Cluster, svc *weirv1.Service, slice *weirv1.EndpointSlice) uint64 {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
		t.Fatal(err)
	}
	created, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	return revisionOf(created.GetService().GetMetadata())
}

func udpService(name string, nodePort int32, clusterIPs ...string) *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: name},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_NODE_PORT,
			ClusterIps: clusterIPs,
			Ports:      []*weirv1.ServicePort{{Name: "dns", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: weirlab.PodPort, NodePort: nodePort}},
		},
	}
}

func udpSlice(service string, fam family, pods ...*lab.Pod) *weirv1.EndpointSlice {
	s := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: service + "-" + strings.ToLower(fam.name)}, ServiceName: service,
		Ports: []*weirv1.EndpointPort{{Name: "dns", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: weirlab.PodPort}}}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, &weirv1.Endpoint{Addresses: []string{fam.pod(p).String()}, NodeName: p.Node.Name})
	}
	return s
}

// TestUDPFlowsFollowEndpointChanges: a UDP client that keeps its source
// port is not stuck on a removed endpoint, nor on the rejection cached while
// the service had none, in either family.
func TestUDPFlowsFollowEndpointChanges(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	n1p1, n2p1 := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: udpService("dns", 30053, "10.96.0.53", "fd00:96::53")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the agents program the rejection
	for i, fam := range families("10.96.0.53", "fd00:96::53", "203.0.113.53", "2001:db8:113::53") {
		t.Run(fam.name, func(t *testing.T) {
			dst := netip.AddrPortFrom(fam.node(c.Nodes[0]), 30053)
			client := newUDPClient(t, c.Client, 40053+i)
			// No endpoints yet: the client's datagrams are refused.
			for range 3 {
				if pod, err := client.ask(dst); err == nil {
					t.Fatalf("service without endpoints answered from %s", pod)
				}
			}
			if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: udpSlice("dns", fam, n1p1)}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the same UDP flow reaches the first endpoint", client.answeredBy(dst, n1p1.Name))
			// Move the endpoint: the flow must follow, although n1p1
			// still answers whoever reaches it.
			if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: udpSlice("dns", fam, n2p1)}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the same UDP flow moves to the new endpoint", client.answeredBy(dst, n2p1.Name))
		})
	}
}

// TestUDPFlowsStayOnATerminatingServingEndpoint is kube-proxy's graceful
// UDP drain: a flow on an endpoint that turns terminating but still serves
// stays on it (new flows go to the ready endpoint); once the endpoint stops
// serving, the flow moves.
func TestUDPFlowsStayOnATerminatingServingEndpoint(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	n1p1, n2p1 := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]
	fam := families("10.96.0.54", "fd00:96::54", "203.0.113.54", "2001:db8:113::54")[0]
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: udpService("drain", 30054, "10.96.0.54")}); err != nil {
		t.Fatal(err)
	}
	slice := func(n2 *weirv1.EndpointConditions) *weirv1.EndpointSlice {
		s := udpSlice("drain", fam, n1p1)
		if n2 != nil {
			s.Endpoints = append(s.Endpoints, &weirv1.Endpoint{Addresses: []string{n2p1.IPv4.String()}, NodeName: n2p1.Node.Name, Conditions: n2})
		}
		return s
	}
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice(nil)}); err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddrPort("10.96.0.54:53")
	// A flow on n1p1 alone, then n2p1 joins: the flow stays where it is.
	client := newUDPClient(t, c.Client, 40060)
	if _, err := c.Router.Run(ctx, "ip", "route", "replace", "10.96.0.54/32", "via", c.Nodes[0].IPv4.String()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the flow reaches n1p1", client.answeredBy(dst, n1p1.Name))
	yes, no := true, false
	ready := &weirv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no}
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: slice(ready)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// n1p1 terminates but serves: its flow stays; others go to n2p1.
	s := slice(ready)
	s.Endpoints[0].Conditions = &weirv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
	r, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s})
	if err != nil {
		t.Fatal(err)
	}
	rev := revisionOf(r.GetEndpointSlice().GetMetadata())
	if w, err := weirv1.NewStatusServiceClient(c.Conn).WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev}); err != nil || !w.GetProgrammed() {
		t.Fatalf("WaitProgrammed: %v %v", w, err)
	}
	for range 5 {
		if err := client.answeredBy(dst, n1p1.Name)(); err != nil {
			t.Fatalf("the flow on the terminating, serving endpoint: %v; want it kept there", err)
		}
	}
	other := newUDPClient(t, c.Client, 40061)
	if pod, err := other.ask(dst); err != nil || pod != n2p1.Name {
		t.Errorf("a new flow: %s, %v; want the ready n2p1", pod, err)
	}
	// It stops serving: the flow moves.
	s.Endpoints[0].Conditions = &weirv1.EndpointConditions{Ready: &no, Serving: &no, Terminating: &yes}
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the flow moves to n2p1", client.answeredBy(dst, n2p1.Name))
}

// TestUDPFlowSentBeforeItsServiceExisted: a client that sends to a cluster
// IP before its service reaches the node (a resolver retrying while the
// service is being created) leaves a conntrack entry for a datagram the
// node routed as it was; once the service is there, the same flow must
// reach its endpoint, not keep going where the first datagram went.
func TestUDPFlowSentBeforeItsServiceExisted(t *testing.T) {
	c := startCluster(t)
	// The nodes forward already (their tables, and so conntrack, are
	// in place), as on a running node whose client sends too early.
	createWeb(t, c)
	n1p1 := c.Nodes[0].Pods[0]
	fam := families("10.96.0.56", "fd00:96::56", "203.0.113.56", "2001:db8:113::56")[0]
	dst := netip.MustParseAddrPort("10.96.0.56:53")
	routeVIP(t, c, dst.Addr(), "/32", c.Nodes[0].IPv4)
	client := newUDPClient(t, c.Client, 40062)
	client.sendUnanswered(t, c.Nodes[0], dst)
	createUDPServiceWhole(t, c, udpService("early", 30056, dst.Addr().String()), udpSlice("early", fam, n1p1))
	eventually(t, "the flow sent before the service reaches its endpoint", client.answeredBy(dst, n1p1.Name))
}

// TestUDPFlowFollowsATargetPortChange: the endpoint keeps its address but
// the service's target port changes (a new port of the same pod); the
// client's flow goes to the new port, not on to the old one, where the
// pod may answer no more (kube-proxy clears such flows).
func TestUDPFlowFollowsATargetPortChange(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	createWeb(t, c)
	n1p1 := c.Nodes[0].Pods[0]
	// The same pod answers on a second port under another name.
	if _, err := n1p1.Netns.Start(c.Bin.Echo, "-name", n1p1.Name+"-new-port", "-listen", ":9053"); err != nil {
		t.Fatal(err)
	}
	fam := families("10.96.0.57", "fd00:96::57", "203.0.113.57", "2001:db8:113::57")[0]
	dst := netip.MustParseAddrPort("10.96.0.57:53")
	slice := udpSlice("moved", fam, n1p1)
	createUDPServiceWhole(t, c, udpService("moved", 30057, dst.Addr().String()), slice)
	routeVIP(t, c, dst.Addr(), "/32", c.Nodes[0].IPv4)
	client := newUDPClient(t, c.Client, 40063)
	eventually(t, "the flow reaches the pod's first port", client.answeredBy(dst, n1p1.Name))
	got, err := c.Registry.GetEndpointSlice(ctx, &weirv1.GetEndpointSliceRequest{Namespace: "default", Name: slice.GetMetadata().GetName()})
	if err != nil {
		t.Fatal(err)
	}
	moved := got.GetEndpointSlice()
	moved.Ports[0].Port = 9053
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: moved}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the same flow reaches the pod's new port", client.answeredBy(dst, n1p1.Name+"-new-port"))
}

// TestUDPFlowSentBeforeTheAgentStarted: a node comes up (its tables gone,
// as after a reboot; a host firewall's rules keep conntrack on) while a
// client already sends to a UDP service through it; once the agent has
// written the node's tables, the same flow reaches the endpoint instead of
// going on where its first datagrams went.
func TestUDPFlowSentBeforeTheAgentStarted(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	n1p1, node1 := c.Nodes[0].Pods[0], c.Nodes[0]
	fam := families("10.96.0.58", "fd00:96::58", "203.0.113.58", "2001:db8:113::58")[0]
	dst := netip.MustParseAddrPort("10.96.0.58:53")
	rev := createUDPServiceWhole(t, c, udpService("boot", 30058, dst.Addr().String()), udpSlice("boot", fam, n1p1))
	waitEveryNodeProgrammed(t, c, "the service", rev)
	if err := c.Agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"delete", "table", "ip", "weir"}, {"delete", "table", "ip6", "weir"},
		{"add", "table", "inet", "host"},
		{"add", "chain", "inet", "host", "input", "{ type filter hook input priority 0 ; }"},
		{"add", "rule", "inet", "host", "input", "ct", "state", "established,related", "accept"},
	} {
		if out, err := node1.Netns.Run(ctx, "nft", args...); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	routeVIP(t, c, dst.Addr(), "/32", node1.IPv4)
	client := newUDPClient(t, c.Client, 40064)
	client.sendUnanswered(t, node1, dst)
	if err := c.StopAndRestartAgent(0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the flow sent before the agent started reaches its endpoint", client.answeredBy(dst, n1p1.Name))
}
