// Command demo runs Weir's main job end to end in a lab of network
// namespaces: a server, two node agents, three pods and a client. It
// creates a LoadBalancer service through the API, sends real HTTP requests
// from the client, shows which pod answered and the source address that pod
// saw, and tears everything down. It needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

var (
	clusterIP = netip.MustParseAddr("10.96.0.10")
	lbIP      = netip.MustParseAddr("203.0.113.10")
)

const nodePort = 30080

func main() {
	logs := flag.String("logs", "", "folder for the lab's logs (default: a new folder in $TMPDIR, kept)")
	flag.Parse()
	if err := run(*logs); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(logs string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespaces and nftables)")
	}
	start := time.Now()
	ctx := context.Background()
	step("building weir-server, weir-agent and the pods' echo server")
	bin, removeBin, err := weirlab.BuildTemp(ctx)
	if err != nil {
		return err
	}
	defer removeBin()

	step("starting the lab: client -- router -- rack LAN (control, node1, node2); pods n1p1, n1p2 on node1, n2p1 on node2")
	c, err := weirlab.Start(ctx, lab.Config{Nodes: 2, PodsPerNode: []int{2, 1}, Dir: logs}, bin)
	if err != nil {
		return err
	}
	c.CloseOnInterrupt()
	defer func() {
		step("tearing the lab down (logs kept in %s)", c.Dir)
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: teardown:", err)
		}
	}()
	fmt.Printf("    weir-server on %s:%d, weir-agent on node1 (%s) and node2 (%s)\n", lab.ControlIPv4, weirlab.ServerPort, c.Nodes[0].IPv4, c.Nodes[1].IPv4)

	// The router reaches the VIP through both nodes, as the BGP tier would
	// announce it.
	if _, err := c.Router.Run(ctx, "ip", "route", "add", lbIP.String()+"/32",
		"nexthop", "via", c.Nodes[0].IPv4.String(), "nexthop", "via", c.Nodes[1].IPv4.String()); err != nil {
		return err
	}

	step("creating LoadBalancer service default/web (cluster IP %s, node port %d, VIP %s, externalTrafficPolicy Local) and its endpoints through the gRPC API", clusterIP, nodePort, lbIP)
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
			ClusterIps: []string{clusterIP.String()},
			Ports:      []*weirv1.ServicePort{{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: weirlab.PodPort, NodePort: nodePort}},
			// Local: each node sends external clients to its own pods
			// only, so the pods see the client's address (with Cluster,
			// as kube-proxy, they would see a node's).
			ExternalTrafficPolicy: weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
			HealthCheckNodePort:   32080,
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{lbIP.String()}},
	}}); err != nil {
		return err
	}
	slice := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web-1"}, ServiceName: "web",
		Ports: []*weirv1.EndpointPort{{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: weirlab.PodPort}}}
	for _, p := range c.Pods() {
		slice.Endpoints = append(slice.Endpoints, &weirv1.Endpoint{Addresses: []string{p.IPv4.String()}, NodeName: p.Node.Name})
	}
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
		return err
	}

	vip := netip.AddrPortFrom(lbIP, 80)
	created := time.Now()
	answers := func(dst netip.AddrPort) error {
		for {
			_, err := weirlab.Get(ctx, c.Client, dst)
			if err == nil {
				return nil
			}
			if time.Since(created) > 10*time.Second {
				return fmt.Errorf("%s did not answer within 10 s: %w", dst, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := answers(vip); err != nil {
		return err
	}
	fmt.Printf("    the VIP answered %s after the service was created\n", time.Since(created).Round(time.Millisecond))
	// The VIP answers as soon as one node forwards it; wait for every node.
	for _, n := range c.Nodes {
		if err := answers(netip.AddrPortFrom(n.IPv4, nodePort)); err != nil {
			return err
		}
	}

	show := func(what string, ns *lab.Netns, dst netip.AddrPort, n int) error {
		step("%d HTTP requests from %s to %s (%s)", n, ns.Name, dst, what)
		for range n {
			r, err := weirlab.Get(ctx, ns, dst)
			if err != nil {
				return err
			}
			note := "the client's own address: preserved"
			if r.RemoteAddr() != lab.ClientIPv4 {
				note = "a node's address: masqueraded"
			}
			fmt.Printf("    answered by pod %-5s  source the pod saw: %-15s  (%s)\n", r.Pod, r.RemoteAddr(), note)
		}
		return nil
	}
	if err := show("the load-balancer VIP, through the router", c.Client, vip, 4); err != nil {
		return err
	}
	if err := show("node1's node port", c.Client, netip.AddrPortFrom(c.Nodes[0].IPv4, nodePort), 6); err != nil {
		return err
	}
	step("what node1 programmed: the TCP backends map of its table (nft list table ip weir):")
	out, err := c.Nodes[0].Run(ctx, "sh", "-c", "nft list table ip weir | sed -n '/map tcp_backends_/,/}/p'")
	if err != nil {
		return err
	}
	fmt.Print(out)
	step("done in %s", time.Since(start).Round(100*time.Millisecond))
	return nil
}
