// Package cache holds every node's desired state in its wire form, once
// for all agents: each service and node encoded once per change, the
// store revision the whole reflects, and the removals a delta may still
// need. Each connected agent is a Client of the cache, which knows what
// it was sent and builds its next message: a whole state, a resume from
// a version it applied, or the delta of what changed since.
//
// What a client is sent is in two parts: its node's own description, and
// the services. The services of a step from one version to another are the
// same for every node (each agent marks its own endpoints local), so the
// cache builds them once per step (Services) and every client making that
// step gets the same value, which its sender encodes once for all.
//
// One lock guards the cache, the set of clients and what each client has
// still to be sent. A removal is forgotten only once every client has been
// sent a version past it, and since clients register and take their first
// state under that lock, no client can fall between the check and the
// forgetting.
package cache

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/notify"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Cache is the wire form of every service and node.
//
// Lock order: mu before stepsMu, and mu before the advanced signal's; a
// Services' encodeMu is taken with none of the cache's locks held (its
// sender encodes after Next or Full returns), and the cache calls nothing
// outside itself under any of them. TestTheLockOrderHolds runs the paths
// that take two at once, concurrently.
type Cache struct {
	removalLimit int

	mu       sync.RWMutex
	version  uint64 // the store revision the cache reflects
	services map[string]entry
	nodes    map[string]*weirv1.NodeInfo
	// removed remembers when services went, so that a delta knows what to
	// remove; horizon is the oldest version a delta can start from.
	removed map[string]uint64
	horizon uint64
	clients map[*Client]bool

	// steps are the services of the deltas to version, by the version
	// they start from (nil when nothing changed since it), and full those
	// of the whole state: built by the first client that needs one, under
	// the read lock, and shared by the others. Apply starts them afresh.
	stepsMu sync.Mutex
	steps   map[uint64]*Services
	full    *Services

	advanced notify.Signal // when version moves on
}

// Services are the upserts and removals that bring any node from one
// version to another (From 0: the whole state). They are shared by every
// client making the same step and must not be changed.
type Services struct {
	From, Version uint64
	Upserts       []*weirv1.NodeService
	Removals      []string

	encodeMu sync.Mutex
	encoded  any
}

// Encoded is what encode makes of s, made by the first caller that
// succeeds and kept for the others: every client making this step is sent
// the same encoding. The encoding lives as long as s, which the cache drops
// at its next version.
func (s *Services) Encoded(encode func(*Services) (any, error)) (any, error) {
	s.encodeMu.Lock()
	defer s.encodeMu.Unlock()
	if s.encoded == nil {
		e, err := encode(s)
		if err != nil {
			return nil, err
		}
		s.encoded = e
	}
	return s.encoded, nil
}

// Message is what one client is sent next: its node's description when
// it is a whole state or the node changed, and the services, shared.
type Message struct {
	Version uint64
	Full    bool
	Node    *weirv1.NodeInfo // nil: unchanged
	// Services is nil when no service changed for the step.
	Services *Services
}

// The getters read a message that may be nil, as the generated ones do.
func (m *Message) GetVersion() uint64 {
	if m == nil {
		return 0
	}
	return m.Version
}

func (m *Message) GetFull() bool { return m != nil && m.Full }

func (m *Message) GetNode() *weirv1.NodeInfo {
	if m == nil {
		return nil
	}
	return m.Node
}

func (m *Message) GetUpserts() []*weirv1.NodeService {
	if m == nil || m.Services == nil {
		return nil
	}
	return m.Services.Upserts
}

func (m *Message) GetRemovals() []string {
	if m == nil || m.Services == nil {
		return nil
	}
	return m.Services.Removals
}

// entry is a service's wire form and the version that last changed it.
type entry struct {
	msg      *weirv1.NodeService
	modified uint64
}

// New is a cache at version holding services and nodes (by key and by
// name). Removals before version are not known: deltas start from it.
// Past removalLimit removals, those every client has been sent are
// forgotten.
func New(version uint64, services map[string]*weirv1.NodeService, nodes map[string]*weirv1.NodeInfo, removalLimit int) *Cache {
	c := &Cache{removalLimit: removalLimit, version: version, horizon: version,
		services: make(map[string]entry, len(services)), nodes: maps.Clone(nodes),
		removed: map[string]uint64{}, clients: map[*Client]bool{}}
	if c.nodes == nil {
		c.nodes = map[string]*weirv1.NodeInfo{}
	}
	for key, msg := range services {
		c.services[key] = entry{msg, version}
	}
	return c
}

// Batch is what changed up to a store revision.
type Batch struct {
	Version uint64
	// Services and Nodes are the changed ones by key and by name, nil for
	// those that are gone.
	Services map[string]*weirv1.NodeService
	Nodes    map[string]*weirv1.NodeInfo
	// Since is when the oldest change of the batch was accepted.
	Since time.Time
}

