package agentsync

// Sessions: one agent's stream, from its hello to its end, and how a
// state is sent (in parts).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync/cache"
	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry"
)

// session is one agent's stream. The cache marks what changed for its
// client; the session's own goroutine builds and sends the delta when it
// can, so a slow agent coalesces changes instead of holding anyone up.
type session struct {
	node   string
	stream weirv1.AgentService_SyncServer
	log    *slog.Logger
	client *cache.Client // what the agent has been sent, and what changed since
	// status is the node's record's status (written under h.mu).
	status *observed.Node
	// inflight is what was sent and not yet answered.
	inflight *inflight
	cancel   context.CancelFunc
	// stale: the agent takes a state from a replica that is not current.
	stale bool
	// shared: the stream is on the agents' shared certificate, which
	// never replaces a stream on the node's own.
	shared bool
	// ended is why the hub ended the session, if it did (set under h.mu).
	ended error
	done  chan struct{}
	// refused is set when the agent refuses a version: it would refuse
	// every delta after it too (the refused change is missing from what
	// it holds), so its next message is a whole state.
	refused atomic.Bool
}

// HelloTimeout bounds how long a new stream may stay silent.
const HelloTimeout = 10 * time.Second

// Sync implements AgentService.Sync: a hello admitted, the stream
// registered as its node's, a first state (resumed or whole), then deltas
// until the stream or the hub ends it.
func (h *Hub) Sync(stream weirv1.AgentService_SyncServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	hello, err := h.admit(ctx, stream)
	if err != nil {
		return err
	}
	s := &session{node: hello.GetNodeName(), stream: stream, inflight: newInflight(), cancel: cancel,
		stale: hello.GetAcceptStale(), shared: auth.SharedAgent(ctx), done: make(chan struct{}),
		log: h.log.With("node", hello.GetNodeName(), "agent", hello.GetAgentVersion())}
	prev, err := h.open(ctx, s, hello)
	if err != nil {
		return err
	}
	defer h.close(s)
	answersEnded := make(chan error, 1)
	go func() { answersEnded <- h.receiveAnswers(stream, s.status, s.inflight, &s.refused, s.log) }()
	if err := h.start(ctx, s, hello, prev); err != nil {
		return err
	}
	return h.serve(ctx, s, answersEnded)
}

// admit reads the stream's hello and checks it may be served: the caller
// speaks for a registered node. It returns once the cache holds
// everything accepted before the hello, which then goes out in the first
// message, not as a delta right after it.
func (h *Hub) admit(ctx context.Context, stream weirv1.AgentService_SyncServer) (*weirv1.Hello, error) {
	hello, err := recvHello(stream)
	if err != nil {
		return nil, err
	}
	node := hello.GetNodeName()
	if err := authorizeNode(ctx, node); err != nil {
		return nil, err
	}
	if err := h.registered("hello.node_name", node); err != nil {
		return nil, err
	}
	var revision uint64
	h.reg.Read(func(v registry.View) { revision = v.Revision() })
	if err := h.catchUp(ctx, revision); err != nil {
		return nil, err
	}
	return hello, nil
}

// open makes s its node's stream, connected to the cache, and returns
// what the node's last stream was sent (nil if none), to resume from.
func (h *Hub) open(ctx context.Context, s *session, hello *weirv1.Hello) (prev *cache.Client, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.displaceLocked(s); err != nil {
		return nil, err
	}
	rec := h.nodeLocked(s.node)
	rec.session = s
	s.client = h.cache.Connect(s.node)
	if rec.status == nil {
		rec.status = &observed.Node{Node: s.node}
	}
	st := rec.status
	s.status = st
	st.Connected, st.LastSeen = true, h.clock.Now()
	st.AgentVersion, st.CertificateNotAfter = hello.GetAgentVersion(), certificateNotAfter(ctx)
	h.statusChanged()
	prev, rec.history = rec.history, nil
	h.metrics.connected.Inc()
	return prev, nil
}

// displaceLocked refuses s, or ends the node's open stream for it and
// waits until that stream has recorded what it sent: the agent
// reconnected, and its old stream is dead or a duplicate. Called with
// h.mu held, which it lets go while it waits.
func (h *Hub) displaceLocked(s *session) error {
	if err := h.currentErrLocked(s.stale); err != nil {
		return err
	}
	rec := h.nodes[s.node]
	if rec == nil || rec.session == nil {
		return nil
	}
	old := rec.session
	if s.shared && !old.shared {
		return status.Errorf(codes.PermissionDenied, "hello.node_name: node %q has a stream open on its own certificate; the agents' shared certificate may not replace it", s.node)
	}
	old.cancel()
	h.mu.Unlock()
	<-old.done
	h.mu.Lock()
	return nil
}

