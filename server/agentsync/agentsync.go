// Package agentsync streams each node's desired state to that node's agent
// and records what every agent applied and reports. After the first full
// state an agent receives only the services that changed; a change that does
// not affect a node sends it nothing; an agent that reconnects with the
// version it applied resumes from there.
package agentsync

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirlb/weir/internal/apierr"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/weirlb/weir/internal/bounded"
	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/registry"
)

// Config tunes the hub.
type Config struct {
	// MinSyncPeriod is the least time between two rounds of deltas, like
	// kube-proxy's minSyncPeriod: a burst of changes goes out together,
	// while a lone change goes out at once.
	MinSyncPeriod time.Duration
	// Metrics receives the hub's metrics when not nil.
	Metrics prometheus.Registerer
	Log     *slog.Logger
	// RemovalLogLimit is how many deleted services the hub remembers for
	// agents that resume later (0: DefaultRemovalLogLimit). Past it, the
	// removals every connected agent has been sent are forgotten, and an
	// agent resuming from before them gets a whole state.
	RemovalLogLimit int
}

// Hub serves AgentService.
type Hub struct {
	weirv1.UnimplementedAgentServiceServer
	reg     *registry.Registry
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	// The registry's listener runs under the registry's lock: it only
	// queues the change here and wakes the fanout goroutine.
	changesMu sync.Mutex
	changes   []timedChange
	wake      chan struct{}

	// The wire form of every service and node, shared by all sessions:
	// a service is encoded once per change, whatever the number of nodes.
	// Written only by the fanout goroutine.
	cacheMu  sync.RWMutex
	version  uint64        // registry revision the cache reflects
	advanced chan struct{} // closed, and replaced, when version moves on
	services map[string]cached
	nodes    map[string]*weirv1.NodeInfo
	// removed remembers when services went, so that a session knows what
	// to remove; horizon is the oldest version a delta can start from.
	// A removal is forgotten only once every connected session has been
	// sent a version past it (trimRemoved).
	removed map[string]uint64
	horizon uint64

	// fullSends bounds how many whole states are being sent at once: each
	// holds the whole encoded state in memory until the agent has read it.
	fullSends chan struct{}

	mu       sync.Mutex // guards sessions, status, remote, notCurrent, history and changed
	sessions map[string]*session
	status   map[string]*NodeStatus
	// remote is the status of nodes connected to other replicas.
	remote map[string]*NodeStatus
	// notCurrent says why this replica's state is not current ("" when
	// it is): agents are then sent elsewhere (see SetNotCurrent).
	notCurrent string
	history    map[string]*sentState // what each node was last sent, to resume
	// changed is closed, and replaced, whenever a node's status changes.
	changed chan struct{}
}

type timedChange struct {
	registry.Change
	at time.Time
}

// cached is a service's wire form and the version that last changed it.
type cached struct {
	msg      *weirv1.NodeService
	modified uint64
}

// DefaultRemovalLogLimit is Config.RemovalLogLimit's default.
const DefaultRemovalLogLimit = 100000

// sentState is what one node has been sent: everything the cache held at
// version, and the node description node. Only the session's goroutine
// writes it; version is atomic because trimRemoved reads it.
type sentState struct {
	version atomic.Uint64
	node    *weirv1.NodeInfo
	// covered is the cache version the last full state or delta was
	// worked out at: every change up to it that concerns the node was in
	// what was sent (or concerned it not at all).
	covered uint64
}

