// Command healthcheck measures how fast a node's health-check port turns
// 503 when the last ready local endpoint of a service leaves it: a pod
// flaps between two nodes of a lab, and each time the node it left is
// probed every millisecond, as an impatient load balancer would.
//
//	go run ./test/bench/healthcheck -flaps 100
//
// The time is taken from the moment the endpoint update is sent to the
// server (so it includes the API call, the stream to the agent and the
// agent's reaction) to the first 503.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

const hcPort = 32200

func main() {
	flaps := flag.Int("flaps", 100, "endpoint moves to time")
	minSync := flag.Duration("min-sync-period", 50*time.Millisecond, "the server's --min-sync-period")
	flag.Parse()
	if err := run(*flaps, *minSync); err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

func run(flaps int, minSync time.Duration) error {
	ctx := context.Background()
	c, closeCluster, err := weirlab.StartBuilt(ctx, lab.Config{Nodes: 2, PodsPerNode: []int{1, 1}}, func(c *weirlab.Cluster) {
		c.ServerArgs = []string{"--min-sync-period", minSync.String()}
	})
	if err != nil {
		return err
	}
	defer closeCluster()

	svc := &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "flap"},
		Spec: &weirv1.ServiceSpec{
			Type:                  weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
			ClusterIps:            []string{"10.96.0.50"},
			Ports:                 []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: weirlab.PodPort, NodePort: 30200}},
			ExternalTrafficPolicy: weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
			HealthCheckNodePort:   hcPort,
		},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{"203.0.113.50"}},
	}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		return err
	}
	slice := func(p *lab.Pod) *weirv1.EndpointSlice { return weirlab.OnePodSlice("default", "flap", p) }
	pods := []*lab.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]}
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice(pods[0])}); err != nil {
		return err
	}
	client := c.Client.HTTPClient(time.Second)
	probe := func(n *lab.Node) int {
		resp, err := client.Get(fmt.Sprintf("http://%s/", netip.AddrPortFrom(n.IPv4, hcPort)))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor := func(n *lab.Node, code int, limit time.Duration) (time.Duration, error) {
		start := time.Now()
		for time.Since(start) < limit {
			if probe(n) == code {
				return time.Since(start), nil
			}
			time.Sleep(time.Millisecond)
		}
		return 0, fmt.Errorf("%s did not answer %d within %v", n.Name, code, limit)
	}
	if _, err := waitFor(c.Nodes[0], http.StatusOK, 10*time.Second); err != nil {
		return err
	}

	var took []time.Duration
	for i := range flaps {
		from, to := pods[i%2], pods[(i+1)%2]
		start := time.Now()
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: slice(to)}); err != nil {
			return err
		}
		if _, err := waitFor(from.Node, http.StatusServiceUnavailable, 5*time.Second); err != nil {
			return err
		}
		took = append(took, time.Since(start))
		// The new node must be serving before the next move.
		if _, err := waitFor(to.Node, http.StatusOK, 5*time.Second); err != nil {
			return err
		}
	}
	slices.Sort(took)
	q := func(p int) time.Duration {
		return took[min(len(took)-1, len(took)*p/100)].Round(100 * time.Microsecond)
	}
	fmt.Printf("last ready local endpoint leaves a node -> its health-check port answers 503 (%d moves, back to back, min-sync-period %v):\n", len(took), minSync)
	fmt.Printf("  p50 %v  p90 %v  p99 %v  max %v\n", q(50), q(90), q(99), took[len(took)-1].Round(100*time.Microsecond))
	return nil
}
