// Package agentsync streams each node's desired state to that node's agent
// and records what every agent applied and reports. After the first full
// state an agent receives only the services that changed; a change that does
// not affect a node sends it nothing; an agent that reconnects with the
// version it applied resumes from there.
package agentsync

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/notify"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync/cache"
	"github.com/weirlb/weir/server/l2owner"
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
	// Clock is the hub's time (a fake one in tests); nil is the wall clock.
	Clock clock.Clock
	// L2 answers the nodes' L2 leases (the Leases stream); nil refuses
	// them.
	L2 *l2owner.Owners
	// FullStatesAtOnce bounds the whole states being sent at once (0:
	// FullStatesAtOnce).
	FullStatesAtOnce int
	// FullStatesPerParty bounds those of one caller with a certificate
	// (auth.Party; 0: FullStatesPerParty).
	FullStatesPerParty int
}

// Hub serves AgentService. Its jobs are in their own places: the cache of
// wire forms and what each agent was sent (package cache), the fanout
// that feeds it from the registry (fanout.go), sessions (session.go),
// agents' answers (answers.go), status and currency (current.go).
//
// Lock order: the registry's (its Read) before changesMu; mu before the
// cache's (a session connects to the cache under mu). Never take the
// registry's lock or changesMu while holding mu, nor mu under the
// registry's: the registry's listener (onChange) takes only changesMu.
// The cache calls nothing of the hub. TestTheLockOrderHolds runs every
// path that takes two of them at once, concurrently.
type Hub struct {
	weirv1.UnimplementedAgentServiceServer
	reg     *registry.Registry
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	metrics *metrics

	// The registry's listener runs under the registry's lock: it only
	// queues the change here and wakes the fanout goroutine.
	changesMu sync.Mutex
	changes   []timedChange
	wake      notify.Kick

	// The wire form of every service and node, shared by all sessions:
	// a service is encoded once per change, whatever the number of nodes.
	// Written only by the fanout goroutine.
	cache *cache.Cache

	// ring is the ring of moved connections the cache's nodes were
	// encoded with; a node that joins, leaves or readdresses changes
	// every node's place on it. Written only by the fanout goroutine.
	ring nodestate.FlowRing

	// candidates are the announcer candidates of the pools, kept while
	// the nodes, peers and pools stay. Used only by the fanout goroutine
	// (and New).
	candidates *nodestate.Candidates

	// fullSends bounds how many whole states are being sent at once
	// (FullStatesAtOnce, FullStatesPerParty).
	fullSends *places

	mu sync.Mutex // guards nodes, the records' fields, notCurrent and partial
	// nodes is what the hub knows of each node (nodes.go).
	nodes map[string]*nodeRecord
	// notCurrent says why this replica's state is not current ("" when
	// it is): agents are then sent elsewhere (see SetNotCurrent).
	notCurrent string
	// partial says why this replica holds only part of the state ("" when
	// it holds it all): no stream is served then, stale or not (see
	// SetPartial).
	partial string
	// changed is broadcast whenever a node's status changes.
	changed notify.Signal
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
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.FullStatesAtOnce <= 0 {
		cfg.FullStatesAtOnce = FullStatesAtOnce
	}
	if cfg.FullStatesPerParty <= 0 {
		cfg.FullStatesPerParty = FullStatesPerParty
	}
	h := &Hub{
		reg: reg, cfg: cfg, clock: cfg.Clock, log: cfg.Log,
		fullSends:  newPlaces(cfg.FullStatesAtOnce, cfg.FullStatesPerParty),
		nodes:      map[string]*nodeRecord{},
		candidates: &nodestate.Candidates{},
	}
	h.metrics = newMetrics(cfg.Metrics, h)
	// Listen first, then load: a change in between is queued, and
	// recomputing it again is harmless.
	reg.OnChange(h.onChange)
	reg.Read(func(v registry.View) {
		services, nodes := map[string]*weirv1.NodeService{}, map[string]*weirv1.NodeInfo{}
		for _, key := range v.ServiceKeys() {
			if svc := nodestate.Service(v, key, h.candidates); svc != nil {
				services[key] = nodewire.EncodeService(svc)
			}
		}
		h.ring = nodestate.FlowRingOf(v)
		for _, name := range v.NodeNames() {
			nodes[name] = nodewire.EncodeNode(nodestate.NodeOnRing(v, name, h.ring))
		}
		h.cache = cache.New(v.Revision(), services, nodes, cfg.RemovalLogLimit)
	})
	h.metrics.setVersion(h.cache.Version())
	return h
}