// close ends s: its node is no longer connected here (unless a newer
// stream took its place), and what it was sent is kept to resume from.
func (h *Hub) close(s *session) {
	defer close(s.done)
	h.mu.Lock()
	rec := h.nodeLocked(s.node)
	if rec.session == s {
		rec.session = nil
		s.status.Connected = false
		h.statusChanged()
	}
	s.client.Close()
	rec.history = s.client
	h.metrics.connected.Dec()
	h.mu.Unlock()
	// A node deleted while its agent was connected was left to its
	// session (forgetLocked): read after the session is gone, so that a
	// deletion the hub takes meanwhile is not missed either.
	var registered bool
	h.reg.Read(func(v registry.View) { registered = v.Node(s.node) != nil })
	if !registered {
		h.mu.Lock()
		h.forgetLocked(s.node)
		h.mu.Unlock()
	}
}

// start sends the agent its first state: what changed since the version
// it applied when that version is of this store's history (after a
// restore from a copy, the same number may stand for other content),
// else its whole state. Versions are the store's revisions, the same for
// every node.
func (h *Hub) start(ctx context.Context, s *session, hello *weirv1.Hello, prev *cache.Client) error {
	v := hello.GetAppliedVersion()
	msg, resumed := (*cache.Message)(nil), false
	if hello.GetAppliedHistory() == h.reg.HistoryAt(v) {
		msg, resumed = s.client.Resume(v, prev)
	}
	start, err := "resume", error(nil)
	if resumed {
		err = h.sendStep(s, msg, "resume")
	} else {
		start, err = "full", h.sendWhole(ctx, s, time.Time{})
	}
	if err != nil {
		return err
	}
	s.log.Info("agent connected", "applied_version", v, "start", start)
	return nil
}

// serve sends the agent what changes for it, as the cache marks it, until
// the hub ends the session or the agent's answers end.
func (h *Hub) serve(ctx context.Context, s *session, answersEnded <-chan error) error {
	for {
		select {
		case <-ctx.Done():
			return h.endErr(s, ctx.Err())
		case err := <-answersEnded:
			if !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
				s.log.Info("agent disconnected", "reason", err)
			}
			return nil
		case <-s.client.Wake():
		}
		if err := h.sendNext(ctx, s); err != nil {
			return err
		}
	}
}

// sendNext sends the delta of what changed since the last message; a
// whole state instead after the agent refused a version.
func (h *Hub) sendNext(ctx context.Context, s *session) error {
	msg, since := s.client.Next()
	if msg != nil && s.refused.Swap(false) {
		return h.sendWhole(ctx, s, since)
	}
	if msg != nil && !since.IsZero() {
		s.inflight.add(msg.Version, since)
	}
	return h.sendStep(s, msg, "delta")
}

// sendStep sends msg, a delta (none when nil: the changes did not concern
// the node), and records what the node now has been sent.
func (h *Hub) sendStep(s *session, msg *cache.Message, kind string) error {
	n := 0
	if msg != nil {
		var err error
		if n, err = h.send(s.stream, msg); err != nil {
			return err
		}
	}
	h.record(s.status, msg, n, kind, s.client.Covered())
	return nil
}

// sendWhole sends the node its whole state: at its first stream, and
// after it refused a version (since is then when the oldest change it
// holds was accepted). It holds one of the FullStatesAtOnce places from
// before the state is worked out until the agent answers it, its answers
// end, or FullStateAnswerWait passes: a send ends when the state is
// queued, and a whole state fits in an agent's receive window, so without
// the wait every agent would be sent one at once, all finishing last.
func (h *Hub) sendWhole(ctx context.Context, s *session, since time.Time) error {
	// A whole state's encoding is shared by every agent sent the same
	// version, but each version in flight holds its own: a bounded number
	// at a time keeps that bounded while versions change, and lets the
	// first agents finish early.
	party := ""
	if _, ok := auth.Certified(ctx); ok {
		party = auth.Party(ctx)
	}
	release, err := h.fullSends.take(ctx, party)
	if err != nil {
		return h.endErr(s, err)
	}
	defer release()
	msg := s.client.Full()
	if !since.IsZero() {
		s.inflight.add(msg.Version, since)
	}
	// Waited for from before the send: the agent may answer before the
	// send returns.
	answered := s.inflight.answered(msg.Version)
	n, err := h.send(s.stream, msg)
	if err != nil {
		return err
	}
	h.record(s.status, msg, n, "full", s.client.Covered())
	timeout := h.clock.NewTimer(FullStateAnswerWait)
	defer timeout.Stop()
	select {
	case <-answered:
	case <-ctx.Done():
	case <-timeout.C():
	}
	return nil
}

