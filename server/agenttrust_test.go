package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/servertest"
)

// trustLab is a server with mutual TLS, nodes node1..nodeN registered,
// and a certificate of its own for node2 beside servertest's (node1's own,
// the agents' shared one).
func trustLab(t *testing.T, nodes int) (*servertest.Server, string) {
	t.Helper()
	dir := servertest.PKI(t)
	if err := certs.IssueClient(dir, "node2", certs.RoleAgent); err != nil {
		t.Fatal(err)
	}
	ts := servertest.Start(t, t.TempDir(), servertest.TLS(t, dir))
	admin := weirv1.NewRegistryServiceClient(servertest.Dial(t, ts.Addr, dir, "alice"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 1; i <= nodes; i++ {
		n := &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: fmt.Sprintf("node%d", i)}, Addresses: []string{fmt.Sprintf("192.0.2.%d", i)}}
		if _, err := admin.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	return ts, dir
}

func agentOf(t *testing.T, ts *servertest.Server, dir, cert string) weirv1.AgentServiceClient {
	t.Helper()
	return weirv1.NewAgentServiceClient(servertest.Dial(t, ts.Addr, dir, cert))
}

// openLeases opens node's lease stream and sends its first ask.
func openLeases(ctx context.Context, c weirv1.AgentServiceClient, node string) (weirv1.AgentService_LeasesClient, error) {
	st, err := c.Leases(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&weirv1.LeasesRequest{NodeName: node, Sequence: 1}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if _, err := st.Recv(); err != nil {
		return nil, err
	}
	return st, nil
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A node's agent listing tens of thousands of addresses as held, lapsed
// or refused on its lease stream (a stolen or broken agent) grows nothing
// the server keeps: only L2 addresses the node may own count.
func TestALeaseStreamCannotGrowTheServer(t *testing.T) {
	ts, dir := trustLab(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := openLeases(ctx, agentOf(t, ts, dir, "node1"), "node1")
	if err != nil {
		t.Fatal(err)
	}
	before := heapAfterGC()
	const asks, perAsk = 20, 65536
	for i := range asks {
		ask := &weirv1.LeasesRequest{Sequence: uint64(i + 2)}
		for j := range perAsk {
			a := fmt.Sprintf("2001:db8:%x::%x", i, j)
			ask.Lapsed = append(ask.Lapsed, &weirv1.L2Lease{Address: a, Epoch: uint64(j + 1)})
			ask.Held = append(ask.Held, &weirv1.L2Lease{Address: a, Epoch: uint64(j + 1)})
		}
		if err := st.Send(ask); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		refusals := &weirv1.LeasesRequest{Sequence: uint64(i + 2)}
		for j := range perAsk {
			refusals.Refused = append(refusals.Refused, &weirv1.L2Refusal{Address: fmt.Sprintf("2001:db8:%x::%x", i, j), Reason: "CannotAnswer"})
		}
		if err := st.Send(refusals); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	after := heapAfterGC()
	t.Logf("heap after GC: %d MiB before %d asks of %d claims, %d MiB after", before>>20, asks, perAsk, after>>20)
	if grown := int64(after) - int64(before); grown > 32<<20 {
		t.Fatalf("the server's heap grew by %d MiB from one node's lease claims on addresses that are not L2 addresses; want it bounded", grown>>20)
	}
}

// A lease stream is refused for a node the registry does not hold, and
// the agents' shared certificate never takes a node's stream from the
// agent on the node's own certificate: neither its lease stream nor its
// state stream ends, and the shared certificate cannot act for it.
func TestTheSharedCertificateCannotTakeANodesStreams(t *testing.T) {
	ts, dir := trustLab(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleet := agentOf(t, ts, dir, certs.FleetAgentName)
	if _, err := openLeases(ctx, fleet, "ghost"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a lease stream for an unregistered node: got %v, want FailedPrecondition", err)
	}

	own := agentOf(t, ts, dir, "node2")
	leases, err := openLeases(ctx, own, "node2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openLeases(ctx, fleet, "node2"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the shared certificate opening node2's lease stream beside node2's own: got %v, want PermissionDenied", err)
	}
	if err := leases.Send(&weirv1.LeasesRequest{Sequence: 5}); err != nil {
		t.Fatal(err)
	}
	if r, err := leases.Recv(); err != nil || r.GetSequence() != 5 {
		t.Errorf("node2's own lease stream after the shared certificate tried it: %v, %v; want its answer", r, err)
	}

	sync, err := own.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hello := func(s weirv1.AgentService_SyncClient) error {
		if err := s.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "node2"}}}); err != nil {
			return err
		}
		_, err := s.Recv()
		return err
	}
	if err := hello(sync); err != nil {
		t.Fatal(err)
	}
	other, err := fleet.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := hello(other); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the shared certificate streaming node2's state beside node2's own: got %v, want PermissionDenied", err)
	}
	// node2's own stream is still the node's: it is not ended, and the
	// server shows it connected.
	waitCtx, waitCancel := context.WithTimeout(ctx, 2*time.Second)
	defer waitCancel()
	recvd := make(chan error, 1)
	go func() { _, err := sync.Recv(); recvd <- err }()
	select {
	case err := <-recvd:
		t.Errorf("node2's own state stream ended after the shared certificate tried it: %v", err)
	case <-waitCtx.Done():
	}
	if !connected(ts, "node2") {
		t.Error("node2 is not shown connected")
	}
}

func connected(ts *servertest.Server, node string) bool {
	for _, n := range ts.Hub.Status() {
		if n.Node == node {
			return n.Connected
		}
	}
	return false
}

// State streams that take their whole state and never answer it hold
// their own caller's places only: a node's own agent still gets its whole
// state at once.
func TestStreamsThatNeverAnswerDoNotHoldUpANode(t *testing.T) {
	const silent = 64
	ts, dir := trustLab(t, silent+1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var conns []weirv1.AgentServiceClient
	for range 2 {
		conns = append(conns, agentOf(t, ts, dir, certs.FleetAgentName))
	}
	var received atomic.Int32
	for i := range silent {
		s, err := conns[i%2].Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: fmt.Sprintf("node%d", i+2)}}}); err != nil {
			t.Fatal(err)
		}
		go func() {
			if _, err := s.Recv(); err == nil { // the whole state, never answered
				received.Add(1)
			}
		}()
	}
	// The silent streams have taken what places they can once no more
	// of them gets a state for a while.
	for last := int32(-1); ; {
		time.Sleep(time.Second)
		n := received.Load()
		if n == silent || n == last {
			t.Logf("%d of %d silent streams got their whole state", n, silent)
			break
		}
		last = n
	}
	s, err := agentOf(t, ts, dir, "node1").Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "node1"}}}); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, err := s.Recv(); first <- err }()
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node1's whole state after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatalf("node1 had no state %v after its hello while %d streams on the shared certificate held their whole states unanswered", time.Since(start).Round(time.Millisecond), silent)
	}
}
