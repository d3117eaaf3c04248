// Package agentsync streams each node's desired state to that node's agent
// and records what every agent applied. After the first full state an agent
// receives only the services that changed for it; a change that does not
// affect a node sends it nothing.
package agentsync

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/registry"
)

// NodeStatus is what the server knows of one node's agent.
type NodeStatus struct {
	Node           string
	Connected      bool
	SentVersion    uint64
	AppliedVersion uint64
	// LastError is the agent's last NACK, cleared by the next ACK.
	LastError        string
	LastErrorVersion uint64
	LastSeen         time.Time
	// Health is what the node last reported of its health answers.
	Health   NodeHealth
	LastSync time.Duration
	// Services is, per "namespace/name", what the node sees of a service.
	Services map[string]ServiceHealth
}

// NodeHealth is a node's own health answers (port 10256).
type NodeHealth struct {
	HealthzCode, LivezCode int
	LastUpdated            time.Time
	NodeEligible           bool
}

// ServiceHealth is one service on one node.
type ServiceHealth struct {
	LocalReady, LocalServing, LocalTerminating int
	HealthCheckNodePort                        int
	// HealthCheckCode is what the health-check port answers; 0 when it is
	// not open, and then HealthCheckError says why.
	HealthCheckCode  int
	HealthCheckError string
}

// Hub serves AgentService.
type Hub struct {
	weirv1.UnimplementedAgentServiceServer
	reg *registry.Registry
	log *slog.Logger

	mu       sync.Mutex // guards sessions and status
	sessions map[string]*session
	status   map[string]*NodeStatus
}

// New returns a hub fed by reg's changes.
func New(reg *registry.Registry, log *slog.Logger) *Hub {
	h := &Hub{reg: reg, log: log, sessions: map[string]*session{}, status: map[string]*NodeStatus{}}
	reg.OnChange(h.onChange)
	return h
}

// Status returns every node's status, sorted by node name.
func (h *Hub) Status() []NodeStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]NodeStatus, 0, len(h.status))
	for _, s := range h.status {
		c := *s
		c.Services = maps.Clone(s.Services)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int {
		if a.Node < b.Node {
			return -1
		}
		if a.Node > b.Node {
			return 1
		}
		return 0
	})
	return out
}

// session is one agent's stream. The registry marks what changed; the
// session's own goroutine computes and sends the delta when it can, so a
// slow agent coalesces changes instead of holding anyone up.
type session struct {
	node   string
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1

	mu        sync.Mutex // guards the pending changes
	services  map[string]bool
	nodeDirty bool
}

func (s *session) mark(services []string, nodeDirty bool) {
	s.mu.Lock()
	for _, k := range services {
		s.services[k] = true
	}
	s.nodeDirty = s.nodeDirty || nodeDirty
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *session) takePending() (services []string, nodeDirty bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	services = slices.Collect(maps.Keys(s.services))
	clear(s.services)
	nodeDirty, s.nodeDirty = s.nodeDirty, false
	return services, nodeDirty
}

// onChange runs under the registry's lock: it only marks sessions.
func (h *Hub) onChange(ch registry.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sessions {
		s.mark(ch.Services, slices.Contains(ch.Nodes, s.node))
	}
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
	s := &session{node: node, cancel: cancel, wake: make(chan struct{}, 1), services: map[string]bool{}}
	log := h.log.With("node", node, "agent", hello.GetAgentVersion())

	h.mu.Lock()
	if old := h.sessions[node]; old != nil {
		old.cancel() // the agent reconnected; its old stream is dead or a duplicate
	}
	h.sessions[node] = s
	st := h.status[node]
	if st == nil {
		st = &NodeStatus{Node: node}
		h.status[node] = st
	}
	st.Connected, st.LastSeen = true, time.Now()
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.sessions[node] == s {
			delete(h.sessions, node)
			st.Connected = false
		}
		h.mu.Unlock()
	}()
	log.Info("agent connected", "applied_version", hello.GetAppliedVersion())

	recvErr := make(chan error, 1)
	go func() { recvErr <- h.receiveAnswers(stream, st, log) }()

	sent := map[string]*datapath.Service{}
	var sentNode *datapath.NodeInfo
	full := true
	for {
		var msg *weirv1.SyncResponse
		if full {
			msg = h.fullState(node, sent, &sentNode)
			full = false
		} else {
			services, nodeDirty := s.takePending()
			msg = h.delta(node, services, nodeDirty, sent, &sentNode)
		}
		if msg != nil {
			if err := stream.Send(msg); err != nil {
				return err
			}
			h.mu.Lock()
			st.SentVersion = msg.Version
			h.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, context.Canceled) {
				return nil
			}
			log.Info("agent disconnected", "reason", err)
			return nil
		case <-s.wake:
		}
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
		if hello.GetNodeName() == "" {
			return nil, status.Error(codes.InvalidArgument, "hello.node_name: required")
		}
		return hello, nil
	case <-time.After(HelloTimeout):
		return nil, status.Error(codes.DeadlineExceeded, "no hello received")
	}
}