// New returns a hub fed by reg's changes; Run must be running for agents to
// hear about changes.
func New(reg *registry.Registry, cfg Config) *Hub {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RemovalLogLimit <= 0 {
		cfg.RemovalLogLimit = DefaultRemovalLogLimit
	}
	h := &Hub{
		reg: reg, cfg: cfg, log: cfg.Log, metrics: newMetrics(cfg.Metrics),
		wake:      make(chan struct{}, 1),
		advanced:  make(chan struct{}),
		services:  map[string]cached{},
		nodes:     map[string]*weirv1.NodeInfo{},
		removed:   map[string]uint64{},
		fullSends: make(chan struct{}, 4),
		sessions:  map[string]*session{},
		status:    map[string]*NodeStatus{},
		remote:    map[string]*NodeStatus{},
		history:   map[string]*sentState{},
		changed:   make(chan struct{}),
	}
	// Listen first, then load: a change in between is queued, and
	// recomputing it again is harmless.
	reg.OnChange(h.onChange)
	reg.Read(func(v registry.View) {
		// Removals before now are not known: deltas start from here.
		h.version, h.horizon = v.Revision(), v.Revision()
		for _, key := range v.ServiceKeys() {
			if svc := nodestate.Service(v, key); svc != nil {
				h.services[key] = cached{nodewire.EncodeService(svc), h.version}
			}
		}
		for _, name := range v.NodeNames() {
			h.nodes[name] = nodewire.EncodeNode(nodestate.Node(v, name))
		}
	})
	h.metrics.version.Set(float64(h.version))
	return h
}

// onChange runs under the registry's lock: it only queues.
func (h *Hub) onChange(ch registry.Change) {
	h.changesMu.Lock()
	h.changes = append(h.changes, timedChange{ch, time.Now()})
	h.changesMu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Run turns queued changes into new cache entries and tells the sessions,
// at most once per MinSyncPeriod, until ctx ends.
func (h *Hub) Run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		}
		if wait := h.cfg.MinSyncPeriod - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		h.apply()
	}
}

// apply recomputes what the queued changes touched and marks the sessions.
func (h *Hub) apply() {
	services, nodes := map[string]bool{}, map[string]bool{}
	newServices := map[string]*weirv1.NodeService{}
	newNodes := map[string]*weirv1.NodeInfo{}
	var gone []string // nodes deleted from the registry
	var version uint64
	var since time.Time
	h.reg.Read(func(v registry.View) {
		// The queue is taken under the registry's lock, which every
		// change holds while queuing: the batch is then exactly the
		// changes up to this revision, and the cache can claim it.
		version = v.Revision()
		h.changesMu.Lock()
		batch := h.changes
		h.changes = nil
		h.changesMu.Unlock()
		if len(batch) == 0 {
			return
		}
		since = batch[0].at
		allNodes, nodeSet := false, false
		for _, c := range batch {
			allNodes = allNodes || len(c.Peers) > 0 || len(c.Pools) > 0 || len(c.ServiceCIDRs) > 0
			nodeSet = nodeSet || len(c.Nodes) > 0 || len(c.Peers) > 0 || len(c.Pools) > 0
			for _, k := range c.Services {
				services[k] = true
			}
			for _, n := range c.Nodes {
				nodes[n] = true
			}
		}
		if nodeSet && nodestate.LimitsAnnouncers(v) {
			// Which nodes announce a load-balancer IP depends on the
			// nodes, peers and pools: every such service is worked out
			// again, and only those whose announcers moved are sent.
			for _, key := range v.LoadBalancerServiceKeys() {
				services[key] = true
			}
		}
		if allNodes {
			// A peer's node selector may pick any node; a pool's
			// advertisement and the service CIDRs concern every node.
			for _, name := range v.NodeNames() {
				nodes[name] = true
			}
		}
		for key := range services {
			if svc := nodestate.Service(v, key); svc != nil {
				newServices[key] = nodewire.EncodeService(svc)
			}
		}
		for name := range nodes {
			if v.Node(name) == nil {
				gone = append(gone, name)
				continue
			}
			newNodes[name] = nodewire.EncodeNode(nodestate.Node(v, name))
		}
	})
	if since.IsZero() {
		return // nothing was queued
	}
	if beforeCacheUpdate != nil {
		beforeCacheUpdate()
	}
	h.cacheMu.Lock()
	// The floor of what the removal log may forget is read under the
	// cache's lock, which a session holds to be sent anything: every
	// session registered by now has its version here, below this batch's
	// removals (which are all kept), and one registered later is sent
	// this batch's state or a later one.
	floor := h.oldestSent()
	h.version = version
	close(h.advanced)
	h.advanced = make(chan struct{})
	for key := range services {
		msg := newServices[key]
		old, had := h.services[key]
		switch {
		case msg == nil && had:
			delete(h.services, key)
			h.removed[key] = version
		case msg == nil:
		case had && proto.Equal(old.msg, msg):
			// Unchanged for the agents (a label, say): nothing to send.
		default:
			h.services[key] = cached{msg, version}
			delete(h.removed, key)
		}
	}
	if len(h.removed) > h.cfg.RemovalLogLimit {
		h.trimRemoved(floor)
	}
	for name := range nodes {
		if ni := newNodes[name]; ni != nil {
			h.nodes[name] = ni
		} else {
			delete(h.nodes, name)
		}
	}
	// The sessions are marked before the cache's lock is released: a
	// session that takes its marks under that lock knows its delta covers
	// exactly the batches up to the cache's version.
	keys := slices.Collect(maps.Keys(services))
	h.mu.Lock()
	for _, s := range h.sessions {
		s.mark(keys, nodes[s.node], since)
	}
	for _, name := range gone {
		h.forgetLocked(name)
	}
	h.mu.Unlock()
	h.cacheMu.Unlock()
	h.metrics.version.Set(float64(version))
}

