package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/servertest"
)

// ackingAgents registers nodes node1..nodeN (addresses 192.0.2.11 on) and
// connects an agent for each that acknowledges whatever it is sent; a
// test sending on their streams holds the mutex returned.
func ackingAgents(t *testing.T, ctx context.Context, ts *servertest.Server, n int) (map[string]*agentStream, *sync.Mutex) {
	t.Helper()
	agents := map[string]*agentStream{}
	sendMu := &sync.Mutex{}
	for i := range n {
		name := fmt.Sprintf("node%d", i+1)
		if _, err := ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{
			Metadata: &weirv1.ObjectMeta{Name: name}, Addresses: []string{fmt.Sprintf("192.0.2.%d", 11+i)},
		}}); err != nil {
			t.Fatal(err)
		}
		a := connectAgent(t, ctx, ts, name, 0)
		agents[name] = a
		go a.ackAll(sendMu)
	}
	return agents, sendMu
}

// ackAll acknowledges whatever the agent is sent, until its stream ends;
// sends are under mu.
func (a *agentStream) ackAll(mu *sync.Mutex) {
	for {
		msg, err := a.stream.Recv()
		if err != nil {
			return
		}
		mu.Lock()
		a.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: msg.GetVersion()}}})
		mu.Unlock()
	}
}

// The load-balancer tier gets, per load-balancer IP, the nodes that should
// receive it (Local: those with ready local endpoints, weighted by them),
// and what a speaker reports shows in the service's status.
func TestLoadBalancerTargetsFollowTheAgentsReports(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/28"},
		BgpAdvertisement: &weirv1.BgpAdvertisement{Communities: []string{"64512:100"}, AggregationLength: 28},
	}}); err != nil {
		t.Fatal(err)
	}
	svc := validService()
	svc.Spec.Type, svc.Spec.ExternalTrafficPolicy, svc.Spec.HealthCheckNodePort = weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, 32000
	svc.Spec.LoadBalancerIps = []string{"203.0.113.5"}
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	// Each agent applies whatever it is sent (the IPAM's write of the
	// address is a second version).
	agents, sendMu := ackingAgents(t, ctx, ts, 2)
	report := func(node string, ready int32) {
		code := int32(503)
		if ready > 0 {
			code = 200
		}
		sendMu.Lock()
		defer sendMu.Unlock()
		if err := agents[node].stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: &weirv1.Report{
			Full:       true,
			NodeHealth: &weirv1.NodeHealth{HealthzCode: 200, LivezCode: 200, NodeEligible: true},
			Services: []*weirv1.ServiceHealth{{Namespace: "default", Name: "web", LocalReady: ready,
				HealthCheckNodePort: 32000, HealthCheckCode: code}},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	report("node1", 3)
	report("node2", 0)

	lb := weirv1.NewLoadBalancerTierServiceClient(ts.Conn)
	bad, _ := lb.WatchTargets(ctx, &weirv1.WatchTargetsRequest{})
	if _, err := bad.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a watch without a speaker name: %v, want InvalidArgument", err)
	}
	watch, err := lb.WatchTargets(ctx, &weirv1.WatchTargetsRequest{Speaker: "lb1"})
	if err != nil {
		t.Fatal(err)
	}
	// wait reads until the VIP's targets are want (node -> weight).
	wait := func(want map[string]uint32) *weirv1.VipTargets {
		t.Helper()
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("waiting for targets %v: %v", want, err)
			}
			if len(resp.GetVips()) != 1 {
				continue
			}
			vip := resp.GetVips()[0]
			got := map[string]uint32{}
			for _, tg := range vip.GetTargets() {
				got[tg.GetNode()] = tg.GetWeight()
			}
			if len(got) == len(want) {
				same := true
				for n, w := range want {
					if got[n] != w {
						same = false
					}
				}
				if same {
					return vip
				}
			}
		}
	}
	vip := wait(map[string]uint32{"node1": 3})
	if vip.GetAddress() != "203.0.113.5" || vip.GetService() != "default/web" || len(vip.GetCommunities()) != 1 || vip.GetCommunities()[0] != 64512<<16|100 ||
		vip.GetPrefixLength() != 28 {
		t.Errorf("VIP %v: want 203.0.113.5 of default/web with community 64512:100, announced as its /28", vip)
	}
	if tg := vip.GetTargets()[0]; tg.GetAddress() != "192.0.2.11" || tg.GetHealthCheckPort() != 32000 || tg.GetHealthCheckPath() != "/" {
		t.Errorf("target %v: want next hop 192.0.2.11, probed on 32000 /", tg)
	}

	// node1's last endpoint goes and node2 gets one: the targets follow.
	if _, err := ts.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: &weirv1.EndpointSlice{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web-1"}, ServiceName: "web",
		Endpoints: []*weirv1.Endpoint{{Addresses: []string{"10.244.2.11"}, NodeName: "node2"}},
	}}); err != nil {
		t.Fatal(err)
	}
	report("node1", 0)
	report("node2", 1)
	wait(map[string]uint32{"node2": 1})

	// A speaker's report shows in the service's status, only while it
	// watches.
	path := &weirv1.SpeakerPath{Prefix: "203.0.113.5/32", Service: "default/web", Node: "node2", NextHop: "192.0.2.12", Announced: false, Reason: "ProbeFailing"}
	if _, err := lb.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a report without a name: %v, want InvalidArgument", err)
	}
	if _, err := lb.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: "lb1", Paths: []*weirv1.SpeakerPath{path}}}); err != nil {
		t.Fatal(err)
	}
	st, err := weirv1.NewStatusServiceClient(ts.Conn).GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	sp := st.GetStatus().GetSpeakers()
	if len(sp) != 1 || sp[0].GetSpeaker() != "lb1" || len(sp[0].GetPaths()) != 1 || sp[0].GetPaths()[0].GetReason() != "ProbeFailing" {
		t.Errorf("service status speakers: %v, want lb1's path with reason ProbeFailing", sp)
	}
}

