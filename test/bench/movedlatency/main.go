// Command movedlatency measures, with real packets in a lab, what passing
// a moved connection on costs its packets: the round trip of a request on
// established connections whose node holds them (direct), and on the same
// connections when the router sends their packets to a node 1, 2 or 3
// places before the holder on the ring of moved connections, so that each
// packet crosses that many nodes before the holder takes it. Phases
// alternate, in one run, so the differences survive a noisy machine. The
// holder's counters of packets taken by hops (from the status API) are
// printed beside them: the hop distribution the rules saw.
//
// Four nodes (the ring is in name order: node1 → node2 → node3 → node4 →
// node1), a Cluster service, its connections opened through node1, then
// the router's route to the load-balancer IP moved from node to node.
//
//	go run ./test/bench/movedlatency   # as root
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

var lbIP = netip.MustParseAddr("203.0.113.150")

func main() {
	conns := flag.Int("connections", 20, "long-lived connections")
	requests := flag.Int("requests", 200, "requests per connection in one phase")
	rounds := flag.Int("rounds", 3, "rounds of the four phases")
	flag.Parse()
	if err := run(*conns, *requests, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "movedlatency:", err)
		os.Exit(1)
	}
}

func run(conns, requests, rounds int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespaces and nftables)")
	}
	ctx := context.Background()
	c, closeLab, err := weirlab.StartBuilt(ctx, lab.Config{Nodes: 4, PodsPerNode: []int{1, 1, 1, 1}})
	if err != nil {
		return err
	}
	defer closeLab()
	route := func(node int) error {
		_, err := c.Router.Run(ctx, "ip", "route", "replace", lbIP.String()+"/32", "via", c.Nodes[node].IPv4.String())
		return err
	}
	if err := route(0); err != nil {
		return err
	}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "moved"},
		Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{"10.96.0.150"},
			Ports: []*weirv1.ServicePort{{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: weirlab.PodPort, NodePort: 30150}}},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{lbIP.String()}},
	}}); err != nil {
		return err
	}
	slice := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "moved-1"}, ServiceName: "moved",
		Ports: []*weirv1.EndpointPort{{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: weirlab.PodPort}}}
	for _, p := range c.Pods() {
		slice.Endpoints = append(slice.Endpoints, &weirv1.Endpoint{Addresses: []string{p.IPv4.String()}, NodeName: p.Node.Name})
	}
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
		return err
	}
	if err := c.WaitServiceProgrammed(ctx, "default", "moved"); err != nil {
		return err
	}
	// Every node's probes must have found its next nodes alive.
	time.Sleep(3 * time.Second)

	dst := netip.AddrPortFrom(lbIP, 80)
	var open []*client
	defer func() {
		for _, k := range open {
			k.conn.Close()
		}
	}()
	for range conns {
		k, err := dial(ctx, c.Client, dst)
		if err != nil {
			return err
		}
		open = append(open, k)
		if _, err := k.request(); err != nil {
			return err
		}
	}
	fmt.Printf("%d connections to %s held by node1 (a Cluster service over 4 pods); %d requests each per phase, %d rounds\n", conns, dst, requests, rounds)

	// The router sends to the node that many places before node1.
	phases := []struct {
		name string
		node int
	}{{"direct (node1 holds them)", 0}, {"1 hop (via node4)", 3}, {"2 hops (via node3)", 2}, {"3 hops (via node2)", 1}}
	times := make([][]time.Duration, len(phases))
	for range rounds {
		for i, ph := range phases {
			if err := route(ph.node); err != nil {
				return err
			}
			for range requests {
				for _, k := range open {
					d, err := k.request()
					if err != nil {
						return fmt.Errorf("%s: %w", ph.name, err)
					}
					times[i] = append(times[i], d)
				}
			}
		}
	}
	if err := route(0); err != nil {
		return err
	}
	base := percentile(times[0], 50)
	fmt.Printf("%-28s %10s %10s %10s %14s\n", "phase", "p50", "p90", "p99", "p50 - direct")
	for i, ph := range phases {
		p50 := percentile(times[i], 50)
		fmt.Printf("%-28s %10s %10s %10s %14s\n", ph.name, us(p50), us(percentile(times[i], 90)), us(percentile(times[i], 99)), us(p50-base))
	}

	// What node1's rules counted of the packets peers passed it.
	time.Sleep(6 * time.Second) // agents read their counters every 5 s
	st, err := weirv1.NewStatusServiceClient(c.Conn).ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
	if err != nil {
		return err
	}
	for _, n := range st.GetNodes() {
		m := n.GetMovedConnections()
		fmt.Printf("%s: passed on %d packets (%d connections); took %v packets by hops 1, 2, 3, 4+; %d unowned\n",
			n.GetName(), m.GetPassedPackets(), m.GetPassedConnections(), m.GetTakenPacketsByHops(), m.GetUnownedPackets())
	}
	return nil
}

type client struct {
	conn net.Conn
	r    *bufio.Reader
}

func dial(ctx context.Context, ns *lab.Netns, dst netip.AddrPort) (*client, error) {
	conn, err := ns.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	return &client{conn: conn, r: bufio.NewReader(conn)}, nil
}

// request sends one request and reads the whole answer: its round trip.
func (k *client) request() (time.Duration, error) {
	k.conn.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := fmt.Fprintf(k.conn, "GET / HTTP/1.1\r\nHost: weir\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(start), err
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1e3) }
