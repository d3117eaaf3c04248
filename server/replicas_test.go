package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/servertest"
	"github.com/weirlb/weir/server/store/etcdstore"
	"github.com/weirlb/weir/test/etcdcluster"
	"github.com/weirlb/weir/test/wait"
)

// startReplica runs one replica of the server on the etcd cluster.
func startReplica(t *testing.T, c *etcdcluster.Cluster, name string) *servertest.Server {
	t.Helper()
	return servertest.Start(t, "", func(cfg *server.Config) {
		cfg.Etcd = &etcdstore.Config{Endpoints: c.Endpoints(), Prefix: "/" + strings.ReplaceAll(t.Name(), "/", "-")}
		cfg.Replica, cfg.LeaseTTL = name, time.Second
	})
}

// eventually retries check until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	wait.For(t, timeout, "replicas", check)
}

// poolsOf lists a replica's pools as name@version.
func poolsOf(t *testing.T, ts *servertest.Server) string {
	t.Helper()
	resp, err := ts.Registry.ListAddressPools(context.Background(), &weirv1.ListAddressPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range resp.GetAddressPools() {
		out = append(out, fmt.Sprintf("%s@%s", p.GetMetadata().GetName(), p.GetMetadata().GetResourceVersion()))
	}
	return strings.Join(out, " ")
}

// TestReplicasDecideConflictingWritesOnce: two replicas on one etcd take
// writes that conflict with each other at the same moment (pools over the
// same addresses). For every pair exactly one is accepted, whichever
// replica took it, and both replicas then hold the same pools at the same
// versions.
func TestReplicasDecideConflictingWritesOnce(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	a, b := startReplica(t, c, "a"), startReplica(t, c, "b")
	ctx := context.Background()
	const pairs = 20
	results := make([][2]error, pairs)
	var wg sync.WaitGroup
	for i := range pairs {
		for j, ts := range []*servertest.Server{a, b} {
			wg.Go(func() {
				_, results[i][j] = ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
					Metadata: &weirv1.ObjectMeta{Name: fmt.Sprintf("%c%d", 'a'+j, i)}, Addresses: []string{fmt.Sprintf("198.18.%d.0/28", i)}}})
			})
		}
	}
	wg.Wait()
	for i, r := range results {
		if (r[0] == nil) == (r[1] == nil) {
			t.Errorf("pair %d: accepted on a: %v, on b: %v; want exactly one", i, r[0], r[1])
		}
		for _, err := range r {
			if err != nil && status.Code(err) != codes.FailedPrecondition {
				t.Errorf("pair %d refused with %v, want FailedPrecondition (in use)", i, err)
			}
		}
	}
	eventually(t, 5*time.Second, func() error {
		if pa, pb := poolsOf(t, a), poolsOf(t, b); pa != pb || len(strings.Fields(pa)) != pairs {
			return fmt.Errorf("replica a holds %q\nreplica b holds %q\nwant the same %d pools", pa, pb, pairs)
		}
		return nil
	})
}

