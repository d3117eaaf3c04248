// Command bgpwithdraw measures how fast the routers stop sending a VIP's
// traffic to a node whose last ready local endpoint went: a pod flaps
// between two nodes of the lab, whose agents (or, with -placement tier, a
// load-balancer speaker) announce the VIP over BGP to a real FRR router;
// each time, the router's kernel route is polled until the old node's next
// hop is gone. With -placement tier it then cuts a node's link -deaths
// times (the membership must find it dead) and kills an agent.
//
//	go run ./test/bench/bgpwithdraw -flaps 50
//	go run ./test/bench/bgpwithdraw -placement tier -flaps 50 -deaths 20
//
// Times are from sending the endpoint update to the server, cutting the
// link or killing the agent.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

func main() {
	flaps := flag.Int("flaps", 50, "endpoint moves to time")
	workQueue := flag.Bool("zebra-work-queue-1", false, "configure FRR's zebra with 'zebra work-queue 1' (trims its batching hold)")
	minSync := flag.Duration("min-sync-period", 50*time.Millisecond, "the server's --min-sync-period")
	placement := flag.String("placement", "node", "node (the agents' speakers) or tier (a load-balancer speaker)")
	deaths := flag.Int("deaths", 20, "with -placement tier: node link cuts to time")
	flag.Parse()
	if *placement != "node" && *placement != "tier" {
		fmt.Fprintln(os.Stderr, "bgpwithdraw: -placement: node or tier")
		os.Exit(2)
	}
	if err := run(*flaps, *workQueue, *minSync, *placement == "tier", *deaths); err != nil {
		fmt.Fprintln(os.Stderr, "bgpwithdraw:", err)
		os.Exit(1)
	}
}

// memberPort is the membership's port on the nodes and the LB host.
const memberPort = "7946"

