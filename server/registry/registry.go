// Package registry is the server's source of truth for cluster state. It
// validates every write whole, persists it before answering, keeps every
// resource in memory for reads, and tells watchers and the per-node state
// engine what changed.
package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
)

var (
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
	// ErrConflict: the resource changed since the version the caller read.
	ErrConflict = errors.New("resource version conflict")
	// ErrInUse: the write would take something another resource holds.
	ErrInUse = errors.New("in use")
	// ErrBehind: this replica could not catch up with the store's writes
	// in time to decide a write (the store is away or slow).
	ErrBehind = errors.New("this replica is behind the store")
)

// Change says what one committed write touched.
type Change struct {
	Revision uint64
	// Services whose forwarding may have changed ("namespace/name").
	Services []string
	// ServiceObjects are the services whose own object was written,
	// not only their endpoints: what an address allocation follows.
	ServiceObjects []string
	// Nodes whose own description changed.
	Nodes []string
	// Address pools that changed.
	Pools []string
	// BGP peers that changed (every node's description may follow).
	Peers []string
	// Service CIDRs that changed (every node's description follows).
	ServiceCIDRs []string
}

// Registry holds every resource. Stored objects are immutable: writes store
// new objects, so readers may keep what they were given.
type Registry struct {
	store store.Backend
	now   func() time.Time
	// kinds are the collections by their stored kind, for writes read
	// back from the store.
	kinds map[string]storedKind

	// Lock order: writeMu, then mu or failMu; mu and failMu are never
	// held together (a write records the store's answer between its
	// decision and its publication, holding neither), so onWrite, called
	// under failMu, must not call back into the registry.
	//
	// writeMu lets one write of this replica through at a time, from its
	// decision to its publication; mu is not held while the store
	// commits, so reads, streams and the store's read-back go on then.
	writeMu sync.Mutex
	// failMu guards the store's refusal of the last write (nil when it
	// took it), since when writes fail, and who is told when that
	// changes; not writeMu, which a slow commit holds.
	failMu       sync.Mutex
	writeErr     error
	writeFailing time.Time
	onWrite      func(error)

	mu  sync.RWMutex // guards everything below, and the collections' items
	rev uint64
	// advanced is broadcast whenever rev moves.
	advanced        notify.Signal
	slicesByService map[string]map[string]*model.EndpointSlice
	listeners       []func(Change)
	// drained holds the nodes an operator drained, each with its drain's
	// deadline (zero: none): Weir's own state, apart from the Node, which
	// a source such as Kubernetes may own.
	drained map[string]time.Time
	// candidatesRev is the revision of the last write to a node, a drain,
	// a peer or a pool: what decides which nodes may announce a pool's
	// addresses (see View.CandidatesRevision).
	candidatesRev uint64
	// rules are the services' allocation rules; claimIndex finds the
	// services that may share an address or a node port.
	rules      ServiceRules
	claimIndex claimIndex
	// loadBalancers are the keys of the services with load-balancer IPs,
	// kept with every write (reindex): what follows those addresses (the
	// L2 owners, the announcers) looks at them, not at every service.
	loadBalancers map[string]bool
	// nodeAddrs are the nodes by their addresses (reindex): no service
	// may take one as an external or load-balancer IP.
	nodeAddrs map[netip.Addr]map[string]bool

	Services       *Collection[*model.Service]
	EndpointSlices *Collection[*model.EndpointSlice]
	Nodes          *Collection[*model.Node]
	Pools          *Collection[*model.AddressPool]
	Peers          *Collection[*model.BGPPeer]
	ServiceCIDRs   *Collection[*model.ServiceCIDR]
}

// storedKind is a collection as the store sees it.
type storedKind interface {
	putStored(key string, rev uint64, value []byte) (obj, old model.Object, err error)
	revisions() map[string]uint64
}

