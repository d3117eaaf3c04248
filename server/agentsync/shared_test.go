package agentsync

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
	"github.com/weirlb/weir/test/wait"
)

// rawCodec is the client's proto codec, keeping the bytes of the last
// message received: what the wire carried, to compare between agents.
type rawCodec struct{ last []byte }

func (c *rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (c *rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.last = data.Materialize()
	return proto.Unmarshal(c.last, v.(proto.Message))
}

func (c *rawCodec) Name() string { return "proto" }

// serve runs h and serves its AgentService (with opts) on loopback until the test
// ends: a connection to it, the context its streams may live in, and the
// server (stopping it ends every stream).
func serve(t *testing.T, h *Hub, opts ...grpc.ServerOption) (context.Context, *grpc.ClientConn, *grpc.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	srv := grpc.NewServer(opts...)
	weirv1.RegisterAgentServiceServer(srv, h)
	t.Cleanup(func() { srv.Stop(); cancel(); <-done })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return ctx, conn, srv
}

// received is one message as an agent got it.
type received struct {
	msg *weirv1.SyncResponse
	raw []byte
}

// rawAgent is an agent's stream that records every message's bytes.
type rawAgent struct {
	t      *testing.T
	stream weirv1.AgentService_SyncClient
	got    chan received
}

func connectRaw(t *testing.T, ctx context.Context, conn *grpc.ClientConn, hello *weirv1.Hello) *rawAgent {
	t.Helper()
	codec := &rawCodec{}
	stream, err := weirv1.NewAgentServiceClient(conn).Sync(ctx, grpc.ForceCodecV2(codec))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	a := &rawAgent{t: t, stream: stream, got: make(chan received, 100)}
	go func() {
		defer close(a.got)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			a.got <- received{msg, codec.last}
		}
	}()
	return a
}

// next returns the agent's next whole message: its parts, up to the one
// that does not say More.
func (a *rawAgent) next(what string) []received {
	a.t.Helper()
	var parts []received
	for {
		select {
		case r, ok := <-a.got:
			if !ok {
				a.t.Fatalf("%s: the stream ended", what)
			}
			parts = append(parts, r)
			if !r.msg.GetMore() {
				return parts
			}
		case <-time.After(5 * time.Second):
			a.t.Fatalf("%s: no message", what)
		}
	}
}

func (a *rawAgent) answer(req *weirv1.SyncRequest) {
	a.t.Helper()
	if err := a.stream.Send(req); err != nil {
		a.t.Fatal(err)
	}
}

func ack(v uint64) *weirv1.SyncRequest {
	return &weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: v}}}
}

// servicesPart is the last part of a message without the node's own
// fields (a whole state's Full, the node's description), which the server
// writes in front of the services' encoding: what every agent making the
// same step shares.
func servicesPart(parts []received) received {
	last := parts[len(parts)-1]
	shared := proto.Clone(last.msg).(*weirv1.SyncResponse)
	shared.Full, shared.Node = false, nil
	return received{shared, last.raw[len(last.raw)-proto.Size(shared):]}
}