// FullStatesAtOnce is how many whole states are sent at once, each from
// its first byte to its agent's answer. Their encodings are shared (one
// per version), so what bounds them is the versions in flight while
// changes go on: at most this many copies of the encoded state (3.8 MB at
// 10,000 services), and the agents served first finish first instead of
// every agent finishing last.
const FullStatesAtOnce = 64

// FullStatesPerParty is how many of them one caller with a certificate
// may hold (auth.Party: a node's agent, or the agents' shared certificate
// at one address): one agent needs one at a time, and a caller whose
// streams never answer cannot hold the places the other nodes need.
const FullStatesPerParty = 8

// FullStateAnswerWait is the longest an agent that does not answer its
// whole state holds its place: an agent applies 100,000 services in about
// three seconds; one that is stuck must not hold the others up for ever.
const FullStateAnswerWait = 30 * time.Second

// ChunkServices is the most services one message carries, and
// ChunkBytes about the most bytes: a bigger state goes in parts, so that no
// message nears gRPC's 4 MiB default limit (which an agent would refuse,
// and then be sent the same message again on every reconnect) and no send
// holds a huge buffer.
const (
	ChunkServices = 500
	ChunkBytes    = 1 << 20
)

// send sends msg and returns how many bytes it took: the services in
// parts encoded once for every agent making the same step (see
// encodeServices), the node's own fields (a whole state's Full, the
// node's description) in front of the first. It is one message unless a
// part says More, as an agent has always been sent.
func (h *Hub) send(stream weirv1.AgentService_SyncServer, msg *cache.Message) (int, error) {
	history := h.reg.HistoryAt(msg.Version)
	own := msg.Full || msg.Node != nil
	if msg.Services == nil {
		head := &weirv1.SyncResponse{Version: msg.Version, History: history, Full: msg.Full, Node: msg.Node}
		return proto.Size(head), stream.Send(head)
	}
	enc, err := msg.Services.Encoded(func(s *cache.Services) (any, error) { return h.encodeServices(stream, s, history), nil })
	if err != nil {
		return 0, err
	}
	parts := enc.(*encodedParts)
	bytes := 0
	for i, p := range parts.prepared {
		if i == 0 && own {
			// The node's fields, then the first part's bytes as they
			// are: a protobuf message is the merge of its concatenated
			// parts, so the agent reads one message with both, and the
			// shared part is copied, not encoded again.
			first := &weirv1.SyncResponse{Full: msg.Full, Node: msg.Node}
			first.ProtoReflect().SetUnknown(parts.first)
			p = first
			bytes += proto.Size(first) - len(parts.first)
		}
		if err := stream.SendMsg(p); err != nil {
			return bytes, err
		}
		bytes += parts.sizes[i]
	}
	return bytes, nil
}

// encodedParts are a step's services as sent: each part ready to send, a
// *grpc.PreparedMsg (or, where it could not be prepared, a message
// carrying its encoding), its size, and the first part's encoding, for
// agents whose own fields go in front of it.
type encodedParts struct {
	prepared []any
	sizes    []int
	first    []byte
}

// encodeServices cuts the services into parts (splitParts) and encodes
// each once, with stream's codec, for every stream: all of this server's
// streams share the proto codec and none compresses, so a prepared message
// is the same bytes on any of them. Across replicas nothing is shared:
// each replica serves its own agents from its own cache (fed by the same
// store, so at the same versions), and encodes each step once for them.
func (h *Hub) encodeServices(stream weirv1.AgentService_SyncServer, s *cache.Services, history string) *encodedParts {
	out := &encodedParts{}
	for _, part := range splitParts(&weirv1.SyncResponse{Version: s.Version, History: history, Upserts: s.Upserts, Removals: s.Removals}) {
		raw, err := proto.Marshal(part)
		if err != nil {
			panic(fmt.Sprintf("encoding a state: %v", err)) // the hub's own messages: a bug
		}
		h.metrics.encoded.Add(float64(len(raw)))
		// Its encoding as the unknown fields of an empty message: what
		// the codec writes is that encoding, copied.
		carrier := &weirv1.SyncResponse{}
		carrier.ProtoReflect().SetUnknown(raw)
		prepared := &grpc.PreparedMsg{}
		if out.first == nil {
			out.first = raw
		}
		out.sizes = append(out.sizes, len(raw))
		if err := prepared.Encode(stream, carrier); err != nil {
			// Not a stream of a grpc.Server (a test's): each stream
			// copies the encoding itself.
			out.prepared = append(out.prepared, carrier)
			continue
		}
		out.prepared = append(out.prepared, prepared)
	}
	return out
}

