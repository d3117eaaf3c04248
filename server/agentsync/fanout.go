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
		if nodeSet {
			// The ring of moved connections is every node's: when it
			// changes, so does every node's place on it.
			if ring := nodestate.FlowRingOf(v); !ring.Equal(h.ring) {
				h.ring, allNodes = ring, true
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
			if svc := nodestate.Service(v, key, h.candidates); svc != nil {
				newServices[key] = nodewire.EncodeService(svc)
			}
		}
		for name := range nodes {
			if v.Node(name) == nil {
				gone = append(gone, name)
				continue
			}
			newNodes[name] = nodewire.EncodeNode(nodestate.NodeOnRing(v, name, h.ring))
		}
	})
	if since.IsZero() {
		return // nothing was queued
	}
	if beforeCacheUpdate != nil {
		beforeCacheUpdate()
	}
	batch := cache.Batch{Version: version, Services: make(map[string]*weirv1.NodeService, len(services)),
		Nodes: make(map[string]*weirv1.NodeInfo, len(nodes)), Since: since}
	for key := range services {
		batch.Services[key] = newServices[key]
	}
	for name := range nodes {
		batch.Nodes[name] = newNodes[name]
	}
	h.cache.Apply(batch)
	if len(gone) > 0 {
		h.mu.Lock()
		for _, name := range gone {
			h.forgetLocked(name)
		}
		h.mu.Unlock()
	}
	h.metrics.setVersion(version)
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
