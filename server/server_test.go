package server_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/servertest"
)

func startServer(t *testing.T, dataDir string) *servertest.Server {
	t.Helper()
	return servertest.Start(t, dataDir)
}

func validService() *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_NODE_PORT,
			ClusterIps: []string{"10.96.0.10"},
			Ports:      []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080}},
		},
	}
}

func TestCreateServiceRejectsBadFieldsAndStoresNothing(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		edit  func(*weirv1.Service)
		field string
	}{
		{"IP that does not parse", func(s *weirv1.Service) { s.Spec.ClusterIps = []string{"10.96.0.300"} }, "service.spec.cluster_ips[0]"},
		{"port 0", func(s *weirv1.Service) { s.Spec.Ports[0].Port = 0 }, "service.spec.ports[0].port"},
		{"port 70000", func(s *weirv1.Service) { s.Spec.Ports[0].Port = 70000 }, "service.spec.ports[0].port"},
		{"duplicate port", func(s *weirv1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, &weirv1.ServicePort{Name: "http2", Port: 80})
		}, "service.spec.ports[1].port"},
		{"node port on a ClusterIP service", func(s *weirv1.Service) { s.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP }, "service.spec.ports[0].node_port"},
		{"bad name", func(s *weirv1.Service) { s.Metadata.Name = "Web_1" }, "service.metadata.name"},
		{"two IPv4 cluster IPs", func(s *weirv1.Service) { s.Spec.ClusterIps = []string{"10.96.0.10", "10.96.0.11"} }, "service.spec.cluster_ips"},
		{"bad external IP", func(s *weirv1.Service) { s.Spec.ExternalIps = []string{"example.com"} }, "service.spec.external_ips[0]"},
		{"bad source range", func(s *weirv1.Service) {
			s.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"}
		}, "service.spec.load_balancer_source_ranges[0]"},
		{"unknown protocol", func(s *weirv1.Service) { s.Spec.Ports[0].Protocol = 9 }, "service.spec.ports[0].protocol"},
		{"a load-balancer class", func(s *weirv1.Service) {
			s.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER
			s.Spec.LoadBalancerClass = "metallb.io/metallb"
		}, "service.spec.load_balancer_class"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := validService()
			tc.edit(svc)
			_, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tc.field+":") {
				t.Fatalf("got %v %q; want InvalidArgument naming %s", st.Code(), st.Message(), tc.field)
			}
			var violations []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						violations = append(violations, v.GetField())
					}
				}
			}
			if !cmp.Equal(violations, []string{tc.field}) {
				t.Errorf("BadRequest field violations %v, want [%s]", violations, tc.field)
			}
			list, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(list.GetServices()); n != 0 {
				t.Errorf("a rejected create stored %d services", n)
			}
		})
	}
}

func TestUpdateWithStaleVersionIsAbortedAndChangesNothing(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := context.Background()
	created, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()})
	if err != nil {
		t.Fatal(err)
	}
	v1 := created.GetService()
	next := proto.Clone(v1).(*weirv1.Service)
	next.Spec.Ports[0].Port = 81
	updated, err := ts.Registry.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: next})
	if err != nil {
		t.Fatal(err)
	}
	if updated.GetService().GetMetadata().GetResourceVersion() == v1.GetMetadata().GetResourceVersion() {
		t.Error("update did not change the resource version")
	}
	stale := proto.Clone(v1).(*weirv1.Service) // still carries the first version
	stale.Spec.Ports[0].Port = 82
	if _, err := ts.Registry.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: stale}); status.Code(err) != codes.Aborted {
		t.Fatalf("stale update: got %v, want Aborted", err)
	}
	got, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if p := got.GetService().GetSpec().GetPorts()[0].GetPort(); p != 81 {
		t.Errorf("port is %d after a rejected update, want 81", p)
	}
	if _, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "web", ResourceVersion: v1.GetMetadata().GetResourceVersion()}); status.Code(err) != codes.Aborted {
		t.Errorf("stale delete: got %v, want Aborted", err)
	}
}

func TestConflictingFrontendIsRefused(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := context.Background()
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	other := validService()
	other.Metadata.Name = "other"
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: other}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(status.Convert(err).Message(), "spec.cluster_ips[0]") {
		t.Errorf("second service on the same cluster IP: got %v, want FailedPrecondition naming spec.cluster_ips[0]", err)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	ts := startServer(t, dir)
	created, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: "node1"}, Addresses: []string{"192.0.2.11"}}}); err != nil {
		t.Fatal(err)
	}
	ts.Stop()

	ts2 := startServer(t, dir)
	got, err := ts2.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatalf("service lost across restart: %v", err)
	}
	if diff := cmp.Diff(created.GetService(), got.GetService(), protocmp.Transform()); diff != "" {
		t.Errorf("service changed across restart (-before +after):\n%s", diff)
	}
	nodes, err := ts2.Registry.ListNodes(ctx, &weirv1.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 1 {
		t.Fatalf("nodes after restart: %v, %v", nodes, err)
	}
	// Versions keep growing across restarts, so an agent never mistakes new
	// state for old.
	svc := validService()
	svc.Metadata.Name = "web2"
	svc.Spec.ClusterIps = []string{"10.96.0.11"}
	svc.Spec.Ports[0].NodePort = 30081
	c2, err := ts2.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := created.GetService().GetMetadata().GetResourceVersion(), c2.GetService().GetMetadata().GetResourceVersion(); len(b) < len(a) || (len(a) == len(b) && b <= a) {
		t.Errorf("resource version went from %s to %s across a restart", a, b)
	}
}