// Open loads every stored resource.
func Open(st store.Backend) (*Registry, error) {
	r := &Registry{store: st, now: time.Now, slicesByService: map[string]map[string]*model.EndpointSlice{}, drained: map[string]time.Time{},
		loadBalancers: map[string]bool{}, nodeAddrs: map[netip.Addr]map[string]bool{}, rules: DefaultServiceRules()}
	r.Services = newCollection(r, "services", true, func(s *model.Service) error {
		if err := s.Validate(); err != nil {
			return err
		}
		return r.checkServiceClaims(s)
	})
	r.EndpointSlices = newCollection(r, "endpointslices", true, (*model.EndpointSlice).Validate)
	r.Nodes = newCollection(r, "nodes", false, func(n *model.Node) error {
		if err := n.Validate(); err != nil {
			return err
		}
		return r.checkNodeClear(n)
	})
	r.Pools = newCollection(r, "addresspools", false, func(p *model.AddressPool) error {
		if err := p.Validate(); err != nil {
			return err
		}
		return r.checkPoolOverlap(p)
	})
	r.Pools.displaced = r.displacedPools
	r.Peers = newCollection(r, "bgppeers", false, (*model.BGPPeer).Validate)
	r.Services.specRule, r.Peers.specRule = KeepServiceStatus, KeepPeerPassword
	r.ServiceCIDRs = newCollection(r, "servicecidrs", false, func(c *model.ServiceCIDR) error {
		if err := c.Validate(); err != nil {
			return err
		}
		return r.checkServiceCIDRClear(c)
	})
	r.kinds = map[string]storedKind{
		r.Services.kind: r.Services, r.EndpointSlices.kind: r.EndpointSlices, r.Nodes.kind: r.Nodes,
		r.Pools.kind: r.Pools, r.Peers.kind: r.Peers, r.ServiceCIDRs.kind: r.ServiceCIDRs,
	}
	rev, err := st.Load(func(kind, key string, rev uint64, value []byte) error {
		if kind == drainsKind {
			r.drained[key] = decodeDrain(value)
			return nil
		}
		if k := r.kinds[kind]; k != nil {
			_, _, err := k.putStored(key, rev, value)
			return err
		}
		return nil // a kind a newer version wrote
	})
	if err != nil {
		return nil, err
	}
	r.rev = rev
	for _, s := range r.EndpointSlices.items {
		r.reindex(s, nil)
	}
	for _, s := range r.Services.items {
		r.reindex(s, nil)
	}
	for _, n := range r.Nodes.items {
		r.reindex(n, nil)
	}
	return r, nil
}

const drainsKind = "drains"

// SetServiceRules sets the rules native service writes are held to, and
// that decide what of the Kubernetes source's services the nodes program.
// It is set before the registry serves.
func (r *Registry) SetServiceRules(rules ServiceRules) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rules = rules
}

// putDrain puts a drain write in place. Called with mu held.
func (r *Registry) putDrain(op store.Op, ch *Change) {
	if op.Value != nil {
		r.drained[op.Key] = decodeDrain(op.Value)
	} else {
		delete(r.drained, op.Key)
	}
	ch.Nodes = append(ch.Nodes, op.Key)
	r.candidatesRev = ch.Revision
	if n, ok := r.Nodes.items[op.Key]; ok {
		r.Nodes.notify(Modified, n) // watchers see the drain too
	}
}

// Aside is what keeps the node out of external traffic apart from its
// agent: an operator's drain, its exclusion label.
func (r *Registry) Aside(node string) model.Aside {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return View{r}.Aside(node)
}

// WithDrain is n with its drain state (Drained, DrainDeadline), for a
// node read from Nodes; the stored object is not changed.
func (r *Registry) WithDrain(n *model.Node) *model.Node {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.withDrain(n)
}

// withDrain is WithDrain with mu held.
func (r *Registry) withDrain(n *model.Node) *model.Node {
	deadline, drained := r.drained[n.Name]
	if !drained {
		return n
	}
	c := *n
	c.Drained, c.DrainDeadline = true, deadline
	return &c
}

// OnChange registers fn to be called, in commit order and under the
// registry's lock, after every write. fn must not block or call back.
func (r *Registry) OnChange(fn func(Change)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, fn)
}

// Read runs fn with a consistent view of the whole registry.
func (r *Registry) Read(fn func(View)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	fn(View{r})
}

// View is a consistent, read-only view of the registry, valid inside Read.
type View struct{ r *Registry }

func (v View) Revision() uint64 { return v.r.rev }

