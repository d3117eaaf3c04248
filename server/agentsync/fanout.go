package agentsync

// The fanout: the registry's changes, queued under its lock, become
// batches of wire forms for the cache, at most once per MinSyncPeriod.

import (
	"context"
	"time"

	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync/cache"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/registry"
)

type timedChange struct {
	registry.Change
	at time.Time
}

// DefaultRemovalLogLimit is Config.RemovalLogLimit's default.
const DefaultRemovalLogLimit = 100000

// onChange runs under the registry's lock: it only queues.
func (h *Hub) onChange(ch registry.Change) {
	h.changesMu.Lock()
	h.changes = append(h.changes, timedChange{ch, h.clock.Now()})
	h.changesMu.Unlock()
	h.wake.Kick()
}

// Run turns queued changes into new cache entries and tells the sessions,
// at most once per MinSyncPeriod, until ctx ends.
func (h *Hub) Run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake.C():
		}
		if wait := h.cfg.MinSyncPeriod - h.clock.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-h.clock.After(wait):
			}
		}
		last = h.clock.Now()
		h.apply()
	}
}

// apply recomputes what the queued changes touched and hands it to the
// cache as one batch, which marks what every client has to be sent.
func (h *Hub) apply() {
	var batch cache.Batch
	var gone []string // nodes deleted from the registry
	h.reg.Read(func(v registry.View) { batch, gone = h.batchOf(v) })
	if batch.Since.IsZero() {
		return // nothing was queued
	}
	if beforeCacheUpdate != nil {
		beforeCacheUpdate()
	}
	h.cache.Apply(batch)
	if len(gone) > 0 {
		h.mu.Lock()
		for _, name := range gone {
			h.forgetLocked(name)
		}
		h.mu.Unlock()
	}
	h.metrics.setVersion(batch.Version)
}

// batchOf takes the queued changes and encodes, as of v, every service
// and node they touched (nil for those gone), with the nodes deleted
// from the registry. It runs under the registry's lock, which every
// change holds while queuing: the batch is then exactly the changes up
// to v's revision, and the cache can claim it.
func (h *Hub) batchOf(v registry.View) (batch cache.Batch, gone []string) {
	batch.Version = v.Revision()
	h.changesMu.Lock()
	queued := h.changes
	h.changes = nil
	h.changesMu.Unlock()
	if len(queued) == 0 {
		return batch, nil
	}
	batch.Since = queued[0].at
	t := touchedBy(queued)
	h.widen(v, &t)
	batch.Services = make(map[string]*weirv1.NodeService, len(t.services))
	for key := range t.services {
		batch.Services[key] = nil
		if svc := nodestate.Service(v, key, h.candidates); svc != nil {
			batch.Services[key] = nodewire.EncodeService(svc)
		}
	}
	batch.Nodes = make(map[string]*weirv1.NodeInfo, len(t.nodes))
	for name := range t.nodes {
		batch.Nodes[name] = nil
		if v.Node(name) == nil {
			gone = append(gone, name)
			continue
		}
		batch.Nodes[name] = nodewire.EncodeNode(nodestate.NodeOnRing(v, name, h.ring))
	}
	return batch, gone
}

// touched is what a batch of changes may have changed for the agents.
type touched struct {
	services, nodes map[string]bool
	// allNodes: what every node's description holds changed.
	allNodes bool
	// nodeSet: nodes, peers or pools changed, which may move who
	// announces a load-balancer IP and the ring of moved connections.
	nodeSet bool
}

// touchedBy is what the changes name.
func touchedBy(changes []timedChange) touched {
	t := touched{services: map[string]bool{}, nodes: map[string]bool{}}
	for _, c := range changes {
		t.allNodes = t.allNodes || len(c.Peers) > 0 || len(c.Pools) > 0 || len(c.ServiceCIDRs) > 0
		t.nodeSet = t.nodeSet || len(c.Nodes) > 0 || len(c.Peers) > 0 || len(c.Pools) > 0
		for _, k := range c.Services {
			t.services[k] = true
		}
		for _, n := range c.Nodes {
			t.nodes[n] = true
		}
	}
	return t
}

// widen adds to t what its changes touch through others, as of v, and
// keeps the ring up to date.
func (h *Hub) widen(v registry.View, t *touched) {
	if t.nodeSet && nodestate.LimitsAnnouncers(v) {
		// Which nodes announce a load-balancer IP depends on the nodes,
		// peers and pools: every such service is worked out again, and
		// only those whose announcers moved are sent.
		for _, key := range v.LoadBalancerServiceKeys() {
			t.services[key] = true
		}
	}
	if t.nodeSet {
		// The ring of moved connections is every node's: when it
		// changes, so does every node's place on it.
		if ring := nodestate.FlowRingOf(v); !ring.Equal(h.ring) {
			h.ring, t.allNodes = ring, true
		}
	}
	if t.allNodes {
		// A peer's node selector may pick any node; a pool's
		// advertisement and the service CIDRs concern every node.
		for _, name := range v.NodeNames() {
			t.nodes[name] = true
		}
	}
}

// beforeCacheUpdate, when set by a test, runs just before a batch reaches
// the cache.
var beforeCacheUpdate func()

// catchUp waits until the cache reflects the registry's revision rev.
func (h *Hub) catchUp(ctx context.Context, rev uint64) error {
	return h.cache.WaitFor(ctx, rev)
}

// Version is the newest state version the hub has seen.
func (h *Hub) Version() uint64 {
	return h.cache.Version()
}