func TestHealthAndListSelector(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := context.Background()
	h, err := healthpb.NewHealthClient(ts.Conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health: %v %v", h, err)
	}
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]int{"app=web": 1, "app!=web": 0, "app": 1, "!app": 0, "": 1} {
		list, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{LabelSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.GetServices()) != want {
			t.Errorf("selector %q listed %d services, want %d", sel, len(list.GetServices()), want)
		}
	}
	if _, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{LabelSelector: "a b"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad selector: got %v, want InvalidArgument", err)
	}
}

func TestWatchStreamsInitialStateThenChanges(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	w, err := ts.Registry.WatchServices(ctx, &weirv1.WatchServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	next := func() {
		ev, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.GetType().String()+" "+ev.GetService().GetMetadata().GetName())
	}
	next()
	next()
	if _, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "web"}); err != nil {
		t.Fatal(err)
	}
	next()
	want := []string{"WATCH_EVENT_TYPE_ADDED web", "WATCH_EVENT_TYPE_SYNCED ", "WATCH_EVENT_TYPE_DELETED web"}
	if !cmp.Equal(got, want) {
		t.Errorf("watch events %q, want %q", got, want)
	}
}

// TestAgentStreamSendsFullStateThenOnlyChanges drives the agent stream as
// an agent would.
func TestAgentStreamSendsFullStateThenOnlyChanges(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg := ts.Registry
	mustCreate := func(name, ip string, nodePort int32) {
		t.Helper()
		s := validService()
		s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = name, []string{ip}, nodePort
		if _, err := reg.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate("web", "10.96.0.10", 30080)
	mustCreate("db", "10.96.0.20", 30081)

	// An agent of a node nobody registered is turned away, saying why.
	stranger, err := ts.Agents.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stranger.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "node9"}}})
	if _, err := stranger.Recv(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node9") {
		t.Errorf("unknown node: got %v, want FailedPrecondition naming it", err)
	}

	registerNode(t, ts, "node1")
	stream, err := ts.Agents.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "node1"}}}); err != nil {
		t.Fatal(err)
	}
	full, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !full.GetFull() || len(full.GetUpserts()) != 2 || !full.GetNode().GetRegistered() {
		t.Fatalf("first message: full=%v upserts=%d registered=%v; want a full state of 2 services for node1",
			full.GetFull(), len(full.GetUpserts()), full.GetNode().GetRegistered())
	}
	ack := func(v uint64) {
		if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: v}}}); err != nil {
			t.Fatal(err)
		}
	}
	ack(full.GetVersion())

	// An endpoint of web appears on node1: only web is sent, marked local.
	if _, err := reg.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: &weirv1.EndpointSlice{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web-1"}, ServiceName: "web",
		Endpoints: []*weirv1.Endpoint{{Addresses: []string{"10.244.1.11"}, NodeName: "node1"}},
		Ports:     []*weirv1.EndpointPort{{Name: "http", Port: 8080}},
	}}); err != nil {
		t.Fatal(err)
	}
	delta, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if delta.GetFull() || len(delta.GetUpserts()) != 1 || delta.GetUpserts()[0].GetName() != "web" || delta.GetVersion() <= full.GetVersion() {
		t.Fatalf("delta: %v", delta)
	}
	eps := delta.GetUpserts()[0].GetPorts()[0].GetEndpoints()
	if len(eps) != 1 || eps[0].GetNodeName() != "node1" || eps[0].GetPort() != 8080 || !eps[0].GetReady() {
		t.Errorf("endpoint as sent: %v; want on node1, ready, port 8080", eps)
	}
	ack(delta.GetVersion())

	// Another node's description changes: nothing for node1. Then db is
	// deleted: an explicit removal, and nothing else.
	if _, err := reg.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: "node2"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "db"}); err != nil {
		t.Fatal(err)
	}
	removal, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(removal.GetRemovals(), []string{"default/db"}) || len(removal.GetUpserts()) != 0 || removal.GetNode() != nil {
		t.Errorf("after node2 appeared and db was deleted, node1 got %v; want only the removal of default/db", removal)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != nil && err != io.EOF && status.Code(err) != codes.Canceled {
		t.Logf("stream closed with %v", err)
	}
}

// TestReflectionListsTheAPI: grpcurl and similar tools discover the API
// through server reflection.
func TestReflectionListsTheAPI(t *testing.T) {
	ts := startServer(t, t.TempDir())
	stream, err := reflectionpb.NewServerReflectionClient(ts.Conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"weir.v1.RegistryService", "weir.v1.AgentService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v; %s missing", names, want)
		}
	}
}

// registerNode creates the node unless it exists: agents of unknown nodes
// are refused.
func registerNode(t *testing.T, ts *servertest.Server, name string) {
	t.Helper()
	_, err := ts.Registry.CreateNode(context.Background(), &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: name}}})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		t.Fatal(err)
	}
}

// agentStream is a test agent's end of AgentService.Sync.
type agentStream struct {
	t      *testing.T
	stream weirv1.AgentService_SyncClient
}