// TestReplicasAssignEachAddressOnce: load-balancer services created
// through both replicas get addresses from one pool, no address twice.
// When the leader stops, another replica takes over assignment.
func TestReplicasAssignEachAddressOnce(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	replicas := []*servertest.Server{startReplica(t, c, "a"), startReplica(t, c, "b"), startReplica(t, c, "c")}
	ctx := context.Background()
	if _, err := replicas[0].Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/27"}}}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			svc := &weirv1.Service{
				Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("s%d", i)},
				Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{fmt.Sprintf("10.96.1.%d", i+1)},
					Ports: []*weirv1.ServicePort{{Name: "p", Port: 80}}},
			}
			if _, err := replicas[i%3].Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	distinct := func(ts *servertest.Server, want int) error {
		resp, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{})
		if err != nil {
			return err
		}
		seen := map[string]string{}
		for _, s := range resp.GetServices() {
			for _, ip := range s.GetStatus().GetLoadBalancerIps() {
				if other, ok := seen[ip]; ok {
					t.Fatalf("%s assigned to both %s and %s", ip, other, s.GetMetadata().GetName())
				}
				if !netip.MustParsePrefix("203.0.113.0/27").Contains(netip.MustParseAddr(ip)) {
					t.Fatalf("%s assigned outside the pool", ip)
				}
				seen[ip] = s.GetMetadata().GetName()
			}
		}
		if len(seen) != want {
			return fmt.Errorf("%d services have an address, want %d", len(seen), want)
		}
		return nil
	}
	for _, ts := range replicas {
		eventually(t, 10*time.Second, func() error { return distinct(ts, n) })
	}

	// Stop every replica but the last: whichever led, the last one now
	// does, within the lease and a campaign.
	replicas[0].Stop()
	replicas[1].Stop()
	last := replicas[2]
	svc := &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "late"},
		Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{"10.96.2.1"},
			Ports: []*weirv1.ServicePort{{Name: "p", Port: 80}}},
	}
	if _, err := last.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error { return distinct(last, n+1) })
}

// TestAgentStatusIsSeenFromEveryReplica: an agent connected to one
// replica shows as connected, with what it applied, in every replica's
// status; when it leaves, it shows as gone there too.
func TestAgentStatusIsSeenFromEveryReplica(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	a, b := startReplica(t, c, "a"), startReplica(t, c, "b")
	ctx, cancel := context.WithCancel(context.Background())
	agent := helloAgent(t, ctx, a, &weirv1.Hello{NodeName: "n1"})
	first := agent.recv()
	agent.ack(first.GetVersion())
	statusOf := weirv1.NewStatusServiceClient(b.Conn)
	nodeOnB := func() (*weirv1.NodeStatus, error) {
		resp, err := statusOf.ListNodeStatuses(context.Background(), &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return nil, err
		}
		for _, n := range resp.GetNodes() {
			if n.GetName() == "n1" {
				return n, nil
			}
		}
		return nil, nil
	}
	eventually(t, 5*time.Second, func() error {
		n, err := nodeOnB()
		if err != nil || !n.GetConnected() || n.GetAppliedVersion() != first.GetVersion() {
			return fmt.Errorf("replica b shows n1 as %v (%v), want connected with version %d applied", n, err, first.GetVersion())
		}
		return nil
	})
	// Later versions too: b follows what the agent applies.
	for i := range 5 {
		if _, err := b.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
			Metadata: &weirv1.ObjectMeta{Name: fmt.Sprintf("p%d", i)}, Addresses: []string{fmt.Sprintf("198.18.%d.0/28", i)}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: lbSvc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.0.%d", 10+i), 80)}); err != nil {
			t.Fatal(err)
		}
		msg := agent.recv()
		agent.ack(msg.GetVersion())
		eventually(t, 5*time.Second, func() error {
			n, err := nodeOnB()
			if err != nil || !n.GetConnected() || n.GetAppliedVersion() != msg.GetVersion() {
				return fmt.Errorf("replica b shows n1 as %v (%v), want connected with version %d applied", n, err, msg.GetVersion())
			}
			return nil
		})
	}
	cancel()
	eventually(t, 5*time.Second, func() error {
		if n, err := nodeOnB(); err != nil || n.GetConnected() {
			return fmt.Errorf("replica b shows n1 as %v (%v) after it left, want not connected", n, err)
		}
		return nil
	})
}