// The load-balancer tier keeps a pool's limit on announcing nodes too: a
// Cluster service's address gets two of three healthy nodes as targets,
// and when one of them turns unhealthy the third takes its place while
// the other stays.
func TestLoadBalancerTargetsKeepThePoolsLimit(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/28"},
		BgpAdvertisement: &weirv1.BgpAdvertisement{MaxAnnouncingNodes: 2},
	}}); err != nil {
		t.Fatal(err)
	}
	svc := validService()
	svc.Spec.Type, svc.Spec.LoadBalancerIps = weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, []string{"203.0.113.5"}
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	agents, sendMu := ackingAgents(t, ctx, ts, 3)
	health := func(node string, code int32) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if err := agents[node].stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: &weirv1.Report{
			Full: true, NodeHealth: &weirv1.NodeHealth{HealthzCode: code, LivezCode: code, NodeEligible: true},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		health(n, 200)
	}
	watch, err := weirv1.NewLoadBalancerTierServiceClient(ts.Conn).WatchTargets(ctx, &weirv1.WatchTargetsRequest{Speaker: "lb1"})
	if err != nil {
		t.Fatal(err)
	}
	// targets reads until the address has two targets not including skip.
	targets := func(skip string) []string {
		t.Helper()
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("waiting for two targets without %q: %v", skip, err)
			}
			if len(resp.GetVips()) != 1 {
				continue
			}
			var nodes []string
			for _, tg := range resp.GetVips()[0].GetTargets() {
				nodes = append(nodes, tg.GetNode())
			}
			if len(nodes) == 2 && !slices.Contains(nodes, skip) {
				return nodes
			}
			if len(nodes) > 2 {
				t.Fatalf("targets %v: more than the pool's limit of 2", nodes)
			}
		}
	}
	before := targets("")
	health(before[0], 503)
	after := targets(before[0])
	if !slices.Contains(after, before[1]) {
		t.Errorf("%s turned unhealthy: targets went from %v to %v, want %s kept", before[0], before, after, before[1])
	}
}