func connectAgent(t *testing.T, ctx context.Context, ts *servertest.Server, node string, applied uint64) *agentStream {
	t.Helper()
	return helloAgent(t, ctx, ts, &weirv1.Hello{NodeName: node, AppliedVersion: applied})
}

// resumeAgent connects an agent that applied msg, as a restarted agent
// does: with msg's version and history.
func resumeAgent(t *testing.T, ctx context.Context, ts *servertest.Server, node string, msg *weirv1.SyncResponse) *agentStream {
	t.Helper()
	return helloAgent(t, ctx, ts, &weirv1.Hello{NodeName: node, AppliedVersion: msg.GetVersion(), AppliedHistory: msg.GetHistory()})
}

func helloAgent(t *testing.T, ctx context.Context, ts *servertest.Server, hello *weirv1.Hello) *agentStream {
	t.Helper()
	registerNode(t, ts, hello.GetNodeName())
	stream, err := ts.Agents.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	return &agentStream{t, stream}
}

func (a *agentStream) recv() *weirv1.SyncResponse {
	a.t.Helper()
	msg, err := a.stream.Recv()
	if err != nil {
		a.t.Fatal(err)
	}
	return msg
}

func (a *agentStream) ack(v uint64) {
	a.t.Helper()
	if err := a.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: v}}}); err != nil {
		a.t.Fatal(err)
	}
}

func TestAgentResumesFromTheVersionItApplied(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, name := range []string{"a", "b", "c"} {
		s := validService()
		s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = name, []string{fmt.Sprintf("10.96.0.%d", 10+i)}, int32(30080+i)
		if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
			t.Fatal(err)
		}
	}
	first, firstCancel := context.WithCancel(ctx)
	agent := connectAgent(t, first, ts, "node1", 0)
	full := agent.recv()
	agent.ack(full.GetVersion())
	firstCancel() // the agent goes away...

	// ...and service b changes while it is gone.
	got, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	got.GetService().Spec.Ports[0].Port = 81
	if _, err := ts.Registry.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: got.GetService()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the hub see the old stream end

	resumed := resumeAgent(t, ctx, ts, "node1", full)
	msg := resumed.recv()
	if msg.GetFull() || len(msg.GetUpserts()) != 1 || msg.GetUpserts()[0].GetName() != "b" {
		t.Errorf("resuming from the applied version: full=%v upserts=%d; want only b, as a delta", msg.GetFull(), len(msg.GetUpserts()))
	}

	// An agent claiming a version the server never sent it gets everything.
	other := connectAgent(t, ctx, ts, "node2", 12345)
	if msg := other.recv(); !msg.GetFull() || len(msg.GetUpserts()) != 3 {
		t.Errorf("unknown applied version: full=%v upserts=%d; want a full state of 3", msg.GetFull(), len(msg.GetUpserts()))
	}
}

func TestStatusListsEveryNodeAndWatchesChanges(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"node1", "node2"} {
		if _, err := ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: name}}}); err != nil {
			t.Fatal(err)
		}
	}
	status := weirv1.NewStatusServiceClient(ts.Conn)
	watch, err := status.WatchNodeStatuses(ctx, &weirv1.WatchNodeStatusesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	connected := func(resp *weirv1.WatchNodeStatusesResponse) map[string]bool {
		out := map[string]bool{}
		for _, n := range resp.GetNodes() {
			out[n.GetName()] = n.GetConnected()
		}
		return out
	}
	first, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := connected(first); !cmp.Equal(got, map[string]bool{"node1": false, "node2": false}) {
		t.Errorf("registered nodes without agents: %v, want both listed as disconnected", got)
	}
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())
	for {
		resp, err := watch.Recv()
		if err != nil {
			t.Fatalf("watch ended before node1 connected: %v", err)
		}
		if connected(resp)["node1"] {
			break
		}
	}
}

func TestMetricsProveConvergence(t *testing.T) {
	reg := prometheus.NewRegistry()
	ts := servertest.Start(t, t.TempDir(), func(c *server.Config) { c.Metrics = reg })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())
	if _, err := ts.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: &weirv1.EndpointSlice{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web-1"}, ServiceName: "web",
		Endpoints: []*weirv1.Endpoint{{Addresses: []string{"10.244.1.11"}}},
	}}); err != nil {
		t.Fatal(err)
	}
	agent.ack(agent.recv().GetVersion())
	want := map[string]float64{"weir_agents_connected": 1, "weir_network_programming_duration_seconds": 1}
	var got map[string]float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				switch {
				case m.GetGauge() != nil:
					got[f.GetName()] += m.GetGauge().GetValue()
				case m.GetHistogram() != nil:
					got[f.GetName()] += float64(m.GetHistogram().GetSampleCount())
				case m.GetCounter() != nil:
					got[f.GetName()] += m.GetCounter().GetValue()
				}
			}
		}
		if got["weir_agents_connected"] == want["weir_agents_connected"] && got["weir_network_programming_duration_seconds"] >= 1 {
			return
		}
	}
	t.Errorf("metrics %v; want one agent connected and one programming latency observed", got)
}

