package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/weirlb/weir/internal/report"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/dial"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// fakeApplier records what it was asked to program and fails on demand.
type fakeApplier struct {
	mu      sync.Mutex
	fail    error
	applied []datapath.NodeState
}

func (f *fakeApplier) Apply(_ context.Context, st datapath.NodeState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	// The map is the syncer's, changed in place by the next message: a
	// record keeps a copy.
	st.Services = maps.Clone(st.Services)
	f.applied = append(f.applied, st)
	return nil
}

func (f *fakeApplier) Resync(context.Context) error { return nil }

func (f *fakeApplier) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *fakeApplier) last() datapath.NodeState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied[len(f.applied)-1]
}

// scriptedServer is an AgentService whose streams the test drives.
type scriptedServer struct {
	weirv1.UnimplementedAgentServiceServer
	streams chan weirv1.AgentService_SyncServer
	hellos  chan *weirv1.Hello
	end     chan error // ends the current stream from the server side, with the error sent
}

func (s *scriptedServer) Sync(stream weirv1.AgentService_SyncServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	s.hellos <- req.GetHello()
	s.streams <- stream
	select {
	case <-stream.Context().Done():
		return nil
	case err := <-s.end:
		return err
	}
}

// serveScripted runs a scripted server on a loopback port until the test
// ends, and returns its address.
func serveScripted(t *testing.T) (*scriptedServer, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ss := &scriptedServer{streams: make(chan weirv1.AgentService_SyncServer, 4), hellos: make(chan *weirv1.Hello, 4), end: make(chan error)}
	g := grpc.NewServer()
	weirv1.RegisterAgentServiceServer(g, ss)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return ss, lis.Addr().String()
}

