package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
)

type httpAnswer struct {
	code    int
	headers http.Header
	body    string
}

// httpGet asks ns's view of url, on a new connection.
func httpGet(t *testing.T, ns *lab.Netns, url string) (httpAnswer, error) {
	t.Helper()
	resp, err := ns.HTTPClient(2e9).Get(url)
	if err != nil {
		return httpAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return httpAnswer{resp.StatusCode, resp.Header, string(b)}, err
}

func hcURL(a netip.Addr, port int) string {
	return fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(a, uint16(port)))
}

// waitCode waits until url answers code from ns.
func waitCode(t *testing.T, ns *lab.Netns, url string, code int) httpAnswer {
	t.Helper()
	var got httpAnswer
	eventually(t, url+" answers "+fmt.Sprint(code), func() error {
		var err error
		if got, err = httpGet(t, ns, url); err != nil {
			return err
		}
		if got.code != code {
			return fmt.Errorf("answered %d", got.code)
		}
		return nil
	})
	return got
}

// TestHealthCheckNodePort: a load balancer probing the node addresses hears
// 200 from the node with a ready local endpoint and 503 from the other, with
// kube-proxy's headers and body; a node whose pods all terminate drains
// (503) while its rules keep serving them; the status API shows it all.
func TestHealthCheckNodePort(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	const hcPort = 32100
	svc := lbService("hc", 30095, []string{"10.96.0.40", "fd00:96::40"}, []string{"203.0.113.40", "2001:db8:113::40"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = hcPort
	node1, node2 := c.Nodes[0], c.Nodes[1]
	n1p1 := node1.Pods[0]
	createService(t, c, svc, []*lab.Pod{n1p1})

	for _, fam := range families("10.96.0.40", "fd00:96::40", "203.0.113.40", "2001:db8:113::40") {
		got := waitCode(t, c.Client, hcURL(fam.node(node1), hcPort), 200)
		wantBody := "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"hc\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
		if got.body != wantBody {
			t.Errorf("%s: body %q, want %q", fam.name, got.body, wantBody)
		}
		for h, want := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "X-Load-Balancing-Endpoint-Weight": "1"} {
			if v := got.headers.Get(h); v != want {
				t.Errorf("%s: header %s = %q, want %q", fam.name, h, v, want)
			}
		}
		other := waitCode(t, c.Client, hcURL(fam.node(node2), hcPort), 503)
		if !strings.Contains(other.body, `"localEndpoints": 0`) || other.headers.Get("X-Load-Balancing-Endpoint-Weight") != "0" {
			t.Errorf("%s: node2 answered %q, weight %q", fam.name, other.body, other.headers.Get("X-Load-Balancing-Endpoint-Weight"))
		}
	}

	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "the status API sends external traffic to node1 only", func() error {
		resp, err := status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "hc"})
		if err != nil {
			return err
		}
		reasons := map[string]string{}
		for _, n := range resp.GetStatus().GetNodes() {
			reasons[n.GetNode()] = n.GetReason()
		}
		if got := resp.GetStatus().GetReceivingNodes(); len(got) != 1 || got[0] != "node1" || reasons["node2"] != "NoLocalEndpoints" {
			return fmt.Errorf("receiving %v, reasons %v", got, reasons)
		}
		return nil
	})

	// n1p1 starts terminating (still serving): node1 answers 503 so the
	// balancer drains it, but connections that still arrive are served.
	for _, s := range endpointSlices("hc", []*lab.Pod{n1p1}) {
		s.Endpoints[0].Conditions = &weirv1.EndpointConditions{Ready: proto.Bool(false), Serving: proto.Bool(true), Terminating: proto.Bool(true)}
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 503)
	for _, r := range sample(t, c.Client, netip.AddrPortFrom(node1.IPv4, 30095), 3) {
		if r.Pod != n1p1.Name || r.RemoteAddr() != lab.ClientIPv4 {
			t.Errorf("draining node served %s seeing %s; want the terminating n1p1 seeing the client", r.Pod, r.RemoteAddr())
		}
	}

	// The status API shows, per node, what each answers and why.
	eventually(t, "the status API shows both nodes draining", func() error {
		resp, err := status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "hc"})
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, n := range resp.GetStatus().GetNodes() {
			h := n.GetHealth()
			got[n.GetNode()] = fmt.Sprintf("code=%d ready=%d serving=%d terminating=%d", h.GetHealthCheckCode(), h.GetLocalReady(), h.GetLocalServing(), h.GetLocalTerminating())
		}
		want := map[string]string{"node1": "code=503 ready=0 serving=1 terminating=1", "node2": "code=503 ready=0 serving=0 terminating=0"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("status %v, want %v", got, want)
		}
		return nil
	})
}

// TestNodeHealthz: /healthz and /livez on 10256 answer kube-proxy's JSON;
// a node being deleted fails /healthz (balancers drain it) but not /livez
// (nothing restarts the agent).
func TestNodeHealthz(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	node2 := c.Nodes[1]
	url := func(path string) string {
		return fmt.Sprintf("http://%s%s", netip.AddrPortFrom(node2.IPv4, 10256), path)
	}
	got := waitCode(t, c.Client, url("/healthz"), 200)
	var body struct {
		LastUpdated  string                     `json:"lastUpdated"`
		CurrentTime  string                     `json:"currentTime"`
		NodeEligible bool                       `json:"nodeEligible"`
		Healthy      bool                       `json:"healthy"`
		Status       map[string]json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal([]byte(got.body), &body); err != nil {
		t.Fatalf("/healthz body %q: %v", got.body, err)
	}
	if !body.NodeEligible || !body.Healthy || body.LastUpdated == "" || body.CurrentTime == "" || len(body.Status) != 2 {
		t.Errorf("/healthz body %q", got.body)
	}

	n, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: node2.Name})
	if err != nil {
		t.Fatal(err)
	}
	n.GetNode().Deleting = true
	if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n.GetNode()}); err != nil {
		t.Fatal(err)
	}
	got = waitCode(t, c.Client, url("/healthz"), 503)
	if !strings.Contains(got.body, `"nodeEligible":false`) {
		t.Errorf("/healthz of a node being deleted: %q", got.body)
	}
	waitCode(t, c.Client, url("/livez"), 200)
	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "the status API shows node2 ineligible", func() error {
		resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		for _, n := range resp.GetNodes() {
			if n.GetName() == node2.Name && n.GetHealth().GetHealthzCode() == 503 && !n.GetHealth().GetNodeEligible() && n.GetConnected() {
				return nil
			}
		}
		return fmt.Errorf("nodes: %v", resp.GetNodes())
	})
}