// forgetLocked drops the status and history of a node deleted from the
// registry, unless its agent is still connected (then its session's end
// does). Called with h.mu held.
func (h *Hub) forgetLocked(node string) {
	if h.sessions[node] != nil {
		return
	}
	if _, ok := h.status[node]; ok {
		delete(h.status, node)
		h.statusChanged()
	}
	delete(h.history, node)
}

// beforeCacheUpdate, when set by a test, runs just before a batch takes
// the cache's lock.
var beforeCacheUpdate func()

// oldestSent is the lowest version any connected session has been sent; 0
// while a session has not yet been sent its first state.
func (h *Hub) oldestSent() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	floor := uint64(math.MaxUint64)
	for _, s := range h.sessions {
		floor = min(floor, s.sent.version.Load())
	}
	return floor
}

// trimRemoved forgets the removals at or below floor, which every connected
// session has been sent, and moves the horizon past them: an agent that
// resumes from before it gets a whole state. Removals a connected session
// still needs are kept, whatever the limit. Called with cacheMu held.
func (h *Hub) trimRemoved(floor uint64) {
	for key, v := range h.removed {
		if v <= floor {
			delete(h.removed, key)
			h.horizon = max(h.horizon, v)
		}
	}
}

// session is one agent's stream. The hub marks what changed; the session's
// own goroutine builds and sends the delta when it can, so a slow agent
// coalesces changes instead of holding anyone up.
type session struct {
	node   string
	sent   *sentState // what the agent has been sent
	cancel context.CancelFunc
	// stale: the agent takes a state from a replica that is not current.
	stale bool
	// ended is why the hub ended the session, if it did (set under h.mu).
	ended error
	done  chan struct{}
	wake  chan struct{} // capacity 1

	mu        sync.Mutex // guards the pending changes
	pending   map[string]bool
	nodeDirty bool
	since     time.Time // when the oldest pending change was accepted
}

