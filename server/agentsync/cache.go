package agentsync

// The cache: every service and node in its wire form, the version it
// reflects, and the removals a delta may still need; the fanout that keeps
// it, and what a session builds from it (a whole state, a resume, a delta).

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/registry"
)

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
	h.advanced.Broadcast()
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

// catchUp waits until the cache reflects the registry's revision rev.
func (h *Hub) catchUp(ctx context.Context, rev uint64) error {
	return h.advanced.Wait(ctx, func() bool {
		h.cacheMu.RLock()
		defer h.cacheMu.RUnlock()
		return h.version >= rev
	})
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

// Version is the newest state version the hub has seen.
func (h *Hub) Version() uint64 {
	h.cacheMu.RLock()
	defer h.cacheMu.RUnlock()
	return h.version
}