// CandidatesRevision is the revision of the last write to a node, a
// node's drain, a BGP peer or an address pool (0 before any since the
// registry was opened): as long as it stays, so do the nodes that may
// announce each pool's addresses.
func (v View) CandidatesRevision() uint64 { return v.r.candidatesRev }

// HistoryAt names the history a revision belongs to (see store.HistoryAt).
func (r *Registry) HistoryAt(rev uint64) string  { return r.store.HistoryAt(rev) }
func (v View) Service(key string) *model.Service { return v.r.Services.items[key] }

// Peers lists every BGP peer, by name.
func (v View) Peers() []*model.BGPPeer { return v.r.Peers.list("", nil) }

// ServiceCIDRs lists every service CIDR, by name.
func (v View) ServiceCIDRs() []*model.ServiceCIDR { return v.r.ServiceCIDRs.list("", nil) }

// Pools lists every address pool, by name.
func (v View) Pools() []*model.AddressPool { return v.r.Pools.list("", nil) }

func (v View) Node(name string) *model.Node {
	if n := v.r.Nodes.items[name]; n != nil {
		return v.r.withDrain(n)
	}
	return nil
}

// ServiceKeys lists every service.
func (v View) ServiceKeys() []string {
	keys := make([]string, 0, len(v.r.Services.items))
	for k := range v.r.Services.items {
		keys = append(keys, k)
	}
	return keys
}

// LoadBalancerServiceKeys lists the services with load-balancer IPs.
func (v View) LoadBalancerServiceKeys() []string {
	return slices.Collect(maps.Keys(v.r.loadBalancers))
}

// LoadBalancerServices lists the services with load-balancer IPs, by key.
func (v View) LoadBalancerServices() []*model.Service {
	keys := v.LoadBalancerServiceKeys()
	slices.Sort(keys)
	out := make([]*model.Service, len(keys))
	for i, k := range keys {
		out[i] = v.r.Services.items[k]
	}
	return out
}

// NodeNames lists every node.
func (v View) NodeNames() []string {
	names := make([]string, 0, len(v.r.Nodes.items))
	for k := range v.r.Nodes.items {
		names = append(names, k)
	}
	return names
}

// EndpointSlicesOf returns the slices of a service, in a stable order.
func (v View) EndpointSlicesOf(serviceKey string) []*model.EndpointSlice {
	m := v.r.slicesByService[serviceKey]
	out := make([]*model.EndpointSlice, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *model.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (r *Registry) indexSlice(now, old *model.EndpointSlice) {
	if old != nil {
		delete(r.slicesByService[old.ServiceKey()], old.Key())
		if len(r.slicesByService[old.ServiceKey()]) == 0 {
			delete(r.slicesByService, old.ServiceKey())
		}
	}
	if now != nil {
		m := r.slicesByService[now.ServiceKey()]
		if m == nil {
			m = map[string]*model.EndpointSlice{}
			r.slicesByService[now.ServiceKey()] = m
		}
		m[now.Key()] = now
	}
}

// OverlapError is a pool's range sharing addresses with another pool's:
// ErrInUse, with what and where.
type OverlapError struct {
	Index int // in the pool's addresses
	Range model.AddressRange
	Pool  string // the other
}

func (e *OverlapError) Error() string {
	return fmt.Sprintf("%v: addresses[%d] %s overlaps pool %s", ErrInUse, e.Index, e.Range, e.Pool)
}

func (e *OverlapError) Unwrap() error { return ErrInUse }

// CompareAge orders two objects where both want what only one may have:
// the older creation time first, then the key (as Kubernetes breaks
// ties). It depends neither on the order the objects came in nor on what
// the store held before, so every replica decides alike, after every
// restart.
func CompareAge(a, b model.Object) int {
	am, bm := a.GetMeta(), b.GetMeta()
	return cmp.Or(am.CreateTime.Compare(bm.CreateTime), cmp.Compare(am.Key(), bm.Key()))
}

// Precedes says whether a comes before b by CompareAge.
func Precedes(a, b model.Object) bool { return CompareAge(a, b) < 0 }

// displaces says whether pool p takes the place of other, which shares
// addresses with it: when both are the cluster's (an admission webhook
// failing open lets Kubernetes hold both) and p precedes other. A pool of
// another source is refused instead, the one taken first staying: the
// store keeps that order, and the native API tells its writer at once.
func displaces(p, other *model.AddressPool) bool {
	return p.Source == model.SourceKubernetes && other.Source == model.SourceKubernetes && Precedes(p, other)
}

// overlap is the index of p's first range that shares addresses with
// other's, and that range; ok is false when none does.
func overlap(p, other *model.AddressPool) (i int, rg model.AddressRange, ok bool) {
	for i, a := range p.Ranges {
		for _, b := range other.Ranges {
			if a.First.Is4() == b.First.Is4() && a.First.Compare(b.Last) <= 0 && b.First.Compare(a.Last) <= 0 {
				return i, a, true
			}
		}
	}
	return 0, model.AddressRange{}, false
}

// checkPoolOverlap rejects a pool sharing addresses with another it does
// not displace: an address must come from one pool only.
func (r *Registry) checkPoolOverlap(p *model.AddressPool) error {
	for _, name := range slices.Sorted(maps.Keys(r.Pools.items)) {
		other := r.Pools.items[name]
		if i, rg, ok := overlap(p, other); ok && name != p.Name && !displaces(p, other) {
			return &OverlapError{Index: i, Range: rg, Pool: name}
		}
	}
	return nil
}

// displacedPools lists the pools a write of p removes: those sharing
// addresses with it that it displaces.
func (r *Registry) displacedPools(p *model.AddressPool) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(r.Pools.items)) {
		other := r.Pools.items[name]
		if _, _, ok := overlap(p, other); ok && name != p.Name && displaces(p, other) {
			out = append(out, name)
		}
	}
	return out
}