func TestValidateOnlyChecksEverythingAndWritesNothing(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := context.Background()
	resp, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService(), ValidateOnly: true})
	if err != nil || resp.GetService().GetMetadata().GetName() != "web" {
		t.Fatalf("validate-only create of a good service: %v, %v", resp, err)
	}
	if _, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"}); status.Code(err) != codes.NotFound {
		t.Errorf("validate-only create stored the service: %v", err)
	}
	bad := validService()
	bad.Spec.Ports[0].Port = 0
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: bad, ValidateOnly: true}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("validate-only create of a bad service: %v, want InvalidArgument", err)
	}
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	other := validService()
	other.Metadata.Name = "other" // same cluster IP: a conflict only the registry sees
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: other, ValidateOnly: true}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("validate-only create of a conflicting service: %v, want FailedPrecondition", err)
	}
	upd := validService()
	upd.Spec.Ports[0].Port = 81
	if _, err := ts.Registry.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: upd, ValidateOnly: true}); err != nil {
		t.Fatal(err)
	}
	got, _ := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if p := got.GetService().GetSpec().GetPorts()[0].GetPort(); p != 80 {
		t.Errorf("validate-only update changed the port to %d", p)
	}
}

func TestDrainSurvivesRestartAndReachesAgents(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("draining an unknown node: %v, want NotFound", err)
	}
	agent := connectAgent(t, ctx, ts, "node1", 0)
	full := agent.recv()
	agent.ack(full.GetVersion())
	if full.GetNode().GetDrained() {
		t.Fatal("node drained before anyone drained it")
	}
	resp, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node1"})
	if err != nil || !resp.GetNode().GetDrained() {
		t.Fatalf("drain: %v, %v", resp, err)
	}
	if msg := agent.recv(); !msg.GetNode().GetDrained() {
		t.Errorf("the agent was not told its node is drained: %v", msg)
	}
	ts.Stop()
	ts2 := servertest.Start(t, dir, func(c *server.Config) { c.MinSyncPeriod = time.Second })
	n, err := ts2.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "node1"})
	if err != nil || !n.GetNode().GetDrained() {
		t.Errorf("drain lost across a restart: %v, %v", n, err)
	}
	if _, err := ts2.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: "node1"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := ts2.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "node1"}); n.GetNode().GetDrained() {
		t.Error("uncordon did not undo the drain")
	}
	// The fanout holds the second change for MinSyncPeriod; an agent that
	// connects meanwhile still gets it in its first state.
	if _, err := ts2.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node1"}); err != nil {
		t.Fatal(err)
	}
	if full := connectAgent(t, ctx, ts2, "node1", 0).recv(); !full.GetNode().GetDrained() || !full.GetFull() {
		t.Errorf("first state after the second drain: %v", full)
	}
}

// TestNoRemovalIsLostWhenTheRemovalLogIsTrimmed: the hub remembers
// deleted services for agents that resume later, within a limit. Trimming
// that memory must never cost a connected agent a removal: with the limit
// at 1, every deletion is still delivered.
func TestNoRemovalIsLostWhenTheRemovalLogIsTrimmed(t *testing.T) {
	ts := servertest.Start(t, t.TempDir(), func(c *server.Config) { c.RemovalLogLimit = 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := []string{"a", "b", "c", "d"}
	for i, name := range append(names, "stays") {
		s := validService()
		s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = name, []string{fmt.Sprintf("10.96.0.%d", 10+i)}, int32(30080+i)
		if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
			t.Fatal(err)
		}
	}
	agent := connectAgent(t, ctx, ts, "node1", 0)
	full := agent.recv()
	agent.ack(full.GetVersion())
	for _, name := range names {
		if _, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	// A last change marks the end of what the agent must have heard.
	marker := validService()
	marker.Metadata.Name, marker.Spec.ClusterIps, marker.Spec.Ports[0].NodePort = "marker", []string{"10.96.1.1"}, 30100
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: marker}); err != nil {
		t.Fatal(err)
	}
	var removed []string
	for done := false; !done; {
		msg := agent.recv()
		agent.ack(msg.GetVersion())
		removed = append(removed, msg.GetRemovals()...)
		for _, u := range msg.GetUpserts() {
			done = done || u.GetName() == "marker"
		}
	}
	slices.Sort(removed)
	if want := []string{"default/a", "default/b", "default/c", "default/d"}; !slices.Equal(removed, want) {
		t.Errorf("removals the connected agent heard: %v, want %v", removed, want)
	}

	// An agent resuming from before the trimmed removals cannot be told
	// them as a delta: it gets a whole state, without the deleted services.
	late := resumeAgent(t, ctx, ts, "node2", full)
	msg := late.recv()
	var got []string
	for _, u := range msg.GetUpserts() {
		got = append(got, u.GetName())
	}
	slices.Sort(got)
	if !msg.GetFull() || !slices.Equal(got, []string{"marker", "stays"}) {
		t.Errorf("resuming from before trimmed removals: full=%v services %v, removals %v; want a whole state of marker and stays",
			msg.GetFull(), got, msg.GetRemovals())
	}
}