// Apply moves the cache to the batch's version and marks, for every
// client, what it has to be sent.
func (c *Cache) Apply(b Batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version = b.Version
	c.steps, c.full = nil, nil
	changed := make([]string, 0, len(b.Services))
	for key, msg := range b.Services {
		old, had := c.services[key]
		switch {
		case msg == nil && had:
			delete(c.services, key)
			c.removed[key] = b.Version
		case msg == nil:
			continue
		case had && proto.Equal(old.msg, msg):
			// Unchanged for the agents (a label, say): nothing to send.
			continue
		default:
			c.services[key] = entry{msg, b.Version}
			delete(c.removed, key)
		}
		changed = append(changed, key)
	}
	if len(c.removed) > c.removalLimit {
		c.trimRemoved()
	}
	for name, ni := range b.Nodes {
		if ni != nil {
			c.nodes[name] = ni
		} else {
			delete(c.nodes, name)
		}
	}
	for cl := range c.clients {
		_, nodeChanged := b.Nodes[cl.node]
		cl.mark(changed, nodeChanged, b.Since)
	}
	c.advanced.Broadcast()
}

// trimRemoved forgets the removals every client has been sent, and moves
// the horizon past them: an agent that resumes from before it gets a
// whole state. Removals a client still needs are kept, whatever the
// limit. Called with mu held.
func (c *Cache) trimRemoved() {
	floor := uint64(math.MaxUint64)
	for cl := range c.clients {
		floor = min(floor, cl.sent.Load())
	}
	for key, v := range c.removed {
		if v <= floor {
			delete(c.removed, key)
			c.horizon = max(c.horizon, v)
		}
	}
}

// Version is the store revision the cache reflects.
func (c *Cache) Version() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.version
}

// WaitFor waits until the cache reflects store revision rev.
func (c *Cache) WaitFor(ctx context.Context, rev uint64) error {
	return c.advanced.Wait(ctx, func() bool { return c.Version() >= rev })
}

// KeepHeld keeps the items whose service (key) the cache holds.
func KeepHeld[T any](c *Cache, items []T, key func(T) string) []T {
	c.mu.RLock()
	defer c.mu.RUnlock()
	kept := items[:0]
	for _, it := range items {
		if _, ok := c.services[key(it)]; ok {
			kept = append(kept, it)
		}
	}
	return kept
}

// Client is one agent's view of the cache: what it was sent, and what
// changed since.
type Client struct {
	c    *Cache
	node string
	// sent is the version the agent was last sent: everything the cache
	// held then (0 until its first state). Written by the client's own
	// goroutine under the cache's read lock, read under its write lock.
	sent atomic.Uint64
	// Only the client's own goroutine uses these two.
	sentNode *weirv1.NodeInfo
	covered  uint64

	// The marks of what changed since the last message: set by Apply
	// under the cache's write lock, emptied by the client's own goroutine
	// (one per client) under its read lock, so the cache's lock guards
	// them too.
	pending   map[string]bool
	nodeDirty bool
	since     time.Time // when the oldest pending change was accepted
	wake      notify.Kick
}

// Connect registers a client for node. A client is used by one goroutine.
func (c *Cache) Connect(node string) *Client {
	cl := &Client{c: c, node: node, pending: map[string]bool{}}
	c.mu.Lock()
	c.clients[cl] = true
	c.mu.Unlock()
	return cl
}

// Close unregisters the client: removals it was not sent may be
// forgotten. It may still be passed to Resume as a previous client.
func (cl *Client) Close() {
	cl.c.mu.Lock()
	delete(cl.c.clients, cl)
	cl.c.mu.Unlock()
}

// Wake returns a channel that receives when the client has changes to
// be sent.
func (cl *Client) Wake() <-chan struct{} { return cl.wake.C() }

// Sent is the version the client was last sent.
func (cl *Client) Sent() uint64 { return cl.sent.Load() }

// Covered is the cache version the last whole state or delta was worked
// out at: every change up to it that concerns the node was in what was
// sent (or concerned it not at all).
func (cl *Client) Covered() uint64 { return cl.covered }

// mark records a batch's changes and wakes the client, even when none
// concerns it: its next Next covers the batch's version. Called with the
// cache's write lock held.
func (cl *Client) mark(services []string, nodeDirty bool, since time.Time) {
	for _, k := range services {
		cl.pending[k] = true
	}
	cl.nodeDirty = cl.nodeDirty || nodeDirty
	if cl.since.IsZero() || since.Before(cl.since) {
		cl.since = since
	}
	cl.wake.Kick()
}