// pending is a write decided against the registry and not yet in the
// store.
type pending struct {
	guard store.Guard
	ops   []store.Op
	what  string // for errors: "services default/web"
	// publish puts the write in place once the store holds it at rev;
	// readBack says the registry has read it back from the store already
	// (a replica's Follow can be first), and then only the versions of
	// the caller's objects are set. Called with mu held.
	publish func(rev uint64, readBack bool)
}

// resourceWrite is one resource's part of a write: obj in place of old
// (either may be nil) in its collection; put puts it there and tells the
// collection's watchers. put is called with mu held.
type resourceWrite struct {
	kind, key string
	obj, old  model.Object
	put       func()
}

// pendingWrite is a write of resources (the first one is the one asked
// for; the others go with it, such as the pools it takes the place of).
// Called with mu held.
func (r *Registry) pendingWrite(g store.Guard, ws ...resourceWrite) (*pending, error) {
	p := &pending{guard: g, what: ws[0].kind + " " + ws[0].key}
	for _, w := range ws {
		op := store.Op{Kind: w.kind, Key: w.key}
		if w.obj != nil {
			var err error
			if op.Value, err = r.encode(w.obj); err != nil {
				return nil, err
			}
		}
		p.ops = append(p.ops, op)
	}
	p.publish = func(rev uint64, readBack bool) {
		for _, w := range ws {
			if w.obj != nil {
				w.obj.GetMeta().ResourceVersion = rev
			}
		}
		if readBack {
			return
		}
		ch := Change{Revision: rev}
		for _, w := range ws {
			w.put()
			r.reindex(w.obj, w.old)
			r.touched(w.obj, w.old, &ch)
		}
		r.notifyListeners(ch)
	}
	return p, nil
}

// encode is obj as stored, with the revision the write will have in a
// store only this server writes (a shared store says which it was: see
// Collection.decode); obj keeps the version its caller asked for, which a
// write tried again is checked against. Called with mu held.
func (r *Registry) encode(obj model.Object) ([]byte, error) {
	m := obj.GetMeta()
	asked := m.ResourceVersion
	m.ResourceVersion = r.rev + 1
	b, err := json.Marshal(obj)
	m.ResourceVersion = asked
	return b, err
}

func (r *Registry) notifyListeners(ch Change) {
	for _, fn := range r.listeners {
		fn(ch)
	}
}