// Agents making the same step are sent the same bytes, encoded once: a
// whole state's services, a delta. An agent whose node changed in the
// step gets its own description in front of the same services; an
// agent that refused a state, or resumes from another version, takes
// its own step without changing what the others are sent.
func TestAgentsMakingTheSameStepShareOneEncoding(t *testing.T) {
	reg := registrytest.Open(t)
	for i, n := range []string{"n1", "n2", "n3"} {
		if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: n}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)})}}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(name string, ip byte) uint64 {
		t.Helper()
		svc, err := reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.ClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, ip})}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster})
		if err != nil {
			t.Fatal(err)
		}
		return svc.ResourceVersion
	}
	create("a", 10)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC))
	metrics := prometheus.NewRegistry()
	h := New(reg, Config{MinSyncPeriod: time.Second, Clock: clk, Metrics: metrics})
	ctx, conn, _ := serve(t, h)
	encoded := func() float64 { return testutil.ToFloat64(h.metrics.encoded) }
	sent := func() float64 { return testutil.ToFloat64(h.metrics.bytes) }
	sameBytes := func(what string, msgs map[string]received) {
		t.Helper()
		var first []byte
		for node, r := range msgs {
			if first == nil {
				first = r.raw
			} else if !bytes.Equal(r.raw, first) {
				t.Fatalf("%s: %s was sent other bytes than the others (%v)", what, node, r.msg)
			}
		}
	}

	agents := map[string]*rawAgent{}
	full := map[string]received{}
	for _, n := range []string{"n1", "n2", "n3"} {
		agents[n] = connectRaw(t, ctx, conn, &weirv1.Hello{NodeName: n})
		parts := agents[n].next(n + "'s whole state")
		if len(parts) != 1 || !parts[0].msg.GetFull() || parts[0].msg.GetNode().GetName() != n || len(parts[0].msg.GetUpserts()) != 1 {
			t.Fatalf("%s's whole state: %v; want one message, its node and the service", n, parts)
		}
		full[n] = servicesPart(parts)
		agents[n].answer(ack(parts[0].msg.GetVersion()))
	}
	// A whole state's place is held, on the clock, until its agent
	// answers: the fanout's wait is the only timer a step may find.
	answered := func(what string) {
		t.Helper()
		wait.Until(t, 10*time.Second, what, func() bool { return !clk.HasWaiters() })
	}
	answered("the whole states are answered")
	sameBytes("the whole state's services", full)
	if e, s := encoded(), sent(); e <= 0 || s < 3*e {
		t.Fatalf("%v bytes encoded, %v sent: want the whole state's services encoded once for three agents", e, s)
	}

	// An endpoint's worth of change: one step for every agent.
	step := func(what string, change func() uint64, wantOwn map[string]bool) map[string][]received {
		t.Helper()
		encodedBefore := encoded()
		v := change()
		wait.Until(t, 10*time.Second, "the fanout waits out the period", clk.HasWaiters)
		clk.Step(time.Second)
		msgs, services := map[string][]received{}, map[string]received{}
		for n, a := range agents {
			parts := a.next(what + " to " + n)
			if got := parts[0].msg.GetVersion(); got != v {
				t.Fatalf("%s: %s sent version %d, want %d", what, n, got, v)
			}
			if hasOwn := parts[0].msg.GetNode() != nil; len(parts) != 1 || hasOwn != wantOwn[n] {
				t.Fatalf("%s: %s sent %d parts (its node in it: %v); want one, its node in it: %v", what, n, len(parts), hasOwn, wantOwn[n])
			}
			msgs[n], services[n] = parts, servicesPart(parts)
		}
		sameBytes(what, services)
		if e := encoded() - encodedBefore; e != float64(len(services["n1"].raw)) {
			t.Fatalf("%s: %v bytes encoded; want the services' %d once", what, e, len(services["n1"].raw))
		}
		return msgs
	}
	create("warm", 11) // a lone change goes out at once: the next ones wait for the clock
	for _, a := range agents {
		a.answer(ack(a.next("a lone change")[0].msg.GetVersion()))
	}
	msgs := step("a new service", func() uint64 { return create("b", 12) }, nil)

	// n2 refuses it. An agent that refused a version refuses every delta
	// after it (what it holds lacks the refused change), so n2's next
	// message is a whole state; the others are still sent the step they
	// share.
	refused := msgs["n2"][0].msg.GetVersion()
	agents["n2"].answer(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Nack{Nack: &weirv1.Nack{Version: refused, Error: "no room"}}})
	agents["n1"].answer(ack(refused))
	agents["n3"].answer(ack(refused))
	wait.Until(t, 10*time.Second, "n2's refusal is recorded", func() bool {
		for _, st := range h.Status() {
			if st.Node == "n2" && st.LastErrorVersion == refused {
				return true
			}
		}
		return false
	})
	var n2 *refusal
	for _, st := range h.Status() {
		if st.Node == "n2" {
			n2 = &refusal{st.LastError, st.LastErrorVersion}
		}
	}
	if n2 == nil || n2.err != "no room" || n2.version != refused {
		t.Fatalf("n2's status %+v; want its refusal of %d recorded", n2, refused)
	}
	v := create("c", 13)
	wait.Until(t, 10*time.Second, "the fanout waits out the period", clk.HasWaiters)
	clk.Step(time.Second)
	for n, a := range agents {
		parts := a.next("a service after a refusal to " + n)
		first := parts[0].msg
		if first.GetVersion() != v || first.GetFull() != (n == "n2") {
			t.Fatalf("a service after n2's refusal: %s sent version %d, whole %v; want %d, whole only to n2", n, first.GetVersion(), first.GetFull(), v)
		}
		a.answer(ack(v))
	}
	answered("n2's whole state is answered")

	// n3's node changes with a service in the same batch: n3's own
	// description in front of the services every agent shares.
	step("a node and a service", func() uint64 {
		n, err := reg.Nodes.Get("n3")
		if err != nil {
			t.Fatal(err)
		}
		c := *n
		c.Zone = "zone-b" // not its address: that moves every node's place on the ring
		if _, err := reg.Nodes.Update(&c); err != nil {
			t.Fatal(err)
		}
		return create("d", 14)
	}, map[string]bool{"n3": true})

	// n2 comes back from the version it applied before the refusal: its
	// own step, and the others' next step is theirs as before.
	agents["n2"].stream.CloseSend()
	for range agents["n2"].got {
	}
	applied := full["n2"].msg.GetVersion()
	agents["n2"] = connectRaw(t, ctx, conn, &weirv1.Hello{NodeName: "n2", AppliedVersion: applied, AppliedHistory: reg.HistoryAt(applied)})
	resumed := agents["n2"].next("n2's resume")
	if got := len(servicesPart(resumed).msg.GetUpserts()); got != 4 || servicesPart(resumed).msg.GetFull() {
		t.Fatalf("n2 resumed with %v; want the four services since it applied %d", resumed, applied)
	}
	step("a service after a resume", func() uint64 { return create("e", 15) }, nil)
}