// splitParts cuts msg into parts of at most ChunkServices services and
// about ChunkBytes; every part but the last says More. A service bigger
// than ChunkBytes goes in several parts, each with every port and some of
// the endpoints: the agent joins them. Only the first part keeps msg's
// Full and Node; the removals go in the last.
func splitParts(msg *weirv1.SyncResponse) []*weirv1.SyncResponse {
	part := &weirv1.SyncResponse{Version: msg.Version, History: msg.History, Full: msg.Full, Node: msg.Node}
	size := proto.Size(part)
	var parts []*weirv1.SyncResponse
	for _, svc := range msg.Upserts {
		for _, piece := range splitService(svc, ChunkBytes) {
			n := proto.Size(piece)
			if len(part.Upserts) > 0 && (len(part.Upserts) == ChunkServices || size+n > ChunkBytes) {
				part.More = true
				parts = append(parts, part)
				part = &weirv1.SyncResponse{Version: msg.Version, History: msg.History}
				size = 0
			}
			part.Upserts = append(part.Upserts, piece)
			size += n
		}
	}
	part.Removals = msg.Removals
	return append(parts, part)
}

// splitService cuts a service whose wire form is bigger than limit into
// pieces of about limit bytes: each has the service's fields and every
// port, with a share of each port's endpoints. Small services are returned
// whole, shared.
func splitService(svc *weirv1.NodeService, limit int) []*weirv1.NodeService {
	size := proto.Size(svc)
	if size <= limit {
		return []*weirv1.NodeService{svc}
	}
	endpoints := 0
	for _, p := range svc.GetPorts() {
		endpoints += len(p.GetEndpoints())
	}
	perPiece := max(1, endpoints*limit/size)
	var pieces []*weirv1.NodeService
	next := func() *weirv1.NodeService {
		// Every field but the ports' endpoints, shared: nothing changes
		// a cached service.
		piece := without(svc, "ports")
		for _, p := range svc.GetPorts() {
			piece.Ports = append(piece.Ports, without(p, "endpoints"))
		}
		pieces = append(pieces, piece)
		return piece
	}
	piece, n := next(), 0
	for i, p := range svc.GetPorts() {
		for _, ep := range p.GetEndpoints() {
			if n == perPiece {
				piece, n = next(), 0
			}
			piece.Ports[i].Endpoints = append(piece.Ports[i].Endpoints, ep)
			n++
		}
	}
	return pieces
}

// without is a shallow copy of msg without one field.
func without[M proto.Message](msg M, field protoreflect.Name) M {
	src := msg.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != field {
			dst.Set(fd, v)
		}
		return true
	})
	return dst.Interface().(M)
}

// record records what the node of st was sent: msg (n bytes) unless it
// is nil, and that everything up to the cache version covered that
// concerns it is in what it was sent. One acquisition of the hub's lock
// per message: with thousands of agents every one counts.
func (h *Hub) record(st *observed.Node, msg *cache.Message, n int, kind string, covered uint64) {
	if msg != nil {
		h.metrics.messages.WithLabelValues(kind).Inc()
		h.metrics.bytes.Add(float64(n))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	changed := false
	if msg != nil {
		st.SentVersion, changed = msg.Version, true
	}
	if covered > st.Covered {
		st.Covered, changed = covered, true
	}
	if changed {
		h.statusChanged()
	}
}

func recvHello(stream weirv1.AgentService_SyncServer) (*weirv1.Hello, error) {
	type result struct {
		req *weirv1.SyncRequest
		err error
	}
	ch := make(chan result, 1)
	go func() {
		req, err := stream.Recv()
		ch <- result{req, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		hello := r.req.GetHello()
		if hello == nil {
			return nil, status.Error(codes.InvalidArgument, "hello: the first message must be a hello")
		}
		if hello.GetNodeName() == "" || strings.ContainsAny(hello.GetNodeName(), "/ ") {
			return nil, status.Error(codes.InvalidArgument, "hello.node_name: a node name is required")
		}
		return hello, nil
	case <-time.After(HelloTimeout):
		return nil, status.Error(codes.DeadlineExceeded, "no hello received")
	}
}

// endErr is what a session ends with when its context is done: the
// hub's reason if it ended it.
func (h *Hub) endErr(s *session, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.ended != nil {
		return s.ended
	}
	return err
}

// certificateNotAfter is when the client certificate of ctx's connection
// expires; zero in plain text.
func certificateNotAfter(ctx context.Context) time.Time {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
			return info.State.PeerCertificates[0].NotAfter
		}
	}
	return time.Time{}
}