// commitOps writes ops based on revision base, guarded by g
// where the store shares leaderships (etcd); with a store only this
// server writes, this server holds every leadership.
func (r *Registry) commitOps(g store.Guard, base uint64, ops []store.Op) (uint64, error) {
	if gs, ok := r.store.(interface {
		CommitGuarded(store.Guard, uint64, ...store.Op) (uint64, error)
	}); ok && g.Key != "" {
		return gs.CommitGuarded(g, base, ops...)
	}
	return r.store.Commit(base, ops...)
}

// advance takes the revision of a write just committed or read back.
// Called with mu held.
func (r *Registry) advance(rev uint64) {
	if rev <= r.rev {
		// Every write is based on the last (store.Backend.Commit).
		panic(fmt.Sprintf("store revision %d after %d", rev, r.rev))
	}
	r.rev = rev
	r.advanced.Broadcast()
}

// CatchUpTimeout bounds how long a write waits for this replica to read
// the writes another replica made first.
var CatchUpTimeout = 5 * time.Second

// write makes one write of this replica: decide, under mu, checks the
// request against the registry and says what to store (nil: nothing);
// the store then commits it, without mu; and the write is published under
// mu. When another replica wrote first (the store refused the commit as
// stale), it waits to read that write back and decides again, so every
// check is made against the state the write follows. It returns the
// write's revision (the registry's, when there was nothing to write).
func (r *Registry) write(decide func() (*pending, error)) (uint64, error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	for {
		r.mu.Lock()
		p, err := decide()
		base := r.rev
		r.mu.Unlock()
		if err != nil || p == nil {
			return base, err
		}
		rev, err := r.commitOps(p.guard, base, p.ops)
		var stale *store.StaleError
		if errors.As(err, &stale) {
			if err := r.waitFor(stale.Revision, CatchUpTimeout); err != nil {
				return 0, err
			}
			continue
		}
		if !errors.Is(err, store.ErrNotLeader) { // a leadership lost is no fault of the store
			r.wrote(err)
		}
		if err != nil {
			return 0, fmt.Errorf("persisting %s: %w", p.what, err)
		}
		r.mu.Lock()
		readBack := r.rev >= rev
		if !readBack {
			r.advance(rev)
		}
		p.publish(rev, readBack)
		r.mu.Unlock()
		return rev, nil
	}
}

// wrote records whether the store took a write.
func (r *Registry) wrote(err error) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	changed := (err == nil) != (r.writeErr == nil)
	if err != nil && r.writeErr == nil {
		r.writeFailing = r.now()
	}
	r.writeErr = err
	if changed && r.onWrite != nil {
		r.onWrite(err)
	}
}

// WriteFailure is since when writes have failed and the store's refusal
// of this registry's last write; nil when the store took the last write.
func (r *Registry) WriteFailure() (since time.Time, err error) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	return r.writeFailing, r.writeErr
}

// OnWriteFailure calls fn, with the error or nil, whenever the store starts
// refusing writes or takes one again. fn is called under the lock that
// guards that state, and must not call back into the registry.
func (r *Registry) OnWriteFailure(fn func(error)) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	r.onWrite = fn
}

// waitFor waits until the registry holds revision rev.
func (r *Registry) waitFor(rev uint64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var cur uint64
	err := r.advanced.Wait(ctx, func() bool {
		r.mu.RLock()
		defer r.mu.RUnlock()
		cur = r.rev
		return cur >= rev
	})
	if err != nil {
		return fmt.Errorf("%w: at revision %d, the store at %d", ErrBehind, cur, rev)
	}
	return nil
}

// Follow reads back, until ctx ends, the writes other replicas make to a
// shared store, and publishes them as this registry's own. It returns at
// once for a store only this server writes.
func (r *Registry) Follow(ctx context.Context, log *slog.Logger) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := r.store.Watch(ctx, r.Revision(), r.putStored)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, store.ErrCompacted) {
			log.Warn("the store no longer holds the writes since this replica's revision; reloading", "revision", r.Revision())
			err = r.reload()
			if err == nil {
				backoff = 100 * time.Millisecond
				continue
			}
		}
		log.Warn("following the store", "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Revision is the revision the registry holds.
func (r *Registry) Revision() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.rev
}

