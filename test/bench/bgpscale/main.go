// Command bgpscale measures the node speakers with many VIPs announced to a
// real FRR router: how long a new LoadBalancer service takes to answer a
// client through the router while -vips others are announced, and whether
// creating and deleting -churn services resets any BGP session.
//
//	go run ./test/bench/bgpscale -vips 10000 -probes 50 -churn 1000
//
// Probe times are from sending the service to the server to the first
// answer from a pod, the client dialling through the router every 5 ms
// (each attempt given -dial-timeout).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// dialTimeout bounds one probe connection: a SYN lost while the route
// settles costs at most this much (TCP would wait a second to resend it).
var dialTimeout = 50 * time.Millisecond

func main() {
	vips := flag.Int("vips", 10000, "VIPs announced before the probes")
	probes := flag.Int("probes", 50, "new services to time")
	churn := flag.Int("churn", 1000, "services created and then deleted while the sessions are watched")
	flag.DurationVar(&dialTimeout, "dial-timeout", dialTimeout, "how long a probe's connection may take")
	flag.Parse()
	if *vips+*churn+2**probes > 60000 {
		fmt.Fprintln(os.Stderr, "bgpscale: -vips + -churn + 2 × -probes must stay under 60000")
		os.Exit(2)
	}
	if err := run(*vips, *probes, *churn); err != nil {
		fmt.Fprintln(os.Stderr, "bgpscale:", err)
		os.Exit(1)
	}
}

// vip is the i-th benchmark VIP, in 198.18.0.0/15 (RFC 2544's range).
func vip(i int) string { return fmt.Sprintf("198.%d.%d.%d", 18+i>>16, (i>>8)&255, i&255) }

func service(name string, i int) *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: name},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
			ClusterIps: []string{fmt.Sprintf("10.%d.%d.%d", 100+i>>16, (i>>8)&255, i&255)},
			Ports:      []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: weirlab.PodPort}},
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{vip(i)}},
	}
}