// TestAgentNeverResumesAcrossARestoredStore: a store restored from a copy
// counts again through versions it had given other content. An agent that
// applied one of those must get a whole state, not a delta from a version
// that now means something else.
func TestAgentNeverResumesAcrossARestoredStore(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	create := func(ts *servertest.Server, names ...string) {
		t.Helper()
		for _, name := range names {
			s := validService()
			n := int(name[0] - 'a')
			s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = name, []string{fmt.Sprintf("10.96.0.%d", 10+n)}, int32(30080+n)
			if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ts := startServer(t, dir)
	registerNode(t, ts, "node1")
	create(ts, "a")
	ts.Stop()
	backup, err := os.ReadFile(filepath.Join(dir, "weir.db"))
	if err != nil {
		t.Fatal(err)
	}

	ts = startServer(t, dir)
	create(ts, "b", "c")
	agent := connectAgent(t, ctx, ts, "node1", 0)
	applied := agent.recv()
	agent.ack(applied.GetVersion())
	ts.Stop()

	// The operator restores the copy; new writes reach the version the
	// agent applied, with other content.
	if err := os.WriteFile(filepath.Join(dir, "weir.db"), backup, 0o600); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, dir)
	create(ts, "d", "e")
	var rev uint64
	for _, name := range []string{"d", "e"} {
		got, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: name})
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseUint(got.GetService().GetMetadata().GetResourceVersion(), 10, 64)
		rev = max(rev, v)
	}
	if rev < applied.GetVersion() {
		t.Fatalf("the restored store is at %d, below the agent's %d: the test would prove nothing", rev, applied.GetVersion())
	}

	msg := resumeAgent(t, ctx, ts, "node1", applied).recv()
	var names []string
	for _, u := range msg.GetUpserts() {
		names = append(names, u.GetName())
	}
	slices.Sort(names)
	if !msg.GetFull() || !slices.Equal(names, []string{"a", "d", "e"}) {
		t.Errorf("agent at version %d of the old history: full=%v services %v; want a whole state of a, d and e",
			applied.GetVersion(), msg.GetFull(), names)
	}
}

// TestAHugeServiceReachesAgentsInParts: one service with 20 ports and
// 15,000 endpoints is a 7 MB wire form, well past gRPC's default 4 MiB
// message limit. It must reach an agent in parts that each fit, and a change after
// it must reach the agent too.
func TestAHugeServiceReachesAgentsInParts(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := validService()
	big.Metadata.Name, big.Spec.ClusterIps = "big", []string{"10.96.0.50"}
	big.Spec.Ports = nil
	var slicePorts []*weirv1.EndpointPort
	for i := range 20 {
		name := fmt.Sprintf("p%d", i)
		big.Spec.Ports = append(big.Spec.Ports, &weirv1.ServicePort{Name: name, Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: int32(8000 + i), TargetPort: int32(9000 + i)})
		slicePorts = append(slicePorts, &weirv1.EndpointPort{Name: name, Port: int32(9000 + i)})
	}
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: big}); err != nil {
		t.Fatal(err)
	}
	const slices, perSlice = 15, 1000
	for s := range slices {
		slice := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("big-%d", s)}, ServiceName: "big", Ports: slicePorts}
		for e := range perSlice {
			slice.Endpoints = append(slice.Endpoints, &weirv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+s/4, (s%4)*64+e/256, e%256)}, NodeName: "node2"})
		}
		if _, err := ts.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
			t.Fatal(err)
		}
	}

	agent := connectAgent(t, ctx, ts, "node1", 0)
	endpoints := map[string]int{}
	parts := 0
	for {
		msg := agent.recv() // the client's default limit is 4 MiB: a bigger part fails here
		parts++
		for _, u := range msg.GetUpserts() {
			for _, p := range u.GetPorts() {
				endpoints[u.GetName()] += len(p.GetEndpoints())
			}
		}
		if !msg.GetMore() {
			agent.ack(msg.GetVersion())
			break
		}
	}
	if want := 20 * slices * perSlice; endpoints["big"] != want {
		t.Errorf("the big service arrived with %d endpoint ports, want %d", endpoints["big"], want)
	}
	t.Logf("the whole state came in %d parts", parts)

	// The agent is not stuck on it: the next change arrives.
	s := validService()
	s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = "after", []string{"10.96.0.51"}, 30051
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
		t.Fatal(err)
	}
	if msg := agent.recv(); len(msg.GetUpserts()) != 1 || msg.GetUpserts()[0].GetName() != "after" {
		t.Errorf("after the big state: %v, want the new service", msg)
	}
}

// TestListsArePaged: every List answers in pages, in key order, that join
// into the whole list even when an item changes between two pages; a bad
// token or size is refused naming the field.
func TestListsArePaged(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var want []string
	for i := range 7 {
		s := validService()
		s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = fmt.Sprintf("s%d", i), []string{fmt.Sprintf("10.96.0.%d", 10+i)}, int32(30080+i)
		if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
			t.Fatal(err)
		}
		want = append(want, s.Metadata.Name)
	}
	var got []string
	var sizes []int
	token := ""
	for {
		r, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(r.GetServices()))
		for _, s := range r.GetServices() {
			got = append(got, s.GetMetadata().GetName())
		}
		if token = r.GetNextPageToken(); token == "" {
			break
		}
		if len(sizes) == 1 {
			// Between two pages, an item already read goes: the next page
			// still starts right after the last one read.
			if _, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "s1"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(got, want) || !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Errorf("pages %v holding %v; want 3, 3, 1 holding %v", sizes, got, want)
	}
	for _, tc := range []struct {
		req   *weirv1.ListServicesRequest
		field string
	}{
		{&weirv1.ListServicesRequest{PageToken: "not a token!"}, "page_token"},
		{&weirv1.ListServicesRequest{PageSize: -1}, "page_size"},
	} {
		if _, err := ts.Registry.ListServices(ctx, tc.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%v: got %v, want InvalidArgument naming %s", tc.req, err, tc.field)
		}
	}
	nodes, err := weirv1.NewStatusServiceClient(ts.Conn).ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{PageSize: 1})
	if err != nil || len(nodes.GetNodes()) > 1 {
		t.Errorf("node statuses with page size 1: %v, %v", nodes, err)
	}
}