// TestHealthCheckPortInUse: a port the node cannot open is reported in the
// status API and in the agent's metrics, never silently ignored.
func TestHealthCheckPortInUse(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	node1 := c.Nodes[0]
	// Something else on node1 holds the port first.
	if _, err := node1.Start(c.Bin.Echo, "-name", "squatter", "-listen", ":32101"); err != nil {
		t.Fatal(err)
	}
	waitCode(t, c.Client, fmt.Sprintf("http://%s/", netip.AddrPortFrom(node1.IPv4, 32101)), 200)
	svc := lbService("squatted", 30096, []string{"10.96.0.41"}, []string{"203.0.113.41"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32101
	createService(t, c, svc, c.Pods())
	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "the status API reports node1's port error", func() error {
		resp, err := status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "squatted"})
		if err != nil {
			return err
		}
		for _, n := range resp.GetStatus().GetNodes() {
			if n.GetNode() == node1.Name && strings.Contains(n.GetHealth().GetHealthCheckError(), "address already in use") {
				return nil
			}
		}
		return fmt.Errorf("status %v", resp.GetStatus())
	})
	metrics, err := httpGet(t, node1.Netns, "http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics.body, "weir_service_health_bind_errors 1") {
		t.Errorf("node1's metrics do not count the port it could not open")
	}
}

// TestDrainNode: a drained node answers 503 on its health checks and
// /healthz, so balancers stop sending new traffic, while connections that
// still arrive are served; uncordon brings it back.
func TestDrainNode(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	const hcPort = 32102
	svc := lbService("drain", 30097, []string{"10.96.0.42"}, []string{"203.0.113.42"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = hcPort
	node1 := c.Nodes[0]
	createService(t, c, svc, []*lab.Pod{node1.Pods[0]})
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 200)
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node1.Name}); err != nil {
		t.Fatal(err)
	}
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 503)
	waitCode(t, c.Client, fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(node1.IPv4, 10256)), 503)
	sample(t, c.Client, netip.AddrPortFrom(node1.IPv4, 30097), 3) // still served
	if _, err := c.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: node1.Name}); err != nil {
		t.Fatal(err)
	}
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 200)
}

// TestHealthzFailsWhenUpdatesWaitTooLong is kube-proxy's health-timeout
// contract, end to end: an agent that stops applying (the tests' fault
// hook holds its applies, as a hung nft would) keeps answering 200 until
// an update has waited --health-timeout, then /healthz and /livez answer
// 503, the node's health-check ports too; once it applies again they
// answer 200 and the held update forwards.
func TestHealthzFailsWhenUpdatesWaitTooLong(t *testing.T) {
	const timeout = 3 * time.Second
	c := startCluster(t, "--health-timeout", timeout.String())
	ctx := context.Background()
	node1 := c.Nodes[0]
	healthz := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(node1.IPv4, 10256))
	livez := fmt.Sprintf("http://%s/livez", netip.AddrPortFrom(node1.IPv4, 10256))
	const hcPort = 32122
	svc := lbService("stuck", 30122, []string{"10.96.0.82"}, []string{"203.0.113.82"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = hcPort
	createService(t, c, svc, node1.Pods[:1])
	waitCode(t, c.Client, healthz, 200)
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 200)

	if err := c.Agents[0].Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the hook is installed before the signal is read
	// An update for node1: its second pod joins the endpoints.
	// The agent may hear of the update before its writer hears the
	// reply: the wait is timed from before the call.
	s := endpointSlices("stuck", node1.Pods)[0]
	changed := time.Now()
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
		t.Fatal(err)
	}
	if got, err := httpGet(t, c.Client, healthz); err != nil || (got.code != 200 && time.Since(changed) < timeout) {
		t.Errorf("/healthz right after the update: %v %v; want 200 until the update has waited %v", got.code, err, timeout)
	}
	waitCode(t, c.Client, healthz, 503)
	if waited := time.Since(changed); waited < timeout {
		t.Errorf("/healthz failed after %v, before the update had waited %v", waited, timeout)
	}
	waitCode(t, c.Client, livez, 503)
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 503)
	// The held update is not forwarded: only the first pod answers.
	for _, r := range sample(t, c.Client, netip.AddrPortFrom(node1.IPv4, 30122), 10) {
		if r.Pod != node1.Pods[0].Name {
			t.Errorf("pod %s answered while the update was held", r.Pod)
		}
	}

	if err := c.Agents[0].Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	waitCode(t, c.Client, healthz, 200)
	waitCode(t, c.Client, livez, 200)
	waitCode(t, c.Client, hcURL(node1.IPv4, hcPort), 200)
	eventually(t, "the held update forwards", func() error {
		for _, r := range sample(t, c.Client, netip.AddrPortFrom(node1.IPv4, 30122), 20) {
			if r.Pod == node1.Pods[1].Name {
				return nil
			}
		}
		return fmt.Errorf("the second pod never answered")
	})
}