// putStored puts in place one write read back from the store, unless it
// is one this registry made (and holds) already.
func (r *Registry) putStored(rev uint64, ops []store.Op) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rev <= r.rev {
		return nil
	}
	ch := Change{Revision: rev}
	for _, op := range ops {
		r.putStoredOp(rev, op, &ch)
	}
	r.advance(rev)
	r.notifyListeners(ch)
	return nil
}

func (r *Registry) putStoredOp(rev uint64, op store.Op, ch *Change) {
	if op.Kind == drainsKind {
		r.putDrain(op, ch)
		return
	}
	k := r.kinds[op.Kind]
	if k == nil {
		return // a kind a newer version wrote
	}
	obj, old, err := k.putStored(op.Key, rev, op.Value)
	if err != nil {
		// Only a writer of another version could store what this one
		// cannot read: keep the rest, say which.
		slog.Error("skipping a stored resource this version cannot read", "kind", op.Kind, "key", op.Key, "error", err)
		return
	}
	if obj == nil && old == nil {
		return
	}
	r.reindex(obj, old)
	r.touched(obj, old, ch)
}

// reload reads the whole store again and puts in place what differs from
// memory, as one change: for a replica whose place in the store's history
// is gone.
func (r *Registry) reload() error {
	type stored struct {
		rev   uint64
		value []byte
	}
	fresh := map[string]map[string]stored{}
	rev, err := r.store.Load(func(kind, key string, rev uint64, value []byte) error {
		if fresh[kind] == nil {
			fresh[kind] = map[string]stored{}
		}
		fresh[kind][key] = stored{rev, value}
		return nil
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rev <= r.rev {
		return nil
	}
	ch := Change{Revision: rev}
	for kind, k := range r.kinds {
		held := k.revisions()
		for key := range held {
			if _, ok := fresh[kind][key]; !ok {
				r.putStoredOp(rev, store.Op{Kind: kind, Key: key}, &ch)
			}
		}
		for key, s := range fresh[kind] {
			if held[key] != s.rev {
				r.putStoredOp(s.rev, store.Op{Kind: kind, Key: key, Value: s.value}, &ch)
			}
		}
	}
	for key := range r.drained {
		if _, ok := fresh[drainsKind][key]; !ok {
			r.putDrain(store.Op{Kind: drainsKind, Key: key}, &ch)
		}
	}
	for key, s := range fresh[drainsKind] {
		if deadline, ok := r.drained[key]; !ok || !deadline.Equal(decodeDrain(s.value)) {
			r.putDrain(store.Op{Kind: drainsKind, Key: key, Value: s.value}, &ch)
		}
	}
	r.advance(rev)
	for _, fn := range r.listeners {
		fn(ch)
	}
	return nil
}

// reindex updates the indexes for a write of obj over old (either may be
// nil); reindex(old, obj) undoes reindex(obj, old).
func (r *Registry) reindex(obj, old model.Object) {
	switch firstNonNil(obj, old).(type) {
	case *model.Service:
		now, _ := obj.(*model.Service)
		was, _ := old.(*model.Service)
		key := firstNonNil(obj, old).GetMeta().Key()
		r.claimIndex.update(key, was, now)
		if now != nil && len(now.LoadBalancerIPs) > 0 {
			r.loadBalancers[key] = true
		} else {
			delete(r.loadBalancers, key)
		}
	case *model.EndpointSlice:
		now, _ := obj.(*model.EndpointSlice)
		was, _ := old.(*model.EndpointSlice)
		r.indexSlice(now, was)
	case *model.Node:
		if was, ok := old.(*model.Node); ok {
			for _, a := range was.Addresses {
				if m := r.nodeAddrs[a]; m != nil {
					delete(m, was.Name)
					if len(m) == 0 {
						delete(r.nodeAddrs, a)
					}
				}
			}
		}
		if now, ok := obj.(*model.Node); ok {
			for _, a := range now.Addresses {
				add(r.nodeAddrs, a, now.Name)
			}
		}
	}
}

// touched adds to ch what a write of obj over old concerns (either may be
// nil, never both).
func (r *Registry) touched(obj, old model.Object, ch *Change) {
	switch o := firstNonNil(obj, old).(type) {
	case *model.Service:
		r.touchedService(o.Key(), versionsOf[*model.Service](obj, old), ch)
	case *model.EndpointSlice:
		touchedSlice(versionsOf[*model.EndpointSlice](obj, old), ch)
	case *model.Node:
		ch.Nodes = append(ch.Nodes, o.Name)
		r.candidatesRev = ch.Revision
		r.touchedNodeAddrs(versionsOf[*model.Node](obj, old), ch)
	case *model.AddressPool:
		ch.Pools = append(ch.Pools, o.Name)
		r.candidatesRev = ch.Revision
		r.touchedPoolRanges(versionsOf[*model.AddressPool](obj, old), ch)
	case *model.BGPPeer:
		ch.Peers = append(ch.Peers, o.Name)
		r.candidatesRev = ch.Revision
	case *model.ServiceCIDR:
		ch.ServiceCIDRs = append(ch.ServiceCIDRs, o.Name)
		r.touchedServiceRanges(versionsOf[*model.ServiceCIDR](obj, old), ch)
	}
}

// versionsOf are a write's new and old object (those that are not nil),
// as T.
func versionsOf[T model.Object](obj, old model.Object) []T {
	var out []T
	for _, o := range []model.Object{obj, old} {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// touchedService: a service's claims decide what its neighbours keep
// (see View.ServiceConflicts), so they are recomputed too, on its old
// claims and its new.
func (r *Registry) touchedService(key string, versions []*model.Service, ch *Change) {
	ch.Services = append(ch.Services, key)
	ch.ServiceObjects = append(ch.ServiceObjects, key)
	for _, s := range versions {
		ch.Services = append(ch.Services, r.claimIndex.neighbours(s)...)
	}
}

// touchedSlice: a slice's service, and the one it left.
func touchedSlice(versions []*model.EndpointSlice, ch *Change) {
	ch.Services = append(ch.Services, versions[0].ServiceKey())
	if len(versions) == 2 && versions[1].ServiceKey() != versions[0].ServiceKey() {
		ch.Services = append(ch.Services, versions[1].ServiceKey())
	}
}

// touchedNodeAddrs: a node's addresses are never a service's frontends
// (ruleBreaches), so the services on its old and new ones are recomputed.
func (r *Registry) touchedNodeAddrs(versions []*model.Node, ch *Change) {
	for _, n := range versions {
		for _, a := range n.Addresses {
			ch.Services = append(ch.Services, slices.Sorted(maps.Keys(r.claimIndex.byAddr[a]))...)
		}
	}
}

// touchedPoolRanges: a native service's load-balancer IPs come from the
// pools, so the services with one in the pool's old or new ranges are
// recomputed.
func (r *Registry) touchedPoolRanges(versions []*model.AddressPool, ch *Change) {
	var ranges []model.AddressRange
	for _, p := range versions {
		ranges = append(ranges, p.Ranges...)
	}
	ch.Services = append(ch.Services, r.loadBalancersWhere(func(a netip.Addr) bool {
		return slices.ContainsFunc(ranges, func(rg model.AddressRange) bool { return rg.Contains(a) })
	})...)
}

// touchedServiceRanges: no load-balancer IP lies in a service range, so
// the services with one in the range's old or new CIDRs are recomputed.
func (r *Registry) touchedServiceRanges(versions []*model.ServiceCIDR, ch *Change) {
	var cidrs []netip.Prefix
	for _, c := range versions {
		cidrs = append(cidrs, c.CIDRs...)
	}
	ch.Services = append(ch.Services, r.loadBalancersWhere(func(a netip.Addr) bool {
		return slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) })
	})...)
}

// loadBalancersWhere lists the services with a load-balancer IP that in
// says is in.
func (r *Registry) loadBalancersWhere(in func(netip.Addr) bool) []string {
	var out []string
	for key := range r.loadBalancers {
		if slices.ContainsFunc(r.Services.items[key].LoadBalancerIPs, in) {
			out = append(out, key)
		}
	}
	return out
}

func firstNonNil(a, b model.Object) model.Object {
	if a != nil {
		return a
	}
	return b
}

// WatchBuffer is how many events a watcher may fall behind before it is
// cut off (and must list and watch again), so a slow client never slows the
// registry.
const WatchBuffer = 1024
