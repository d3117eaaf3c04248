// Command bfdfailover measures how fast a router stops sending a VIP's
// traffic to a node it can no longer reach, with BFD and without: four
// nodes' speakers announce the VIP to a real router (FRR with bfdd, then
// BIRD), and -faults times every packet between a node and the router is
// dropped in the node's namespace (a dead path the router cannot see on
// its own link); the router's kernel route is polled until the node's
// next hop is gone, then the fault is lifted and the node must come back.
// The faults go round four nodes, so that each node's BFD flaps about
// every 20 s and its damping (a hold-down that grows with flaps a minute
// apart or closer) stays short. The baseline, in the same run, is the
// same faults without BFD at the shortest hold time routers commonly
// allow (3 s).
//
//	go run ./test/bench/bfdfailover -faults 20
//
// Times are from the drop rule in force (nft has returned, having
// committed it: starting the clock before nft runs would add its own
// start-up, tens of milliseconds on a busy machine) to the kernel's
// notice of the route's change in the router's namespace (`ip monitor
// route`, so that no polling process competes with the routers for the
// CPU).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

const (
	routerASN = 64500
	nodeASN   = 64512
	vip       = "203.0.113.80"
)

func main() {
	faults := flag.Int("faults", 20, "dead paths to time, per router and mode")
	interval := flag.Duration("interval", 100*time.Millisecond, "BFD receive and transmit interval")
	multiplier := flag.Int("multiplier", 3, "BFD detect multiplier")
	hold := flag.Int("hold", 3, "BGP hold time, seconds, of the baseline without BFD")
	flag.Parse()
	if err := run(*faults, *interval, *multiplier, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "bfdfailover:", err)
		os.Exit(1)
	}
}

// router is a lab router of either implementation.
type router interface {
	NextHops(ctx context.Context, prefix string) ([]string, error)
	Close()
}

func run(faults int, interval time.Duration, multiplier, hold int) error {
	ctx := context.Background()
	c, closeCluster, err := weirlab.StartBuilt(ctx, lab.Config{Nodes: 4, PodsPerNode: []int{1, 1, 1, 1}}, func(c *weirlab.Cluster) {
		c.AgentArgs = func(n *lab.Node) []string {
			return []string{"--bgp-asn", fmt.Sprint(nodeASN), "--bgp-router-id", n.IPv4.String()}
		}
	})
	if err != nil {
		return err
	}
	defer closeCluster()
	svc := &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "vip"},
		Spec: &weirv1.ServiceSpec{
			Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{"10.96.0.80"},
			Ports: []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: weirlab.PodPort, NodePort: 30380}},
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{vip}},
	}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		return err
	}
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: weirlab.OnePodSlice("default", "vip", c.Nodes[0].Pods[0])}); err != nil {
		return err
	}
	peer := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN}

	fmt.Printf("a node's path to the router dropped -> its next hop gone from the router's kernel route (%d faults each):\n", faults)
	for _, impl := range []string{"FRR", "BIRD"} {
		r, err := startRouter(ctx, c, impl, interval, multiplier)
		if err != nil {
			return err
		}
		for _, withBFD := range []bool{true, false} {
			mode := fmt.Sprintf("hold time %ds, no BFD", hold)
			peer.HoldTimeSeconds, peer.Bfd = int32(hold), nil
			if withBFD {
				mode = fmt.Sprintf("BFD %v x %d", interval, multiplier)
				// The hold time stays long: BFD alone must find the fault.
				peer.HoldTimeSeconds = 9
				ms := uint32(interval / time.Millisecond)
				peer.Bfd = &weirv1.BfdProfile{ReceiveIntervalMs: ms, TransmitIntervalMs: ms, DetectMultiplier: uint32(multiplier)}
			}
			// A new peer each time: a hold time is agreed when a session
			// opens, so a changed one would not hold until the next.
			if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer}); err != nil {
				r.Close()
				return err
			}
			took, detected, err := measure(ctx, c, r, faults, withBFD)
			if _, derr := c.Registry.DeleteBgpPeer(ctx, &weirv1.DeleteBgpPeerRequest{Name: "upstream"}); derr != nil && err == nil {
				err = derr
			}
			if err != nil {
				r.Close()
				return fmt.Errorf("%s, %s: %w", impl, mode, err)
			}
			report(impl+", "+mode, took)
			if len(detected) > 0 {
				report(impl+"'s BFD down (its log)", detected)
			}
		}
		r.Close()
	}
	return nil
}