// TestReplicaWithoutTheStoreSendsAgentsAway: when etcd is gone, a replica
// says it is not current (gRPC health) and ends its agents' streams with
// "replica not current", so that they move to a replica that is; an agent
// that asks for a stale state is still served the last one. When etcd
// returns, the replica serves again without a restart.
func TestReplicaWithoutTheStoreSendsAgentsAway(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	a := startReplica(t, c, "a")
	ctx := context.Background()
	fresh := helloAgent(t, ctx, a, &weirv1.Hello{NodeName: "n1"})
	fresh.recv()
	health := healthpb.NewHealthClient(a.Conn)
	healthIs := func(want healthpb.HealthCheckResponse_ServingStatus) func() error {
		return func() error {
			resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || resp.GetStatus() != want {
				return fmt.Errorf("health %v (%v), want %v", resp.GetStatus(), err, want)
			}
			return nil
		}
	}
	eventually(t, 5*time.Second, healthIs(healthpb.HealthCheckResponse_SERVING))

	if _, err := a.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "before"}, Addresses: []string{"198.18.0.0/28"}}}); err != nil {
		t.Fatal(err)
	}
	c.Members[0].Kill()
	eventually(t, 10*time.Second, healthIs(healthpb.HealthCheckResponse_NOT_SERVING))
	// Reads and writes are refused at once, naming why: what the replica
	// holds may be behind the cluster's state. Health keeps answering.
	start := time.Now()
	_, readErr := a.Registry.ListAddressPools(ctx, &weirv1.ListAddressPoolsRequest{})
	_, writeErr := a.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "during"}, Addresses: []string{"198.18.1.0/28"}}})
	_, statusErr := weirv1.NewStatusServiceClient(a.Conn).ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
	for what, err := range map[string]error{"a read": readErr, "a write": writeErr, "a status call": statusErr} {
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "replica not current") {
			t.Errorf("%s with etcd gone: %v, want Unavailable: replica not current", what, err)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("refusing took %v, want at once", took)
	}
	if _, err := fresh.stream.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "replica not current") {
		t.Fatalf("the agent's stream ended with %v, want Unavailable: replica not current", err)
	}
	stream, err := a.Agents.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "n1"}}})
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("a new stream on a replica that is not current: %v, want Unavailable", err)
	}
	// n1 is registered already (and the registry takes no write now).
	staleStream, err := a.Agents.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	staleStream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "n1", AcceptStale: true}}})
	stale := &agentStream{t, staleStream}
	if msg := stale.recv(); !msg.GetFull() {
		t.Fatalf("an agent that accepts a stale state got %v, want the last full state", msg)
	}

	if err := c.Members[0].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, healthIs(healthpb.HealthCheckResponse_SERVING))
	again := helloAgent(t, ctx, a, &weirv1.Hello{NodeName: "n2"})
	if msg := again.recv(); !msg.GetFull() {
		t.Fatalf("after the store returned: %v, want a full state", msg)
	}
}

// cuttableProxy forwards TCP to target until cut: then it closes every
// connection and refuses new ones, as a network partition would.
type cuttableProxy struct {
	lis    net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	cutOff bool
}

func newCuttableProxy(t *testing.T, target string) *cuttableProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttableProxy{lis: lis}
	t.Cleanup(p.cut)
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			if p.cutOff {
				in.Close()
				out.Close()
			}
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *cuttableProxy) url() string { return "http://" + p.lis.Addr().String() }