// take empties the marks. Called by the client's own goroutine with the
// cache's lock held (read), so that the marks are exactly those of the
// batches up to its version, and no Apply marks them meanwhile.
func (cl *Client) take() (services []string, nodeDirty bool, since time.Time) {
	services = slices.Collect(maps.Keys(cl.pending))
	clear(cl.pending)
	nodeDirty, cl.nodeDirty = cl.nodeDirty, false
	since, cl.since = cl.since, time.Time{}
	return services, nodeDirty, since
}

// Full is the node's whole state.
func (cl *Client) Full() *Message {
	c := cl.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	cl.take() // all in it
	msg := &Message{Version: c.version, Full: true, Node: c.nodeInfo(cl.node), Services: c.fullServices()}
	cl.sent.Store(msg.Version)
	cl.sentNode, cl.covered = msg.Node, c.version
	return msg
}

// fullServices are every service, sorted by key: built once per version.
// Called with the read lock held.
func (c *Cache) fullServices() *Services {
	c.stepsMu.Lock()
	defer c.stepsMu.Unlock()
	if c.full == nil {
		s := &Services{Version: c.version, Upserts: make([]*weirv1.NodeService, 0, len(c.services))}
		for _, k := range slices.Sorted(maps.Keys(c.services)) {
			s.Upserts = append(s.Upserts, c.services[k].msg)
		}
		c.full = s
	}
	return c.full
}

// Resume is what brings an agent from version v, which it applied, to the
// cache's, and true; or false when no delta can (v is 0, older than the
// horizon, or newer than anything the cache has seen). prev, when not
// nil, is the node's previous client: if it was last sent v, the node's
// description it was sent is not sent again.
func (cl *Client) Resume(v uint64, prev *Client) (*Message, bool) {
	c := cl.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	if v == 0 || v < c.horizon || v > c.version {
		return nil, false
	}
	if prev != nil && prev.sent.Load() == v {
		cl.sentNode = prev.sentNode
	}
	cl.take() // all in it
	cl.sent.Store(v)
	return cl.delta(nil, true), true
}

// Next is the delta of the changes marked since the last message, or nil
// when none concerns the node, and when the oldest of them was accepted.
func (cl *Client) Next() (*Message, time.Time) {
	c := cl.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	services, nodeDirty, since := cl.take()
	return cl.delta(services, nodeDirty), since
}

// delta is what changed for the node since it was last sent among keys
// (all keys when nil), or nil when nothing did. Called with the cache's
// read lock held.
func (cl *Client) delta(keys []string, nodeDirty bool) *Message {
	c := cl.c
	msg := &Message{Version: c.version}
	cl.covered = c.version
	from := cl.sent.Load()
	if nodeDirty {
		if ni := c.nodeInfo(cl.node); !proto.Equal(ni, cl.sentNode) {
			msg.Node, cl.sentNode = ni, ni
		}
	}
	if keys == nil || len(keys) > 0 {
		msg.Services = c.step(from, keys)
	}
	if msg.Node == nil && msg.Services == nil {
		return nil
	}
	cl.sent.Store(msg.Version)
	return msg
}

// step is what changed since version from among keys (all keys when nil),
// or nil when nothing did: built by the first client to need it at this
// version. Any client's keys give the same answer: they are what the
// batches after its last message changed, and what it was last sent is
// from, so the changes since from are all in them (and a key changed
// again since is only sent once). Called with the read lock held.
func (c *Cache) step(from uint64, keys []string) *Services {
	c.stepsMu.Lock()
	defer c.stepsMu.Unlock()
	if s, ok := c.steps[from]; ok {
		return s
	}
	if keys == nil {
		// Every key: only those changed since from are sorted (a resume
		// after a short absence sorts a few, not the whole state).
		for k, e := range c.services {
			if e.modified > from {
				keys = append(keys, k)
			}
		}
		for k, v := range c.removed {
			if v > from {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	s := &Services{From: from, Version: c.version}
	for _, k := range keys {
		if e, ok := c.services[k]; ok {
			if e.modified > from {
				s.Upserts = append(s.Upserts, e.msg)
			}
		} else if v, ok := c.removed[k]; ok && v > from {
			s.Removals = append(s.Removals, k)
		}
	}
	if len(s.Upserts) == 0 && len(s.Removals) == 0 {
		s = nil
	}
	if c.steps == nil {
		c.steps = map[uint64]*Services{}
	}
	c.steps[from] = s
	return s
}

// nodeInfo is the cached node, or an unregistered one. Called with mu held.
func (c *Cache) nodeInfo(name string) *weirv1.NodeInfo {
	if ni := c.nodes[name]; ni != nil {
		return ni
	}
	return &weirv1.NodeInfo{Name: name}
}