// parallel runs fn for 0..n-1 on eight workers and returns the first error.
func parallel(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func run(nVIPs, nProbes, nChurn int) error {
	ctx := context.Background()
	c, closeCluster, err := weirlab.StartBuilt(ctx, lab.Config{Nodes: 2, PodsPerNode: []int{1, 1}}, func(c *weirlab.Cluster) {
		c.AgentArgs = func(n *lab.Node) []string {
			return []string{"--bgp-asn", "64512", "--bgp-router-id", n.IPv4.String(), "--bgp-peers", lab.RouterLANv4.String() + "/64500"}
		}
	})
	if err != nil {
		return err
	}
	defer closeCluster()
	r, err := frr.StartTemp(ctx, c.Router, frr.Config{ASN: 64500, RouterID: lab.RouterLANv4.String(), PeerASN: 64512, ListenRanges: []string{"192.0.2.0/24"}})
	if err != nil {
		return err
	}
	defer r.Close()

	// Unannounced VIPs are refused at once (and without ICMP's one a
	// second limit), so a probe learns of the route within its 5 ms retry
	// instead of a SYN timeout.
	if _, err := c.Router.Run(ctx, "ip", "route", "add", "unreachable", "198.18.0.0/15"); err != nil {
		return err
	}
	if _, err := c.Router.Run(ctx, "sysctl", "-w", "net.ipv4.icmp_ratelimit=0"); err != nil {
		return err
	}
	// probe times new services with endpoints on both nodes until a pod
	// answers the client through the router; their VIPs follow first.
	probe := func(round string, first int) error {
		var took []time.Duration
		for p := range nProbes {
			i := first + p
			name := fmt.Sprintf("probe-%d", i)
			slice := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: name}, ServiceName: name,
				Ports: []*weirv1.EndpointPort{{Name: "http", Port: weirlab.PodPort}}}
			for _, pod := range c.Pods() {
				slice.Endpoints = append(slice.Endpoints, &weirv1.Endpoint{Addresses: []string{pod.IPv4.String()}, NodeName: pod.Node.Name})
			}
			if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
				return err
			}
			dst := netip.AddrPortFrom(netip.MustParseAddr(vip(i)), 80)
			start := time.Now()
			if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: service(name, i)}); err != nil {
				return err
			}
			for {
				dctx, cancel := context.WithTimeout(ctx, dialTimeout)
				_, err := weirlab.Get(dctx, c.Client, dst)
				cancel()
				if err == nil {
					break
				}
				if time.Since(start) > 30*time.Second {
					return fmt.Errorf("%s unreachable after 30 s: %v", dst, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		q := func(p int) time.Duration {
			return took[min(len(took)-1, len(took)*p/100)].Round(100 * time.Microsecond)
		}
		fmt.Printf("new LoadBalancer service -> a pod answers the client through the router (%d probes, %s):\n", len(took), round)
		fmt.Printf("  p50 %v  p90 %v  p99 %v  max %v\n", q(50), q(90), q(99), took[len(took)-1].Round(100*time.Microsecond))
		return nil
	}
	// The baseline: both sessions up, nothing else announced.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if up, err := sessions(ctx, r); err == nil && len(up) == 2 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the nodes' sessions did not come up in 30 s")
		}
	}
	if err := probe("baseline, no other VIPs", nVIPs+nChurn+nProbes); err != nil {
		return err
	}

	start := time.Now()
	if err := parallel(nVIPs, func(i int) error {
		_, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: service(fmt.Sprintf("vip-%d", i), i)})
		return err
	}); err != nil {
		return err
	}
	created := time.Since(start)
	if err := waitRoutes(ctx, c.Router, nVIPs+nProbes, 5*time.Minute); err != nil {
		return err
	}
	fmt.Printf("%d VIPs: created through the API in %v, all in the router's kernel table (ECMP via both nodes) after %v\n",
		nVIPs, created.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	before, err := sessions(ctx, r)
	if err != nil {
		return err
	}
	if len(before) != 2 {
		return fmt.Errorf("want 2 established sessions, have %v", before)
	}
	if err := probe(fmt.Sprintf("%d VIPs announced", nVIPs), nVIPs+nChurn); err != nil {
		return err
	}

	start = time.Now()
	if err := parallel(nChurn, func(i int) error {
		_, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: service(fmt.Sprintf("churn-%d", i), nVIPs+i)})
		return err
	}); err != nil {
		return err
	}
	if err := waitRoutes(ctx, c.Router, nVIPs+nChurn+2*nProbes, 2*time.Minute); err != nil {
		return err
	}
	if err := parallel(nChurn, func(i int) error {
		_, err := c.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "bench", Name: fmt.Sprintf("churn-%d", i)})
		return err
	}); err != nil {
		return err
	}
	if err := waitRoutes(ctx, c.Router, nVIPs+2*nProbes, 2*time.Minute); err != nil {
		return err
	}
	after, err := sessions(ctx, r)
	if err != nil {
		return err
	}
	resets := 0
	for peer, was := range before {
		now, ok := after[peer]
		if !ok || now.Dropped != was.Dropped || now.Up > was.Up+1 {
			resets++
		}
	}
	fmt.Printf("%d services created, announced, deleted and withdrawn in %v: %d BGP session resets (sessions before %v, after %v)\n",
		nChurn, time.Since(start).Round(time.Millisecond), resets, before, after)
	if resets > 0 {
		return fmt.Errorf("%d sessions were reset", resets)
	}
	return nil
}

// waitRoutes waits until the router's kernel has exactly n routes in the
// benchmark range, each through both nodes.
func waitRoutes(ctx context.Context, router *lab.Netns, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var got int
	for time.Now().Before(deadline) {
		out, err := router.Run(ctx, "ip", "-4", "route", "show", "root", "198.18.0.0/15", "proto", "bgp")
		if err != nil {
			return err
		}
		// An ECMP route is its prefix line, then one indented "nexthop"
		// line per path.
		got = 0
		for l := range strings.Lines(out) {
			if l != "" && l[0] != '\t' && l[0] != ' ' {
				got++
			}
		}
		if got == n && strings.Count(out, "nexthop") == 2*n {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("router has %d benchmark routes after %v, want %d", got, limit, n)
}

// session is an established neighbour's state.
type session struct {
	Up      int64 // when it came up, in Unix seconds (FRR rounds: ±1)
	Dropped int64 // how many times its connection dropped
}

// sessions maps each established neighbour to its session: a reset shows
// as a later start, a higher drop count or a missing neighbour.
func sessions(ctx context.Context, r *frr.Router) (map[string]session, error) {
	out, err := r.Vtysh(ctx, "show bgp neighbors json")
	if err != nil {
		return nil, err
	}
	var nbrs map[string]struct {
		State   string `json:"bgpState"`
		Up      int64  `json:"bgpTimerUpEstablishedEpoch"`
		Dropped int64  `json:"connectionsDropped"`
	}
	if err := json.Unmarshal([]byte(out), &nbrs); err != nil {
		return nil, fmt.Errorf("show bgp neighbors json: %w", err)
	}
	up := map[string]session{}
	for addr, n := range nbrs {
		if n.State == "Established" {
			up[addr] = session{n.Up, n.Dropped}
		}
	}
	return up, nil
}