type refusal struct {
	err     string
	version uint64
}

// A whole state holds its place among the few sent at once until its agent
// answers it (or its stream ends, or it stays silent too long), not only
// until it is queued: a whole state fits in an agent's receive window, so
// a place given back when the send returned bounded nothing, and thousands
// of new agents were all sent theirs at once, every one finishing last.
func TestAWholeStateHoldsItsPlaceUntilItsAgentAnswers(t *testing.T) {
	reg := registrytest.Open(t)
	nodes := []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7"}
	for i, n := range nodes {
		if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: n}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)})}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "shop", Name: "a"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC))
	h := New(reg, Config{Clock: clk, FullStatesAtOnce: 2})
	ctx, conn, _ := serve(t, h)

	agents := map[string]*rawAgent{}
	streamCtx := map[string]context.CancelFunc{}
	connect := func(n string) {
		c, stop := context.WithCancel(ctx)
		agents[n], streamCtx[n] = connectRaw(t, c, conn, &weirv1.Hello{NodeName: n}), stop
	}
	whole := func(n string) uint64 {
		t.Helper()
		parts := agents[n].next(n + "'s whole state")
		if !parts[0].msg.GetFull() {
			t.Fatalf("%s was sent %v first; want its whole state", n, parts[0].msg)
		}
		return parts[0].msg.GetVersion()
	}
	// waiting says n has been sent nothing yet. Were its place free, its
	// state would come within milliseconds.
	waiting := func(n, why string) {
		t.Helper()
		select {
		case r := <-agents[n].got:
			t.Fatalf("%s was sent %v while %s", n, r.msg, why)
		case <-time.After(300 * time.Millisecond):
		}
	}
	defer func() {
		for _, stop := range streamCtx {
			stop()
		}
	}()

	connect("n1")
	connect("n2")
	v1, _ := whole("n1"), whole("n2")
	connect("n3")
	waiting("n3", "n1 and n2 had not answered theirs")

	// An acknowledgement gives the place back.
	agents["n1"].answer(ack(v1))
	v3 := whole("n3")

	// So does a stream that ends.
	connect("n4")
	waiting("n4", "n2 and n3 had not answered theirs")
	streamCtx["n2"]()
	whole("n4")

	// And a refusal: the agent answered.
	connect("n5")
	waiting("n5", "n3 and n4 had not answered theirs")
	agents["n3"].answer(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Nack{Nack: &weirv1.Nack{Version: v3, Error: "no room"}}})
	whole("n5")

	// An agent that stays silent holds its place FullStateAnswerWait at
	// most. n4 and n5 hold the two places; n1 comes back without the
	// version it applied.
	streamCtx["n1"]()
	connect("n1")
	waiting("n1", "n4 and n5 had not answered theirs")
	wait.Until(t, 10*time.Second, "the silent agents' timers are set", clk.HasWaiters)
	clk.Step(FullStateAnswerWait)
	v1 = whole("n1")

	// A whole state sent after a refusal takes a place too. n1 refuses
	// its state (giving its place back), n6 and n7 take both places, and
	// a change follows. (n3, which refused earlier, would want a place
	// for the change too: it goes.)
	streamCtx["n3"]()
	wait.Until(t, 10*time.Second, "n3's stream ends", func() bool {
		for _, st := range h.Status() {
			if st.Node == "n3" {
				return !st.Connected
			}
		}
		return true
	})
	agents["n1"].answer(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Nack{Nack: &weirv1.Nack{Version: v1, Error: "no room"}}})
	wait.Until(t, 10*time.Second, "n1's refusal is recorded", func() bool {
		for _, st := range h.Status() {
			if st.Node == "n1" && st.LastErrorVersion == v1 {
				return true
			}
		}
		return false
	})
	connect("n6")
	connect("n7")
	v6, _ := whole("n6"), whole("n7")
	if _, err := reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "shop", Name: "b"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}); err != nil {
		t.Fatal(err)
	}
	waiting("n1", "n6 and n7 had not answered theirs")
	agents["n6"].answer(ack(v6))
	whole("n1")
}