// TestWaitProgrammedTellsWhenEveryNodeHasAWrite: a write's revision is
// programmed on a node once the node has applied everything up to it that
// concerns it; a change that concerns one node only counts on the others
// at once. WaitProgrammed returns when every connected node is through the
// revision, names the nodes that are not and why, and returns at once when
// a node refused it.
func TestWaitProgrammedTellsWhenEveryNodeHasAWrite(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := weirv1.NewStatusServiceClient(ts.Conn)
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	agents := map[string]*agentStream{}
	for _, n := range []string{"node1", "node2"} {
		agents[n] = connectAgent(t, ctx, ts, n, 0)
		agents[n].ack(agents[n].recv().GetVersion())
	}
	wait := func(rev uint64, timeout time.Duration) *weirv1.WaitProgrammedResponse {
		t.Helper()
		r, err := st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(timeout)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	reason := func(r *weirv1.WaitProgrammedResponse, node string) string {
		for _, n := range r.GetNodes() {
			if n.GetName() == node {
				return n.GetReason()
			}
		}
		return "(not listed)"
	}

	// node1's zone changes: only node1 is sent anything.
	got, err := ts.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "node1"})
	if err != nil {
		t.Fatal(err)
	}
	n := got.GetNode()
	n.Zone = "a"
	upd, err := ts.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := strconv.ParseUint(upd.GetNode().GetMetadata().GetResourceVersion(), 10, 64)
	if r := wait(rev, 300*time.Millisecond); r.GetProgrammed() || reason(r, "node1") != "applying" {
		t.Errorf("before node1 applied: %v; want not programmed, node1 applying", r)
	}
	agents["node1"].ack(agents["node1"].recv().GetVersion())
	if r := wait(rev, 5*time.Second); !r.GetProgrammed() || reason(r, "node2") != "" {
		t.Errorf("after node1 applied: %v; want programmed everywhere (node2 was sent nothing)", r)
	}
	// node1's status says how long the change took to reach its kernel.
	statuses, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range statuses.GetNodes() {
		if s.GetName() == "node1" && s.GetProgrammingLatency().AsDuration() <= 0 {
			t.Errorf("node1's programming latency after it applied a change: %v", s.GetProgrammingLatency())
		}
	}

	// node1 refuses the next write: WaitProgrammed says so without
	// waiting for its timeout.
	del, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	rev = del.GetRevision()
	if rev == 0 {
		t.Fatalf("a delete returned revision %d", rev)
	}
	m := agents["node1"].recv()
	if err := agents["node1"].stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Nack{Nack: &weirv1.Nack{Version: m.GetVersion(), Error: "nft says no"}}}); err != nil {
		t.Fatal(err)
	}
	agents["node2"].ack(agents["node2"].recv().GetVersion())
	start := time.Now()
	r := wait(rev, 10*time.Second)
	if r.GetProgrammed() || !strings.Contains(reason(r, "node1"), "nft says no") || time.Since(start) > 5*time.Second {
		t.Errorf("after node1 refused: %v after %v; want not programmed, node1's error named, at once", r, time.Since(start))
	}

	// A drain returns its revision too; it concerns node1 only.
	drain, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node1"})
	if err != nil {
		t.Fatal(err)
	}
	rev = drain.GetRevision()
	agents["node1"].ack(agents["node1"].recv().GetVersion())
	if r := wait(rev, 5*time.Second); !r.GetProgrammed() {
		t.Errorf("after node1 applied its drain: %v; want programmed", r)
	}

	// A disconnected node does not hold a wait up, and is named.
	agents["node2"].stream.CloseSend()
	again := validService()
	again.Metadata.Name = "again"
	created, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: again})
	if err != nil {
		t.Fatal(err)
	}
	rev, _ = strconv.ParseUint(created.GetService().GetMetadata().GetResourceVersion(), 10, 64)
	agents["node1"].ack(agents["node1"].recv().GetVersion())
	deadline := time.Now().Add(5 * time.Second)
	for r = wait(rev, time.Second); reason(r, "node2") != "not connected" && time.Now().Before(deadline); r = wait(rev, time.Second) {
	}
	if !r.GetProgrammed() || reason(r, "node2") != "not connected" {
		t.Errorf("node2 gone, node1 applied the write: %v; want programmed, node2 not connected", r)
	}
	if _, err := st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "revision") {
		t.Errorf("no revision: %v; want InvalidArgument naming revision", err)
	}
}