func run(flaps int, workQueue bool, minSync time.Duration, tier bool, deaths int) error {
	ctx := context.Background()
	c, closeCluster, err := weirlab.StartBuilt(ctx, lab.Config{Nodes: 2, PodsPerNode: []int{1, 1}}, func(c *weirlab.Cluster) {
		c.ServerArgs = []string{"--min-sync-period", minSync.String()}
		c.AgentArgs = func(n *lab.Node) []string {
			if tier {
				return []string{"--memberlist-bind-address", n.IPv4.String() + ":" + memberPort, "--memberlist-join", lab.ControlIPv4.String() + ":" + memberPort}
			}
			return []string{"--bgp-asn", "64512", "--bgp-router-id", n.IPv4.String(), "--bgp-peers", lab.RouterLANv4.String() + "/64500"}
		}
	})
	if err != nil {
		return err
	}
	defer closeCluster()
	if tier {
		// Slow probes (three failures a second apart): a dead node must be
		// found by the membership.
		sp, err := c.StartSpeaker("lb1", "--bgp-asn", "64512", "--bgp-router-id", lab.ControlIPv4.String(), "--bgp-peers", lab.RouterLANv4.String()+"/64500",
			"--memberlist-bind-address", lab.ControlIPv4.String()+":"+memberPort,
			"--memberlist-join", c.Nodes[0].IPv4.String()+":"+memberPort+","+c.Nodes[1].IPv4.String()+":"+memberPort,
			"--probe-interval", "1s", "--probe-timeout", "500ms", "--probe-fall", "3")
		if err != nil {
			return err
		}
		defer sp.Stop()
	}
	cfg := frr.Config{ASN: 64500, RouterID: lab.RouterLANv4.String(), PeerASN: 64512, ListenRanges: []string{"192.0.2.0/24"}}
	r, err := frr.StartTemp(ctx, c.Router, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	if workQueue {
		if _, err := r.Vtysh(ctx, "configure terminal\nzebra work-queue 1"); err != nil {
			return err
		}
	}

	svc := &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "vip"},
		Spec: &weirv1.ServiceSpec{
			Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{"10.96.0.70"},
			Ports:                 []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: weirlab.PodPort, NodePort: 30300}},
			ExternalTrafficPolicy: weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, HealthCheckNodePort: 32300,
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{"203.0.113.70"}},
	}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		return err
	}
	slice := func(p *lab.Pod) *weirv1.EndpointSlice { return weirlab.OnePodSlice("default", "vip", p) }
	pods := []*lab.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]}
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice(pods[0])}); err != nil {
		return err
	}
	waitHops := func(want func([]string) bool, limit time.Duration) error {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			hops, _ := r.NextHops(ctx, "203.0.113.70")
			if want(hops) {
				return nil
			}
			time.Sleep(time.Millisecond)
		}
		hops, _ := r.NextHops(ctx, "203.0.113.70")
		return fmt.Errorf("route still via %v after %v", hops, limit)
	}
	has := func(ip string) func([]string) bool { return func(h []string) bool { return slices.Contains(h, ip) } }
	if err := waitHops(has(pods[0].Node.IPv4.String()), 30*time.Second); err != nil {
		return err
	}
	var took []time.Duration
	for i := range flaps {
		from, to := pods[i%2], pods[(i+1)%2]
		start := time.Now()
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: slice(to)}); err != nil {
			return err
		}
		gone := func(h []string) bool { return !slices.Contains(h, from.Node.IPv4.String()) }
		if err := waitHops(gone, 10*time.Second); err != nil {
			return err
		}
		took = append(took, time.Since(start))
		if err := waitHops(has(to.Node.IPv4.String()), 10*time.Second); err != nil {
			return err
		}
	}
	slices.Sort(took)
	q := func(p int) time.Duration {
		return took[min(len(took)-1, len(took)*p/100)].Round(100 * time.Microsecond)
	}
	placement := "node speakers"
	if tier {
		placement = "load-balancer speaker"
	}
	fmt.Printf("%s: last local endpoint leaves a node -> its next hop gone from the router's kernel route (%d moves, back to back, min-sync-period %v, zebra work-queue 1: %v):\n", placement, len(took), minSync, workQueue)
	fmt.Printf("  p50 %v  p90 %v  p99 %v  max %v\n", q(50), q(90), q(99), took[len(took)-1].Round(100*time.Microsecond))

	if tier {
		// Cut the link of the node that has the endpoint, as a pulled
		// cable would, until its next hop goes; then restore it.
		took = took[:0]
		owner := pods[flaps%2].Node
		for range deaths {
			start := time.Now()
			if _, err := c.Router.Run(ctx, "ip", "link", "set", "lan-"+owner.Name, "down"); err != nil {
				return err
			}
			if err := waitHops(func(h []string) bool { return !slices.Contains(h, owner.IPv4.String()) }, 10*time.Second); err != nil {
				return err
			}
			took = append(took, time.Since(start))
			if _, err := c.Router.Run(ctx, "ip", "link", "set", "lan-"+owner.Name, "up"); err != nil {
				return err
			}
			if err := waitHops(has(owner.IPv4.String()), 30*time.Second); err != nil {
				return err
			}
		}
		slices.Sort(took)
		fmt.Printf("node's link cut -> its next hop gone (%d cuts; probes every 1 s, 3 to fail):\n", len(took))
		fmt.Printf("  p50 %v  p90 %v  p99 %v  max %v\n", q(50), q(90), q(99), took[len(took)-1].Round(100*time.Microsecond))
	}

	// A killed agent: its sessions close, the router drops its routes.
	owner := pods[flaps%2].Node
	idx := slices.Index(c.Nodes, owner)
	start := time.Now()
	if err := c.Agents[idx].Kill(); err != nil {
		return err
	}
	if err := waitHops(func(h []string) bool { return !slices.Contains(h, owner.IPv4.String()) }, 10*time.Second); err != nil {
		return err
	}
	fmt.Printf("agent killed -> its next hop gone: %v\n", time.Since(start).Round(100*time.Microsecond))
	return nil
}