func startScripted(t *testing.T) (*scriptedServer, *grpc.ClientConn) {
	t.Helper()
	ss, addr := serveScripted(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return ss, conn
}

func recvAnswer(t *testing.T, stream weirv1.AgentService_SyncServer) *weirv1.SyncRequest {
	t.Helper()
	type result struct {
		req *weirv1.SyncRequest
		err error
	}
	ch := make(chan result, 1)
	go func() { r, err := stream.Recv(); ch <- result{r, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.req
	case <-time.After(5 * time.Second):
		t.Fatal("no answer from the agent")
		return nil
	}
}

func svc(name, ip string) *weirv1.NodeService {
	return &weirv1.NodeService{Namespace: "default", Name: name, ClusterIps: []string{ip},
		Ports: []*weirv1.NodeServicePort{{Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: 80}}}
}

func TestSyncerAcksNacksAndKeepsLastGoodState(t *testing.T) {
	ss, conn := startScripted(t)
	dp := &fakeApplier{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	s := New(Config{NodeName: "node1", ResyncPeriod: time.Hour, RetryPeriod: 100 * time.Millisecond, Metrics: reg}, conn, dp, nil, slog.New(slog.DiscardHandler))
	// metricsSay checks what an operator's alerts read: the stale gauges
	// and the pending changes.
	metricsSay := func(when string, disconnected, notApplied, pending float64) {
		t.Helper()
		for _, m := range []struct {
			name, reason string
			want         float64
		}{
			{"weir_agent_configuration_stale", "disconnected", disconnected},
			{"weir_agent_configuration_stale", "not_applied", notApplied},
			{"weir_sync_proxy_rules_pending_changes", "", pending},
		} {
			if got := gauge(t, reg, m.name, m.reason); got != m.want {
				t.Errorf("%s: %s{%s} = %v, want %v", when, m.name, m.reason, got, m.want)
			}
		}
	}
	metricsSay("before any stream", 1, 0, 0)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	if h := <-ss.hellos; h.GetNodeName() != "node1" || h.GetAppliedVersion() != 0 {
		t.Fatalf("hello %v", h)
	}
	stream := <-ss.streams
	send := func(m *weirv1.SyncResponse) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}

	send(&weirv1.SyncResponse{Version: 5, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.10"), svc("db", "10.96.0.20")}})
	if a := recvAnswer(t, stream); a.GetAck().GetVersion() != 5 {
		t.Fatalf("answer to version 5: %v, want ACK 5", a)
	}
	if n := len(dp.last().Services); n != 2 {
		t.Fatalf("applied %d services, want 2", n)
	}
	metricsSay("streaming, applied", 0, 0, 0)
	if q := gauge(t, reg, "weir_sync_proxy_rules_last_queued_timestamp_seconds", ""); time.Since(time.Unix(int64(q), 0)) > time.Minute {
		t.Errorf("last queued %v, want about now", q)
	}

	// A delta the agent cannot decode: NACK, nothing applied.
	send(&weirv1.SyncResponse{Version: 6, Upserts: []*weirv1.NodeService{svc("web", "not-an-ip")}})
	if a := recvAnswer(t, stream); a.GetNack().GetVersion() != 6 || a.GetNack().GetError() == "" {
		t.Fatalf("answer to a bad version 6: %v, want NACK with the error", a)
	}
	if got := dp.last().Services[datapath.ServiceKey{Namespace: "default", Name: "web"}].ClusterIPs[0].String(); got != "10.96.0.10" {
		t.Errorf("after a NACK the applied web has cluster IP %s, want the last good 10.96.0.10", got)
	}

	// A later delta would be applied without version 6's change, and its
	// ACK would tell the server the node holds what it sent: refused too,
	// until a whole state comes.
	send(&weirv1.SyncResponse{Version: 7, Upserts: []*weirv1.NodeService{svc("cache", "10.96.0.30")}})
	if a := recvAnswer(t, stream); a.GetNack().GetVersion() != 7 || !strings.Contains(a.GetNack().GetError(), "version 6") {
		t.Fatalf("answer to version 7 after version 6 was refused: %v, want NACK 7 naming version 6", a)
	}
	if n := len(dp.last().Services); n != 2 {
		t.Errorf("applied %d services after a refused delta, want the last good 2", n)
	}
	metricsSay("a version missing", 0, 1, 0)
	send(&weirv1.SyncResponse{Version: 8, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.11"), svc("db", "10.96.0.20")}})
	if a := recvAnswer(t, stream); a.GetAck().GetVersion() != 8 {
		t.Fatalf("answer to the whole version 8: %v, want ACK 8", a)
	}
	if got := dp.last().Services[datapath.ServiceKey{Namespace: "default", Name: "web"}].ClusterIPs[0].String(); got != "10.96.0.11" {
		t.Errorf("after the whole state the applied web has cluster IP %s, want 10.96.0.11", got)
	}

	// The datapath fails: NACK; when it recovers, the periodic retry ACKs.
	// The state was received whole, so later deltas go on.
	dp.setFail(errors.New("nft: no space left"))
	send(&weirv1.SyncResponse{Version: 9, Removals: []string{"default/db"}})
	if a := recvAnswer(t, stream); a.GetNack().GetVersion() != 9 {
		t.Fatalf("answer to version 9 with a failing datapath: %v, want NACK 9", a)
	}
	metricsSay("the datapath failing", 0, 1, 1)
	dp.setFail(nil)
	if a := recvAnswer(t, stream); a.GetAck().GetVersion() != 9 {
		t.Fatalf("after recovery: %v, want ACK 9 from the retry", a)
	}
	if n := len(dp.last().Services); n != 1 {
		t.Errorf("applied %d services after removing db, want 1", n)
	}
	if st := s.Status(); st.AppliedVersion != 9 || st.LastError != nil {
		t.Errorf("status %+v, want applied 9 and no error", st)
	}
	metricsSay("recovered", 0, 0, 0)
	cancel()
	<-done
	metricsSay("stopped", 1, 0, 0)
}

// gauge reads one gauge from reg, with the label reason when not empty.
func gauge(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if reason == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == reason) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, reason)
	return 0
}

// endAndReconnect ends the agent's stream from the server's side and
// returns the hello it sends again.
func endAndReconnect(t *testing.T, ss *scriptedServer) *weirv1.Hello {
	t.Helper()
	next := make(chan *weirv1.Hello, 1)
	go func() { next <- <-ss.hellos }()
	ss.end <- nil
	select {
	case h := <-next:
		return h
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not reconnect")
		return nil
	}
}

func TestSyncerReconnectsWithAppliedVersion(t *testing.T) {
	ss, conn := startScripted(t)
	dp := &fakeApplier{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(Config{NodeName: "node1", MaxBackoff: 100 * time.Millisecond}, conn, dp, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-ss.hellos
	first := <-ss.streams
	if err := first.Send(&weirv1.SyncResponse{Version: 9, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.10")}}); err != nil {
		t.Fatal(err)
	}
	recvAnswer(t, first)
	// End the stream from the server side (as a server restart would).
	if h := endAndReconnect(t, ss); h.GetAppliedVersion() != 9 {
		t.Errorf("reconnect hello says applied %d, want 9", h.GetAppliedVersion())
	}
	// A version refused is missing from the applied state: resuming from
	// 9 would skip it, so the next stream asks for a whole state.
	stream := <-ss.streams
	if err := stream.Send(&weirv1.SyncResponse{Version: 10, Upserts: []*weirv1.NodeService{svc("web", "not-an-ip")}}); err != nil {
		t.Fatal(err)
	}
	if a := recvAnswer(t, stream); a.GetNack().GetVersion() != 10 {
		t.Fatalf("answer to a bad version 10: %v, want NACK 10", a)
	}
	if h := endAndReconnect(t, ss); h.GetAppliedVersion() != 0 {
		t.Errorf("reconnect hello after a refused version says applied %d, want 0 (a whole state)", h.GetAppliedVersion())
	}
	cancel()
	<-done
}

// TestSyncerMovesToTheNextReplicaWhenItsIsNotCurrent: a replica that
// ends the stream as not current sends the agent to the next one at once,
// where it resumes from the version it applied.
func TestSyncerMovesToTheNextReplicaWhenItsIsNotCurrent(t *testing.T) {
	a, addrA := serveScripted(t)
	b, addrB := serveScripted(t)
	var conn *dial.Servers
	for conn == nil || conn.Current() != addrA { // each client starts at random
		if conn != nil {
			conn.Close()
		}
		var err error
		if conn, err = dial.NewServers(addrA+","+addrB, nil); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(Config{NodeName: "node1"}, conn, &fakeApplier{}, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-a.hellos
	first := <-a.streams
	if err := first.Send(&weirv1.SyncResponse{Version: 9, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.10")}}); err != nil {
		t.Fatal(err)
	}
	recvAnswer(t, first)

	a.end <- status.Error(codes.Unavailable, dial.NotCurrent+": lost the store")
	select {
	case h := <-b.hellos:
		if h.GetAppliedVersion() != 9 || h.GetAcceptStale() {
			t.Errorf("hello to the next replica says applied %d, accept_stale %v; want 9, false", h.GetAppliedVersion(), h.GetAcceptStale())
		}
	case <-time.After(time.Second):
		t.Fatal("the agent was not on the next replica a second after its own said it is not current")
	}
	cancel()
	<-done
}

// runSyncer runs a syncer for node1 against a scripted server until the
// test ends, and returns what it applies and its first stream.
func runSyncer(t *testing.T) (*fakeApplier, weirv1.AgentService_SyncServer) {
	t.Helper()
	ss, conn := startScripted(t)
	dp := &fakeApplier{}
	ctx, cancel := context.WithCancel(context.Background())
	s := New(Config{NodeName: "node1"}, conn, dp, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-ss.hellos
	return dp, <-ss.streams
}

func TestSyncerAppliesAStateSentInParts(t *testing.T) {
	dp, stream := runSyncer(t)
	for _, m := range []*weirv1.SyncResponse{
		{Version: 3, Full: true, Upserts: []*weirv1.NodeService{svc("a", "10.96.0.1")}, More: true},
		{Version: 3, Upserts: []*weirv1.NodeService{svc("b", "10.96.0.2")}, More: true},
		{Version: 3, Upserts: []*weirv1.NodeService{svc("c", "10.96.0.3")}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if a := recvAnswer(t, stream); a.GetAck().GetVersion() != 3 {
		t.Fatalf("answer %v, want one ACK of version 3 after the last part", a)
	}
	dp.mu.Lock()
	applies, n := len(dp.applied), len(dp.applied[len(dp.applied)-1].Services)
	dp.mu.Unlock()
	if applies != 1 || n != 3 {
		t.Errorf("applied %d times, last with %d services; want once, with all 3", applies, n)
	}
}

// TestSyncerIsBackSoonAfterTheServerReturns: with the dialer and backoff
// the agent ships with, a server that was away for several seconds (long
// enough for an unbounded backoff to grow well past it) has the agent's
// stream back within a second or so of listening again.
func TestSyncerIsBackSoonAfterTheServerReturns(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	ss := &scriptedServer{streams: make(chan weirv1.AgentService_SyncServer, 4), hellos: make(chan *weirv1.Hello, 4), end: make(chan error)}
	serve := func(lis net.Listener) *grpc.Server {
		g := grpc.NewServer()
		weirv1.RegisterAgentServiceServer(g, ss)
		go g.Serve(lis)
		return g
	}
	g := serve(lis)
	conn, err := dial.Server(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(Config{NodeName: "node1"}, conn, &fakeApplier{}, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-ss.hellos
	first := <-ss.streams
	if err := first.Send(&weirv1.SyncResponse{Version: 5, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.10")}}); err != nil {
		t.Fatal(err)
	}
	recvAnswer(t, first)

	g.Stop() // the server goes away...
	time.Sleep(6 * time.Second)
	lis, err = net.Listen("tcp", addr) // ...and comes back on its address
	if err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	g = serve(lis)
	defer g.Stop()
	select {
	case h := <-ss.hellos:
		t.Logf("the agent was back %v after the server listened again", time.Since(back).Round(time.Millisecond))
		if h.GetAppliedVersion() != 5 {
			t.Errorf("hello after the return says applied %d, want 5", h.GetAppliedVersion())
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("the agent was not back 3 s after the server returned")
	}
	cancel()
	<-done
}

// TestSyncerJoinsAServiceSentInPieces: a service too big for one message
// comes in several parts of one version, each with every port and some of
// the endpoints; the agent applies the union. A later version that carries
// the service again replaces it.
func TestSyncerJoinsAServiceSentInPieces(t *testing.T) {
	dp, stream := runSyncer(t)
	piece := func(addrs ...string) *weirv1.NodeService {
		p := svc("big", "10.96.0.50")
		for _, a := range addrs {
			p.Ports[0].Endpoints = append(p.Ports[0].Endpoints, &weirv1.NodeEndpoint{Address: a, Port: 8080, Ready: true, Serving: true})
		}
		return p
	}
	endpoints := func() []string {
		var out []string
		for _, ep := range dp.last().Services[datapath.ServiceKey{Namespace: "default", Name: "big"}].Ports[0].Endpoints {
			out = append(out, ep.Addr.String())
		}
		return out
	}
	for _, m := range []*weirv1.SyncResponse{
		{Version: 4, Full: true, Upserts: []*weirv1.NodeService{piece("10.244.1.1", "10.244.1.2")}, More: true},
		{Version: 4, Upserts: []*weirv1.NodeService{piece("10.244.1.3")}, More: true},
		{Version: 4, Upserts: []*weirv1.NodeService{piece("10.244.1.4")}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if a := recvAnswer(t, stream); a.GetAck().GetVersion() != 4 {
		t.Fatalf("answer %v, want ACK 4", a)
	}
	if got, want := endpoints(), []string{"10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4"}; !slices.Equal(got, want) {
		t.Errorf("joined pieces: endpoints %v, want %v", got, want)
	}
	if err := stream.Send(&weirv1.SyncResponse{Version: 5, Upserts: []*weirv1.NodeService{piece("10.244.1.9")}}); err != nil {
		t.Fatal(err)
	}
	if a := recvAnswer(t, stream); a.GetAck().GetVersion() != 5 {
		t.Fatalf("answer %v, want ACK 5", a)
	}
	if got, want := endpoints(), []string{"10.244.1.9"}; !slices.Equal(got, want) {
		t.Errorf("the next version's service: endpoints %v, want %v", got, want)
	}
}

// TestBigReportsGoInParts: a node with many services reports them in
// messages of at most ReportChunk services that, applied in order as the
// server does, give the whole report.
func TestBigReportsGoInParts(t *testing.T) {
	r := &weirv1.Report{Full: true, NodeHealth: &weirv1.NodeHealth{HealthzCode: 200}, RemovedServices: []string{"default/gone"}}
	for i := range 2*ReportChunk + 5 {
		r.Services = append(r.Services, &weirv1.ServiceHealth{Namespace: "default", Name: fmt.Sprintf("s%d", i)})
	}
	parts := splitReport(r, ReportChunk)
	if len(parts) != 3 || !parts[0].GetFull() || parts[0].GetNodeHealth() == nil || parts[1].GetFull() || parts[2].GetFull() {
		t.Fatalf("%d parts; want 3, only the first full and with the node's health", len(parts))
	}
	seen := 0
	for i, p := range parts {
		if len(p.GetServices()) > ReportChunk {
			t.Errorf("part %d has %d services", i, len(p.GetServices()))
		}
		seen += len(p.GetServices())
		if (len(p.GetRemovedServices()) > 0) != (i == len(parts)-1) {
			t.Errorf("part %d removals %v; want them in the last part only", i, p.GetRemovedServices())
		}
	}
	if seen != 2*ReportChunk+5 {
		t.Errorf("parts hold %d services, want %d", seen, 2*ReportChunk+5)
	}
}

// countingObserver reports how many services the last state received had.
type countingObserver struct {
	mu       sync.Mutex
	services int
	reported int
}

func (o *countingObserver) Received(st datapath.NodeState) {
	o.mu.Lock()
	o.services = len(st.Services)
	o.mu.Unlock()
}

func (o *countingObserver) Applied(time.Duration) {}

func (o *countingObserver) Report(full bool) *report.Report {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !full && o.services == o.reported {
		return nil
	}
	o.reported = o.services
	r := &report.Report{Full: full}
	for i := range o.services {
		r.Services = append(r.Services, report.ServiceReport{Namespace: "default", Name: fmt.Sprint(i)})
	}
	return r
}

// TestTheReportOfAStateComesBeforeItsAck: when the server hears an ACK,
// it already has the node's report of the state acknowledged.
func TestTheReportOfAStateComesBeforeItsAck(t *testing.T) {
	ss, conn := startScripted(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs := &countingObserver{}
	s := New(Config{NodeName: "node1", ResyncPeriod: time.Hour, RetryPeriod: time.Hour}, conn, &fakeApplier{}, obs, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-ss.hellos
	stream := <-ss.streams
	for v, services := range [][]*weirv1.NodeService{{svc("web", "10.96.0.10")}, {svc("web", "10.96.0.10"), svc("db", "10.96.0.20")}} {
		version := uint64(v + 1)
		if err := stream.Send(&weirv1.SyncResponse{Version: version, Full: true, Upserts: services}); err != nil {
			t.Fatal(err)
		}
		reported := -1
		for {
			a := recvAnswer(t, stream)
			if r := a.GetReport(); r != nil {
				reported = len(r.GetServices())
				continue
			}
			if a.GetAck().GetVersion() != version {
				t.Fatalf("answer %v, want ACK %d", a, version)
			}
			break
		}
		if reported != len(services) {
			t.Errorf("version %d: before its ACK the agent reported %d services, want %d", version, reported, len(services))
		}
	}
	cancel()
	<-done
}

// TestSyncerNamesWhatChanged: each apply names the services the messages
// since the last successful apply touched (nothing after a whole state),
// including those of a version whose apply failed and was retried.
func TestSyncerNamesWhatChanged(t *testing.T) {
	ss, conn := startScripted(t)
	dp := &fakeApplier{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(Config{NodeName: "node1", ResyncPeriod: time.Hour, RetryPeriod: 100 * time.Millisecond}, conn, dp, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-ss.hellos
	stream := <-ss.streams
	step := func(m *weirv1.SyncResponse, want ...string) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
		for {
			a := recvAnswer(t, stream)
			if a.GetAck().GetVersion() == m.GetVersion() {
				break
			}
			if a.GetNack() == nil {
				t.Fatalf("answer to version %d: %v", m.GetVersion(), a)
			}
			dp.setFail(nil) // the retry applies it
		}
		var got []string
		for _, k := range dp.last().Changed {
			got = append(got, k.String())
		}
		slices.Sort(got)
		if !slices.Equal(got, want) || (want == nil) != (dp.last().Changed == nil) {
			t.Errorf("version %d: changed %v (nil: %v), want %v", m.GetVersion(), got, dp.last().Changed == nil, want)
		}
	}
	step(&weirv1.SyncResponse{Version: 5, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.10"), svc("db", "10.96.0.20")}})
	step(&weirv1.SyncResponse{Version: 6, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.11")}}, "default/web")
	dp.setFail(errors.New("nft: no space left"))
	step(&weirv1.SyncResponse{Version: 7, Removals: []string{"default/db"}}, "default/db")
	step(&weirv1.SyncResponse{Version: 8, Upserts: []*weirv1.NodeService{svc("cache", "10.96.0.30")}}, "default/cache")
	cancel()
	<-done
}