// A service CIDR reaches every node's description, is checked at the edge
// (the field named, nothing stored) and survives a restart.
func TestServiceCIDRsReachTheAgents(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := connectAgent(t, ctx, ts, "node1", 0)
	full := agent.recv()
	agent.ack(full.GetVersion())
	if got := full.GetNode().GetServiceCidrs(); len(got) != 0 {
		t.Fatalf("service CIDRs before any was created: %v", got)
	}
	for _, bad := range []struct {
		cidrs []string
		field string
	}{
		{[]string{"10.96.0.0/33"}, "cidrs[0]"},
		{[]string{"10.96.0.1/16"}, "cidrs[0]"},
		{[]string{"10.96.0.0/16", "10.97.0.0/16"}, "cidrs[1]"},
		{nil, "cidrs"},
	} {
		_, err := ts.Registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{
			Metadata: &weirv1.ObjectMeta{Name: "bad"}, Cidrs: bad.cidrs}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("service CIDR %v: %v, want InvalidArgument naming %s", bad.cidrs, err, bad.field)
		}
	}
	if _, err := ts.Registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{
		Metadata: &weirv1.ObjectMeta{Name: "primary"}, Cidrs: []string{"10.96.0.0/16", "fd00:96::/108"}}}); err != nil {
		t.Fatal(err)
	}
	if msg := agent.recv(); !slices.Equal(msg.GetNode().GetServiceCidrs(), []string{"10.96.0.0/16", "fd00:96::/108"}) {
		t.Errorf("the agent was not sent the service CIDRs: %v", msg.GetNode())
	}
	ts.Stop()
	ts2 := startServer(t, dir)
	if full := connectAgent(t, ctx, ts2, "node1", 0).recv(); !slices.Equal(full.GetNode().GetServiceCidrs(), []string{"10.96.0.0/16", "fd00:96::/108"}) {
		t.Errorf("service CIDRs after a restart: %v", full.GetNode())
	}
	list, err := ts2.Registry.ListServiceCidrs(ctx, &weirv1.ListServiceCidrsRequest{})
	if err != nil || len(list.GetServiceCidrs()) != 1 || list.GetServiceCidrs()[0].GetMetadata().GetName() != "primary" {
		t.Errorf("list: %v, %v", list, err)
	}
}

// Load-balancer addresses can be replaced and cleared by an update that
// says so (update_mask), are kept by one that does not, and go with the
// type: the nodes stop forwarding them.
func TestLoadBalancerAddressesCanBeClearedAndGoWithTheType(t *testing.T) {
	// The addresses are an outside load balancer's: allowed, as they must be.
	ts := servertest.Start(t, t.TempDir(), allowExternal("203.0.113.0/24"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())
	lbIPs := func(msg *weirv1.SyncResponse) []string {
		for _, s := range msg.GetUpserts() {
			if s.GetName() == "web" {
				return s.GetLoadBalancerIps()
			}
		}
		t.Fatalf("no upsert of web in %v", msg)
		return nil
	}
	svc := validService()
	svc.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	svc.Status = &weirv1.ServiceStatus{LoadBalancerIps: []string{"203.0.113.10"}}
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	msg := agent.recv()
	agent.ack(msg.GetVersion())
	if got := lbIPs(msg); !slices.Equal(got, []string{"203.0.113.10"}) {
		t.Fatalf("the node was sent %v", got)
	}
	update := func(s *weirv1.Service, mask ...string) (*weirv1.Service, error) {
		req := &weirv1.UpdateServiceRequest{Service: s}
		if mask != nil {
			req.UpdateMask = &fieldmaskpb.FieldMask{Paths: mask}
		}
		r, err := ts.Registry.UpdateService(ctx, req)
		return r.GetService(), err
	}
	// Without a mask, no status keeps the addresses.
	spec := proto.Clone(svc).(*weirv1.Service)
	spec.Status = nil
	spec.Metadata.Labels = map[string]string{"app": "web", "v": "2"}
	got, err := update(spec)
	if err != nil || !slices.Equal(got.GetStatus().GetLoadBalancerIps(), []string{"203.0.113.10"}) {
		t.Fatalf("update without status: %v, %v; want the address kept", got, err)
	}
	// With the mask, an empty list clears them, and the node stops.
	got, err = update(spec, "status.load_balancer_ips")
	if err != nil || len(got.GetStatus().GetLoadBalancerIps()) != 0 {
		t.Fatalf("clearing: %v, %v", got, err)
	}
	msg = agent.recv()
	agent.ack(msg.GetVersion())
	if got := lbIPs(msg); len(got) != 0 {
		t.Errorf("after clearing, the node was sent %v", got)
	}
	replaced := proto.Clone(spec).(*weirv1.Service)
	replaced.Status = &weirv1.ServiceStatus{LoadBalancerIps: []string{"203.0.113.11"}}
	if got, err = update(replaced, "status.load_balancer_ips"); err != nil || !slices.Equal(got.GetStatus().GetLoadBalancerIps(), []string{"203.0.113.11"}) {
		t.Fatalf("replacing: %v, %v", got, err)
	}
	agent.ack(agent.recv().GetVersion())
	if _, err := update(spec, "spec.type"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "update_mask.paths[0]") {
		t.Errorf("an unknown mask path: %v; want InvalidArgument naming it", err)
	}
	// A ClusterIP service has none: said, it is refused; kept, it goes.
	clusterIP := proto.Clone(replaced).(*weirv1.Service)
	clusterIP.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP
	clusterIP.Spec.Ports[0].NodePort = 0
	if _, err := update(clusterIP); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "status.load_balancer_ips") {
		t.Errorf("a ClusterIP service with load-balancer addresses: %v; want InvalidArgument", err)
	}
	clusterIP.Status = nil
	if got, err = update(clusterIP); err != nil || len(got.GetStatus().GetLoadBalancerIps()) != 0 {
		t.Fatalf("type changed to ClusterIP: %v, %v; want the addresses gone", got, err)
	}
	if got := lbIPs(agent.recv()); len(got) != 0 {
		t.Errorf("after the type change, the node was sent %v", got)
	}
}