func (s *session) mark(services []string, nodeDirty bool, since time.Time) {
	s.mu.Lock()
	for _, k := range services {
		s.pending[k] = true
	}
	s.nodeDirty = s.nodeDirty || nodeDirty
	if s.since.IsZero() || since.Before(s.since) {
		s.since = since
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *session) take() (services []string, nodeDirty bool, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	services = slices.Collect(maps.Keys(s.pending))
	clear(s.pending)
	nodeDirty, s.nodeDirty = s.nodeDirty, false
	since, s.since = s.since, time.Time{}
	return services, nodeDirty, since
}

// HelloTimeout bounds how long a new stream may stay silent.
const HelloTimeout = 10 * time.Second

// Sync implements AgentService.Sync.
func (h *Hub) Sync(stream weirv1.AgentService_SyncServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	hello, err := recvHello(stream)
	if err != nil {
		return err
	}
	node := hello.GetNodeName()
	if err := authorizeNode(ctx, node); err != nil {
		return err
	}
	var registered bool
	var revision uint64
	h.reg.Read(func(v registry.View) { registered, revision = v.Node(node) != nil, v.Revision() })
	if !registered {
		// Without its Node the agent would not know its addresses: it
		// retries until an orchestrator (or Kubernetes) registers it.
		return status.Errorf(codes.FailedPrecondition, "hello.node_name: node %q is not registered; create it first (RegistryService.CreateNode, or the Kubernetes Node)", node)
	}
	// Everything accepted before the hello goes out in the first message,
	// not as a delta right after it.
	if err := h.catchUp(ctx, revision); err != nil {
		return err
	}
	log := h.log.With("node", node, "agent", hello.GetAgentVersion())
	sent := &sentState{}
	s := &session{node: node, sent: sent, cancel: cancel, stale: hello.GetAcceptStale(), done: make(chan struct{}), wake: make(chan struct{}, 1), pending: map[string]bool{}}
	defer close(s.done)

	h.mu.Lock()
	if h.notCurrent != "" && !s.stale {
		err := notCurrentError(h.notCurrent)
		h.mu.Unlock()
		return err
	}
	if old := h.sessions[node]; old != nil {
		// The agent reconnected; its old stream is dead or a duplicate.
		// Wait for it to record what it sent.
		old.cancel()
		h.mu.Unlock()
		<-old.done
		h.mu.Lock()
	}
	h.sessions[node] = s
	st := h.status[node]
	if st == nil {
		st = &NodeStatus{Node: node}
		h.status[node] = st
	}
	st.Connected, st.LastSeen = true, time.Now()
	h.statusChanged()
	prev := h.history[node]
	delete(h.history, node)
	h.metrics.connected.Inc()
	h.mu.Unlock()

	defer func() {
		h.mu.Lock()
		if h.sessions[node] == s {
			delete(h.sessions, node)
			st.Connected = false
			h.statusChanged()
		}
		h.history[node] = sent
		h.metrics.connected.Dec()
		h.mu.Unlock()
		// A node deleted while its agent was connected was left to its
		// session (forgetLocked): read after the session is gone, so that
		// a deletion the hub takes meanwhile is not missed either.
		var registered bool
		h.reg.Read(func(v registry.View) { registered = v.Node(node) != nil })
		if !registered {
			h.mu.Lock()
			h.forgetLocked(node)
			h.mu.Unlock()
		}
	}()

	inflight := newInflight()
	recvErr := make(chan error, 1)
	go func() { recvErr <- h.receiveAnswers(stream, st, inflight, log) }()

	kind := "resume"
	v := hello.GetAppliedVersion()
	if prev != nil && prev.version.Load() == v {
		sent.node = prev.node
	}
	// Versions are the store's revisions, the same for every node: an
	// agent that applied v needs only what changed after v, provided its v
	// is of this store's history (after a restore from a copy, the same
	// number may stand for other content).
	msg, resumed := (*weirv1.SyncResponse)(nil), false
	if hello.GetAppliedHistory() == h.reg.HistoryAt(v) {
		msg, resumed = h.resume(node, v, sent)
	}
	if !resumed {
		kind = "full"
		// Whole states are big: a few at a time, so that hundreds of
		// agents connecting at once do not hold hundreds in memory.
		select {
		case h.fullSends <- struct{}{}:
		case <-ctx.Done():
			return h.endErr(s, ctx.Err())
		}
		msg = h.full(node, sent)
		err := h.send(stream, msg)
		<-h.fullSends
		if err != nil {
			return err
		}
		h.sent(st, msg, kind)
		msg = nil
	}
	log.Info("agent connected", "applied_version", hello.GetAppliedVersion(), "start", kind)
	for {
		if msg != nil {
			if err := h.send(stream, msg); err != nil {
				return err
			}
			h.sent(st, msg, kind)
		}
		h.cover(st, sent.covered)
		select {
		case <-ctx.Done():
			return h.endErr(s, ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil
			}
			log.Info("agent disconnected", "reason", err)
			return nil
		case <-s.wake:
		}
		h.cacheMu.RLock()
		services, nodeDirty, since := s.take()
		msg, kind = h.deltaLocked(node, services, nodeDirty, sent), "delta"
		h.cacheMu.RUnlock()
		if msg != nil && !since.IsZero() {
			inflight.add(msg.GetVersion(), since)
		}
	}
}

// ChunkServices is the most services one message carries, and
// ChunkBytes about the most bytes: a bigger state goes in parts, so that no
// message nears gRPC's 4 MiB default limit (which an agent would refuse,
// and then be sent the same message again on every reconnect) and no send
// holds a huge buffer.
const (
	ChunkServices = 500
	ChunkBytes    = 1 << 20
)

// send sends msg in parts of at most ChunkServices services and about
// ChunkBytes. A service bigger than ChunkBytes goes in several parts, each
// with every port and some of the endpoints: the agent joins them.
func (h *Hub) send(stream weirv1.AgentService_SyncServer, msg *weirv1.SyncResponse) error {
	msg.History = h.reg.HistoryAt(msg.Version)
	part := &weirv1.SyncResponse{Version: msg.Version, History: msg.History, Full: msg.Full, Node: msg.Node}
	size := proto.Size(part)
	flush := func() error {
		part.More = true
		if err := stream.Send(part); err != nil {
			return err
		}
		// Only the first part replaces the agent's state.
		part = &weirv1.SyncResponse{Version: msg.Version, History: msg.History}
		size = 0
		return nil
	}
	for _, svc := range msg.Upserts {
		for _, piece := range splitService(svc, ChunkBytes) {
			n := proto.Size(piece)
			if len(part.Upserts) > 0 && (len(part.Upserts) == ChunkServices || size+n > ChunkBytes) {
				if err := flush(); err != nil {
					return err
				}
			}
			part.Upserts = append(part.Upserts, piece)
			size += n
		}
	}
	part.Removals = msg.Removals
	return stream.Send(part)
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

// sent records a message as sent to the node of st.
func (h *Hub) sent(st *NodeStatus, msg *weirv1.SyncResponse, kind string) {
	h.metrics.messages.WithLabelValues(kind).Inc()
	h.metrics.bytes.Add(float64(proto.Size(msg)))
	h.mu.Lock()
	st.SentVersion = msg.GetVersion()
	h.statusChanged()
	h.mu.Unlock()
}

// cover records that the node has been sent everything that concerns it up
// to the cache version covered.
func (h *Hub) cover(st *NodeStatus, covered uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if covered > st.Covered {
		st.Covered = covered
		h.statusChanged()
	}
}

// statusChanged wakes the status watchers. Called with h.mu held.
func (h *Hub) statusChanged() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// StatusChanged returns a channel closed at the next status change.
func (h *Hub) StatusChanged() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// catchUp waits until the cache reflects the registry's revision rev.
func (h *Hub) catchUp(ctx context.Context, rev uint64) error {
	for {
		h.cacheMu.RLock()
		version, advanced := h.version, h.advanced
		h.cacheMu.RUnlock()
		if version >= rev {
			return nil
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// resume is what brings an agent from version v to the cache's, and true,
// or false when no delta can (v is 0, older than the horizon, or newer than
// anything the hub has seen). It checks and builds under one lock, so that
// no trim falls in between.
func (h *Hub) resume(node string, v uint64, sent *sentState) (*weirv1.SyncResponse, bool) {
	h.cacheMu.RLock()
	defer h.cacheMu.RUnlock()
	if v == 0 || v < h.horizon || v > h.version {
		return nil, false
	}
	sent.version.Store(v)
	return h.deltaLocked(node, nil, true, sent), true
}

// full is node's whole state; it records it as sent.
func (h *Hub) full(node string, sent *sentState) *weirv1.SyncResponse {
	h.cacheMu.RLock()
	defer h.cacheMu.RUnlock()
	msg := &weirv1.SyncResponse{Version: h.version, Full: true, Node: h.nodeInfo(node)}
	msg.Upserts = make([]*weirv1.NodeService, 0, len(h.services))
	for _, k := range slices.Sorted(maps.Keys(h.services)) {
		msg.Upserts = append(msg.Upserts, h.services[k].msg)
	}
	sent.version.Store(msg.Version)
	sent.node, sent.covered = msg.Node, h.version
	return msg
}

// deltaLocked is what changed for node since sent.version among keys (all
// keys when nil), or nil when nothing did; it records it as sent. Called
// with cacheMu held.
func (h *Hub) deltaLocked(node string, keys []string, nodeDirty bool, sent *sentState) *weirv1.SyncResponse {
	msg := &weirv1.SyncResponse{Version: h.version}
	sent.covered = h.version
	from := sent.version.Load()
	if nodeDirty {
		if ni := h.nodeInfo(node); !proto.Equal(ni, sent.node) {
			msg.Node, sent.node = ni, ni
		}
	}
	if keys == nil {
		// Every key: only those changed since from are sorted (a resume
		// after a short absence sorts a few, not the whole state).
		for k, c := range h.services {
			if c.modified > from {
				keys = append(keys, k)
			}
		}
		for k, v := range h.removed {
			if v > from {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if c, ok := h.services[k]; ok {
			if c.modified > from {
				msg.Upserts = append(msg.Upserts, c.msg)
			}
		} else if v, ok := h.removed[k]; ok && v > from {
			msg.Removals = append(msg.Removals, k)
		}
	}
	if msg.Node == nil && len(msg.Upserts) == 0 && len(msg.Removals) == 0 {
		return nil
	}
	sent.version.Store(msg.Version)
	return msg
}

// nodeInfo is the cached node, or an unregistered one. Called with cacheMu held.
func (h *Hub) nodeInfo(name string) *weirv1.NodeInfo {
	if ni := h.nodes[name]; ni != nil {
		return ni
	}
	return &weirv1.NodeInfo{Name: name}
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

func (h *Hub) receiveAnswers(stream weirv1.AgentService_SyncServer, st *NodeStatus, inflight *inflight, log *slog.Logger) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		if r := req.GetReport(); r != nil {
			h.boundReport(r)
		}
		h.mu.Lock()
		st.LastSeen = now
		switch m := req.Message.(type) {
		case *weirv1.SyncRequest_Ack:
			st.AppliedVersion = m.Ack.GetVersion()
			st.LastError, st.LastErrorVersion = "", 0
			var longest time.Duration
			for _, since := range inflight.settle(m.Ack.GetVersion()) {
				h.metrics.programming.Observe(now.Sub(since).Seconds())
				longest = max(longest, now.Sub(since))
			}
			if longest > 0 {
				// From the acceptance of the oldest change this answer
				// covers to this node's kernel.
				st.ProgrammingLatency = longest
			}
		case *weirv1.SyncRequest_Nack:
			// Recorded, never resent: the same state would fail the same way.
			st.LastError, st.LastErrorVersion = truncate(m.Nack.GetError()), m.Nack.GetVersion()
			inflight.settle(m.Nack.GetVersion())
			h.metrics.nacks.Inc()
			log.Warn("agent rejected state", "version", m.Nack.GetVersion(), "error", m.Nack.GetError())
		case *weirv1.SyncRequest_Report:
			recordReport(st, m.Report)
		}
		h.statusChanged()
		h.mu.Unlock()
	}
}

// inflight remembers, per version sent, when its oldest change was
// accepted, until the agent answers.
type inflight struct {
	mu    sync.Mutex
	sends []sentAt
}

type sentAt struct {
	version uint64
	since   time.Time
}

func newInflight() *inflight { return &inflight{} }

func (f *inflight) add(version uint64, since time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends = append(f.sends, sentAt{version, since})
}

// settle removes and returns the sends an answer for version covers.
func (f *inflight) settle(version uint64) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Time
	keep := f.sends[:0]
	for _, s := range f.sends {
		if s.version <= version {
			out = append(out, s.since)
		} else {
			keep = append(keep, s)
		}
	}
	f.sends = keep
	return out
}

// Version is the newest state version the hub has seen.
func (h *Hub) Version() uint64 {
	h.cacheMu.RLock()
	defer h.cacheMu.RUnlock()
	return h.version
}

// Connected counts the agents with an open stream.
func (h *Hub) Connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// Status returns every node's status, sorted by node name: as this
// replica has it, or as the replica the node is connected to published it
// (SetRemoteStatus).
func (h *Hub) Status() []NodeStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]NodeStatus, 0, len(h.status)+len(h.remote))
	for node, s := range h.status {
		if r := h.remote[node]; r != nil && !s.Connected {
			continue
		}
		out = append(out, cloneStatus(s))
	}
	for node, r := range h.remote {
		if s := h.status[node]; s == nil || !s.Connected {
			out = append(out, cloneStatus(r))
		}
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return strings.Compare(a.Node, b.Node) })
	return out
}

func cloneStatus(s *NodeStatus) NodeStatus {
	c := *s
	c.Services = maps.Clone(s.Services)
	return c
}

// LocalStatus returns the status of the nodes connected to this replica,
// for the others to see.
func (h *Hub) LocalStatus() []NodeStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []NodeStatus
	for node, s := range h.status {
		if h.sessions[node] != nil {
			out = append(out, cloneStatus(s))
		}
	}
	return out
}