// TestAWholeStateAnsweredAtOnceFreesItsAgent: an agent may answer its
// whole state before the server, which has just queued it, looks for the
// answer (a small state, a fast agent, a server goroutine that waits for a
// CPU). The answer counts: the agent's next change goes out at once, not
// after FullStateAnswerWait. The server's stream here returns from sending
// the whole state only once the hub has read the agent's answer.
func TestAWholeStateAnsweredAtOnceFreesItsAgent(t *testing.T) {
	reg := registrytest.Open(t)
	if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n1"}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")}}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	h := New(reg, Config{MinSyncPeriod: time.Second, Clock: clk})
	ctx, conn, _ := serve(t, h, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &answeredFirst{ServerStream: ss, reads: make(chan struct{}, 16)})
	}))
	agent := connectRaw(t, ctx, conn, &weirv1.Hello{NodeName: "n1"})
	whole := agent.next("the whole state")
	if !whole[0].msg.GetFull() {
		t.Fatalf("first message: %v, want the whole state", whole[0].msg)
	}
	agent.answer(ack(whole[len(whole)-1].msg.GetVersion()))

	svc, err := reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "shop", Name: "a"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster})
	if err != nil {
		t.Fatal(err)
	}
	// A lone change goes out at once: the fake clock never moves here.
	if got := agent.next("the change after the answered whole state")[0].msg.GetVersion(); got != svc.ResourceVersion {
		t.Fatalf("the change went out at version %d, want %d", got, svc.ResourceVersion)
	}
}

// answeredFirst is a server stream whose first send returns once the hub
// has read what the agent sent after it: its third read (the hello, the
// answer, then the wait for more) has begun.
type answeredFirst struct {
	grpc.ServerStream
	reads chan struct{}
	sent  bool
}

func (s *answeredFirst) RecvMsg(m any) error {
	s.reads <- struct{}{}
	return s.ServerStream.RecvMsg(m)
}

func (s *answeredFirst) SendMsg(m any) error {
	if err := s.ServerStream.SendMsg(m); err != nil || s.sent {
		return err
	}
	s.sent = true
	for range 3 {
		select {
		case <-s.reads:
		case <-time.After(10 * time.Second):
			return nil // the test fails on what it waits for instead
		}
	}
	return nil
}