func (h *Hub) receiveAnswers(stream weirv1.AgentService_SyncServer, st *NodeStatus, log *slog.Logger) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		h.mu.Lock()
		st.LastSeen = time.Now()
		switch m := req.Message.(type) {
		case *weirv1.SyncRequest_Ack:
			st.AppliedVersion = m.Ack.GetVersion()
			st.LastError, st.LastErrorVersion = "", 0
		case *weirv1.SyncRequest_Nack:
			// Recorded, never resent: the same state would fail the same way.
			st.LastError, st.LastErrorVersion = m.Nack.GetError(), m.Nack.GetVersion()
			log.Warn("agent rejected state", "version", m.Nack.GetVersion(), "error", m.Nack.GetError())
		case *weirv1.SyncRequest_Report:
			recordReport(st, m.Report)
		}
		h.mu.Unlock()
	}
}

// fullState computes everything node forwards and records it as sent.
func (h *Hub) fullState(node string, sent map[string]*datapath.Service, sentNode **datapath.NodeInfo) *weirv1.SyncResponse {
	msg := &weirv1.SyncResponse{Full: true}
	clear(sent)
	h.reg.Read(func(v registry.View) {
		msg.Version = v.Revision()
		n := nodestate.Node(v, node)
		*sentNode = &n
		msg.Node = nodewire.EncodeNode(n)
		keys := v.ServiceKeys()
		slices.Sort(keys)
		for _, k := range keys {
			if svc := nodestate.Service(v, k, node); svc != nil {
				sent[k] = svc
				msg.Upserts = append(msg.Upserts, nodewire.EncodeService(svc))
			}
		}
	})
	return msg
}

// delta computes what changed for node among the given services, or nil
// when nothing did.
func (h *Hub) delta(node string, services []string, nodeDirty bool, sent map[string]*datapath.Service, sentNode **datapath.NodeInfo) *weirv1.SyncResponse {
	msg := &weirv1.SyncResponse{}
	slices.Sort(services)
	h.reg.Read(func(v registry.View) {
		msg.Version = v.Revision()
		if nodeDirty {
			if n := nodestate.Node(v, node); !reflect.DeepEqual(&n, *sentNode) {
				*sentNode = &n
				msg.Node = nodewire.EncodeNode(n)
			}
		}
		for _, k := range services {
			svc := nodestate.Service(v, k, node)
			old, had := sent[k]
			switch {
			case svc == nil && had:
				delete(sent, k)
				msg.Removals = append(msg.Removals, k)
			case svc != nil && !reflect.DeepEqual(svc, old):
				sent[k] = svc
				msg.Upserts = append(msg.Upserts, nodewire.EncodeService(svc))
			}
		}
	})
	if msg.Node == nil && len(msg.Upserts) == 0 && len(msg.Removals) == 0 {
		return nil
	}
	return msg
}

// recordReport folds an agent's report into its status. Called with h.mu held.
func recordReport(st *NodeStatus, r *weirv1.Report) {
	if nh := r.GetNodeHealth(); nh != nil {
		st.Health = NodeHealth{
			HealthzCode: int(nh.GetHealthzCode()), LivezCode: int(nh.GetLivezCode()),
			NodeEligible: nh.GetNodeEligible(),
		}
		if nh.GetLastUpdated() != nil {
			st.Health.LastUpdated = nh.GetLastUpdated().AsTime()
		}
	}
	st.LastSync = r.GetLastSyncDuration().AsDuration()
	if r.GetFull() || st.Services == nil {
		st.Services = map[string]ServiceHealth{}
	}
	for _, s := range r.GetServices() {
		st.Services[s.GetNamespace()+"/"+s.GetName()] = ServiceHealth{
			LocalReady: int(s.GetLocalReady()), LocalServing: int(s.GetLocalServing()), LocalTerminating: int(s.GetLocalTerminating()),
			HealthCheckNodePort: int(s.GetHealthCheckNodePort()), HealthCheckCode: int(s.GetHealthCheckCode()), HealthCheckError: s.GetHealthCheckError(),
		}
	}
	for _, key := range r.GetRemovedServices() {
		delete(st.Services, key)
	}
}