// SetRemoteStatus records the status of a node connected to another
// replica; nil forgets it.
func (h *Hub) SetRemoteStatus(node string, st *NodeStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st == nil {
		delete(h.remote, node)
	} else {
		h.remote[node] = st
	}
	h.statusChanged()
}

// notCurrentError refuses or ends a stream because the replica's state is
// not current; clients then try another replica (dial.IsNotCurrent).
func notCurrentError(reason string) error { return apierr.NotCurrent(reason) }

// CurrentErr is the error a stream that did not accept a stale state
// ends with while this replica is not current, or nil.
func (h *Hub) CurrentErr(acceptStale bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.notCurrent == "" || acceptStale {
		return nil
	}
	return notCurrentError(h.notCurrent)
}

// SetNotCurrent says why this replica's state is not current (it lost the
// store), or that it is again (""). While it is not, streams of agents
// that did not ask for a stale state are ended and refused, so that they
// move to a replica that is current; the others keep being served the
// last state, as every agent keeps forwarding it.
func (h *Hub) SetNotCurrent(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notCurrent = reason
	h.statusChanged() // the LB tier's watches check CurrentErr
	if reason == "" {
		return
	}
	for _, s := range h.sessions {
		if !s.stale && s.ended == nil {
			s.ended = notCurrentError(reason)
			s.cancel()
		}
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

// What an agent's report may hold: the server keeps the last one of every
// registered node (until it is deleted), so a report can cost no more than
// the node's share of the cluster.
const (
	maxReportText     = 1024 // bytes of any error or message
	maxReportSessions = 256  // BGP sessions
	maxAnnouncements  = 65536
)

// boundReport drops what a report says of services the server does not
// have (they would be kept for nothing), and cuts its texts and lists to
// the bounds above. It runs before h.mu is taken.
func (h *Hub) boundReport(r *weirv1.Report) {
	h.cacheMu.RLock()
	kept := r.Services[:0]
	for _, s := range r.GetServices() {
		if _, ok := h.services[s.GetNamespace()+"/"+s.GetName()]; ok {
			s.HealthCheckError = truncate(s.GetHealthCheckError())
			kept = append(kept, s)
		}
	}
	h.cacheMu.RUnlock()
	r.Services = kept
	if bgp := r.GetBgp(); bgp != nil {
		if len(bgp.Sessions) > maxReportSessions {
			bgp.Sessions = bgp.Sessions[:maxReportSessions]
		}
		if len(bgp.Announcements) > maxAnnouncements {
			bgp.Announcements = bgp.Announcements[:maxAnnouncements]
		}
	}
}

func truncate(s string) string { return bounded.String(s, maxReportText) }