func (p *cuttableProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutOff = true
	p.lis.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// leaderName is the replica that holds the election, read from etcd.
func leaderName(t *testing.T, c *etcdcluster.Cluster, prefix string) string {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(context.Background(), prefix+"/leader/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// TestReplicaCutOffFromEtcdStepsAside: the leading replica loses its way
// to etcd while the others keep theirs. It says it is not current and
// sends its agents away; its leadership passes to another replica, which
// assigns addresses from then on. (A replica's return to a reachable
// store is TestReplicaWithoutTheStoreSendsAgentsAway's.)
func TestReplicaCutOffFromEtcdStepsAside(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	proxy := newCuttableProxy(t, strings.TrimPrefix(c.Members[0].ClientURL, "http://"))
	prefix := "/" + t.Name()
	start := func(name string, endpoint string) *servertest.Server {
		return servertest.Start(t, "", func(cfg *server.Config) {
			cfg.Etcd = &etcdstore.Config{Endpoints: []string{endpoint}, Prefix: prefix}
			cfg.Replica, cfg.LeaseTTL = name, time.Second
		})
	}
	a := start("a", proxy.url())
	eventually(t, 5*time.Second, func() error {
		if l := leaderName(t, c, prefix); l != "a" {
			return fmt.Errorf("leader %q, want a", l)
		}
		return nil
	})
	b := start("b", c.Members[0].ClientURL)
	ctx := context.Background()
	if _, err := b.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/28"}}}); err != nil {
		t.Fatal(err)
	}
	agent := helloAgent(t, ctx, a, &weirv1.Hello{NodeName: "n1"})
	agent.recv()

	proxy.cut()
	if _, err := agent.stream.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "replica not current") {
		t.Fatalf("the agent's stream on the cut-off replica ended with %v, want Unavailable: replica not current", err)
	}
	eventually(t, 10*time.Second, func() error {
		if l := leaderName(t, c, prefix); l != "b" {
			return fmt.Errorf("leader %q, want b", l)
		}
		return nil
	})
	if _, err := b.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: lbSvc("web", "10.96.0.50", 80)}); err != nil {
		t.Fatal(err)
	}
	assigned(t, b, map[string]string{"web": "[203.0.113.0]"})
	for _, ts := range []*servertest.Server{a, b} {
		resp, err := healthpb.NewHealthClient(ts.Conn).Check(ctx, &healthpb.HealthCheckRequest{})
		want := healthpb.HealthCheckResponse_SERVING
		if ts == a {
			want = healthpb.HealthCheckResponse_NOT_SERVING
		}
		if err != nil || resp.GetStatus() != want {
			t.Errorf("health of %s: %v (%v), want %v", map[bool]string{true: "a", false: "b"}[ts == a], resp.GetStatus(), err, want)
		}
	}
}

// TestAnOversizedReportIsStillShared: an agent reporting 60,000
// announcements (within what a server takes, past what etcd takes in one
// request) still shows as connected on the other replica, and so does the
// node published beside it.
func TestAnOversizedReportIsStillShared(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	a, b := startReplica(t, c, "a"), startReplica(t, c, "b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	big := helloAgent(t, ctx, a, &weirv1.Hello{NodeName: "n1"})
	big.ack(big.recv().GetVersion())
	small := helloAgent(t, ctx, a, &weirv1.Hello{NodeName: "n2"})
	small.ack(small.recv().GetVersion())
	r := &weirv1.Report{Full: true, NodeHealth: &weirv1.NodeHealth{HealthzCode: 200, LivezCode: 200}, Bgp: &weirv1.BgpSessions{}}
	for i := range 60000 {
		r.Bgp.Announcements = append(r.Bgp.Announcements, &weirv1.BgpAnnouncement{
			Prefix: fmt.Sprintf("10.%d.%d.%d/32", i>>16, (i>>8)&255, i&255), NextHop: "192.0.2.11", Weight: 1})
	}
	if err := big.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: r}}); err != nil {
		t.Fatal(err)
	}
	// A change both apply after the report: b must see both apply it.
	if _, err := a.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: lbSvc("later", "10.96.0.77", 80)}); err != nil {
		t.Fatal(err)
	}
	// Each at the version it got: the status the report publishes is a
	// revision of the same store, so a session that sends after it names
	// that revision.
	want := map[string]uint64{}
	for name, agent := range map[string]*agentStream{"n1": big, "n2": small} {
		msg := agent.recv()
		agent.ack(msg.GetVersion())
		want[name] = msg.GetVersion()
	}
	statusOf := weirv1.NewStatusServiceClient(b.Conn)
	eventually(t, 10*time.Second, func() error {
		resp, err := statusOf.ListNodeStatuses(context.Background(), &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		applied := map[string]uint64{}
		for _, n := range resp.GetNodes() {
			if n.GetConnected() {
				applied[n.GetName()] = n.GetAppliedVersion()
			}
		}
		if applied["n1"] != want["n1"] || applied["n2"] != want["n2"] {
			return fmt.Errorf("replica b shows applied versions %v; want n1 and n2 connected at %v", applied, want)
		}
		return nil
	})
}