// An agent's report costs the server no more than the node's share of the
// cluster: health of services the server does not have is dropped, texts
// are cut.
func TestReportsAreBounded(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: validService()}); err != nil {
		t.Fatal(err)
	}
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())
	r := &weirv1.Report{Full: true, NodeHealth: &weirv1.NodeHealth{HealthzCode: 200, LivezCode: 200},
		Services: []*weirv1.ServiceHealth{{Namespace: "default", Name: "web", HealthCheckError: strings.Repeat("x", 100000)}}}
	for i := range 5000 {
		r.Services = append(r.Services, &weirv1.ServiceHealth{Namespace: "junk", Name: strconv.Itoa(i), HealthCheckError: strings.Repeat("y", 500)})
	}
	if err := agent.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: r}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var services map[string]observed.Service
		for _, st := range ts.Hub.Status() {
			if st.Node == "node1" {
				services = st.Services
			}
		}
		if web, ok := services["default/web"]; ok {
			if len(services) != 1 {
				t.Errorf("the server kept the health of %d services; want only default/web", len(services))
			}
			if len(web.HealthCheckError) > 1100 {
				t.Errorf("a %d-byte error was kept whole", len(web.HealthCheckError))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the report never arrived")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Apply writes several resources as one: one revision, one state to the
// agents, and a refusal of any leaves every one unwritten.
func TestApplyIsOneWrite(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := connectAgent(t, ctx, ts, "node1", 0)
	full := agent.recv()
	agent.ack(full.GetVersion())
	svc := func(name, ip string, nodePort int32) *weirv1.ApplyResource {
		s := validService()
		s.Metadata.Name, s.Spec.ClusterIps, s.Spec.Ports[0].NodePort = name, []string{ip}, nodePort
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Service{Service: s}}
	}
	slice := &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_EndpointSlice{EndpointSlice: &weirv1.EndpointSlice{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "a-1"}, ServiceName: "a",
		Endpoints: []*weirv1.Endpoint{{Addresses: []string{"10.244.1.11"}, NodeName: "node1"}}}}}

	// Each fine alone; together they share a node port.
	_, err := ts.Registry.Apply(ctx, &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{svc("a", "10.96.0.51", 30051), slice, svc("b", "10.96.0.52", 30051)}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "resources[2].service") {
		t.Fatalf("conflicting batch: %v; want FailedPrecondition naming resources[2]", err)
	}
	if _, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "a"}); status.Code(err) != codes.NotFound {
		t.Errorf("a refused batch wrote its first resource: %v", err)
	}
	// A bad field is named with its place in the batch.
	bad := svc("c", "10.96.0.53", 22)
	if _, err := ts.Registry.Apply(ctx, &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{bad}}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "resources[0].service.spec.ports[0].node_port") {
		t.Errorf("a node port outside the range: %v", err)
	}
	if _, err := ts.Registry.Apply(ctx, &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{svc("a", "10.96.0.51", 30051), svc("a", "10.96.0.51", 30051)}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("the same resource twice: %v", err)
	}
	check, err := ts.Registry.Apply(ctx, &weirv1.ApplyRequest{ValidateOnly: true, Resources: []*weirv1.ApplyResource{svc("a", "10.96.0.51", 30051), slice}})
	if err != nil || !check.GetResults()[0].GetCreated() {
		t.Fatalf("validate only: %v, %v", check, err)
	}
	if _, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "a"}); status.Code(err) != codes.NotFound {
		t.Errorf("validate_only wrote: %v", err)
	}

	done, err := ts.Registry.Apply(ctx, &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{svc("a", "10.96.0.51", 30051), slice, svc("b", "10.96.0.52", 30052)}})
	if err != nil {
		t.Fatal(err)
	}
	rv := done.GetResourceVersion() //lint:ignore SA1019 still filled, as the results' metadata.resource_version
	for i, r := range done.GetResults() {
		var got string
		switch x := r.GetResource().GetResource().(type) {
		case *weirv1.ApplyResource_Service:
			got = x.Service.GetMetadata().GetResourceVersion()
		case *weirv1.ApplyResource_EndpointSlice:
			got = x.EndpointSlice.GetMetadata().GetResourceVersion()
		}
		if got != rv || !r.GetCreated() {
			t.Errorf("result %d at revision %s, created %v; want %s, created", i, got, r.GetCreated(), rv)
		}
	}
	// The agent gets both services, with a's endpoint, in one version.
	msg := agent.recv()
	if strconv.FormatUint(msg.GetVersion(), 10) != rv || len(msg.GetUpserts()) != 2 {
		t.Fatalf("the agent was sent version %d with %d services; want %s with 2", msg.GetVersion(), len(msg.GetUpserts()), rv)
	}
	for _, u := range msg.GetUpserts() {
		if u.GetName() == "a" && len(u.GetPorts()[0].GetEndpoints()) != 1 {
			t.Errorf("service a reached the agent without its endpoint: %v", u)
		}
	}
	// Applied again as is: an update of each, still one revision.
	again, err := ts.Registry.Apply(ctx, &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{svc("a", "10.96.0.51", 30051), svc("b", "10.96.0.52", 30052)}})
	if err != nil || again.GetResults()[0].GetCreated() {
		t.Fatalf("applying again: %v, %v", again, err)
	}
}