func startRouter(ctx context.Context, c *weirlab.Cluster, impl string, interval time.Duration, multiplier int) (router, error) {
	if impl == "FRR" {
		return frr.StartTemp(ctx, c.Router, frr.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), PeerASN: nodeASN,
			ListenRanges: []string{"192.0.2.0/24"}, BFD: &frr.BFD{Interval: interval, Multiplier: multiplier}})
	}
	return bird.Start(ctx, c.Router, bird.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), PeerASN: nodeASN,
		ListenRanges4: []string{"192.0.2.0/24"}, BFD: &bird.BFD{Interval: interval, Multiplier: multiplier}})
}

// measure times faults dead paths between a node and the router, the
// nodes in turn. With BFD it also returns when the router's BFD found
// each fault, from the router's log of its BFD sessions: what is left is
// the router's own way from BFD to its kernel route.
func measure(ctx context.Context, c *weirlab.Cluster, r router, faults int, withBFD bool) (took, detected []time.Duration, err error) {
	var all []string
	for _, n := range c.Nodes {
		all = append(all, n.IPv4.String())
	}
	slices.Sort(all)
	waitHops := func(want []string, limit time.Duration) error {
		deadline := time.Now().Add(limit)
		for {
			hops, _ := r.NextHops(ctx, vip)
			slices.Sort(hops)
			if slices.Equal(hops, want) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("route via %v after %v; want %v", hops, limit, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := waitHops(all, 60*time.Second); err != nil {
		return nil, nil, err
	}
	if withBFD {
		// Both ends' BFD must be up before the first fault, or the
		// first would be found by the hold timer.
		time.Sleep(3 * time.Second)
	}
	logsBFD, _ := r.(interface {
		BFDDownAt(peer string, since time.Time) time.Time
	})
	monitor, err := c.Router.Start("ip", "-o", "monitor", "route")
	if err != nil {
		return nil, nil, err
	}
	defer monitor.Stop()
	// withdrawn waits for the kernel to say the route changed until it
	// goes via want, and returns when it said so.
	withdrawn := func(want []string, limit time.Duration) (time.Time, error) {
		seen := len(monitor.Log())
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			log := monitor.Log()
			if len(log) == seen {
				continue
			}
			at := time.Now()
			seen = len(log)
			hops, _ := r.NextHops(ctx, vip)
			slices.Sort(hops)
			if slices.Equal(hops, want) {
				return at, nil
			}
		}
		hops, _ := r.NextHops(ctx, vip)
		return time.Time{}, fmt.Errorf("route via %v after %v; want %v", hops, limit, want)
	}
	routerIP := lab.RouterLANv4.String()
	for i := range faults {
		node := c.Nodes[i%len(c.Nodes)]
		others := slices.DeleteFunc(slices.Clone(all), func(a string) bool { return a == node.IPv4.String() })
		if _, err := node.Run(ctx, "nft", "add table inet bfdfault { chain in { type filter hook input priority -400; ip saddr "+routerIP+" drop; }; "+
			"chain out { type filter hook output priority -400; ip daddr "+routerIP+" drop; }; }"); err != nil {
			return nil, nil, err
		}
		start := time.Now()
		at, err := withdrawn(others, 30*time.Second)
		took = append(took, at.Sub(start))
		if logsBFD != nil && withBFD {
			if down := logsBFD.BFDDownAt(node.IPv4.String(), start); !down.IsZero() {
				detected = append(detected, down.Sub(start))
			}
		}
		if _, lerr := node.Run(ctx, "nft", "delete table inet bfdfault"); lerr != nil {
			return nil, nil, lerr
		}
		if err != nil {
			return nil, nil, err
		}
		if err := waitHops(all, 90*time.Second); err != nil {
			return nil, nil, err
		}
		if withBFD {
			time.Sleep(time.Second) // BFD up again on both ends
		}
	}
	return took, detected, nil
}

func report(what string, took []time.Duration) {
	slices.Sort(took)
	q := func(p int) time.Duration {
		return took[min(len(took)-1, len(took)*p/100)].Round(time.Millisecond)
	}
	fmt.Printf("  %-32s p50 %6v  p90 %6v  p99 %6v  max %6v\n", what+":", q(50), q(90), q(99), took[len(took)-1].Round(time.Millisecond))
}
