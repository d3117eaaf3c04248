package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
)

// Collection is one kind of resource in the registry.
type Collection[T model.Object] struct {
	r          *Registry
	kind       string
	namespaced bool
	check      func(T) error
	// specRule is what an update of the spec alone keeps of the stored
	// object (UpdateSpec, ApplySpec); nil: nothing.
	specRule Keep[T]
	// displaced lists the objects a write of one removes, which it takes
	// the place of (pools: see displaces); nil: none.
	displaced func(T) []string
	items     map[string]T
	watchers  map[*watcher[T]]struct{}
}

func newCollection[T model.Object](r *Registry, kind string, namespaced bool, check func(T) error) *Collection[T] {
	return &Collection[T]{r: r, kind: kind, namespaced: namespaced, check: check, items: map[string]T{}, watchers: map[*watcher[T]]struct{}{}}
}

func (c *Collection[T]) decode(key string, rev uint64, value []byte) (T, error) {
	var obj T
	if err := json.Unmarshal(value, &obj); err != nil {
		return obj, fmt.Errorf("%w: %s %s: %v", store.ErrCorrupt, c.kind, key, err)
	}
	// A store that keeps a revision per resource (etcd) has the truth;
	// the one in the value was the writer's guess.
	if rev != 0 {
		obj.GetMeta().ResourceVersion = rev
	}
	return obj, nil
}

// putStored puts in place a write read from the store (value nil: a
// deletion) and tells the watchers; obj and old are nil where there is
// none. Called with the registry's lock held.
func (c *Collection[T]) putStored(key string, rev uint64, value []byte) (obj, old model.Object, err error) {
	prev, existed := c.items[key]
	if existed {
		old = prev
	}
	if value == nil {
		if existed {
			delete(c.items, key)
			c.notify(Deleted, prev)
		}
		return nil, old, nil
	}
	o, err := c.decode(key, rev, value)
	if err != nil {
		return nil, nil, err
	}
	c.items[key] = o
	if existed {
		c.notify(Modified, o)
	} else {
		c.notify(Added, o)
	}
	return o, old, nil
}

// revisions lists every resource's version, for a reload to compare.
func (c *Collection[T]) revisions() map[string]uint64 {
	out := make(map[string]uint64, len(c.items))
	for k, obj := range c.items {
		out[k] = obj.GetMeta().ResourceVersion
	}
	return out
}

// Create stores a new resource. It fails with ErrAlreadyExists when one of
// that name exists.
func (c *Collection[T]) Create(obj T) (T, error) { return c.create(obj, false) }

// CheckCreate runs every check Create would, and writes nothing.
func (c *Collection[T]) CheckCreate(obj T) (T, error) { return c.create(obj, true) }

func (c *Collection[T]) create(obj T, dryRun bool) (T, error) {
	_, err := c.r.write(func() (*pending, error) { return c.decideCreate(obj, dryRun) })
	return obj, err
}

func (c *Collection[T]) decideCreate(obj T, dryRun bool) (*pending, error) {
	m := obj.GetMeta()
	if m.Source == "" {
		m.Source = model.SourceNative
	}
	if err := c.check(obj); err != nil {
		return nil, err
	}
	key := m.Key()
	if old, ok := c.items[key]; ok {
		if src := old.GetMeta().Source; src != m.Source {
			return nil, fmt.Errorf("%s %s exists, owned by the %s source: %w", c.kind, key, src, ErrAlreadyExists)
		}
		return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrAlreadyExists)
	}
	// A source that knows when the resource was made (Kubernetes) says
	// so; the native API cannot.
	if m.CreateTime.IsZero() {
		m.CreateTime = c.r.now().UTC()
	}
	if dryRun {
		return nil, nil
	}
	put := resourceWrite{kind: c.kind, key: key, obj: obj, put: func() {
		c.items[key] = obj
		c.notify(Added, obj)
	}}
	return c.r.pendingWrite(store.Guard{}, append([]resourceWrite{put}, c.displacing(obj)...)...)
}

// removing is the write that removes the object of key.
func (c *Collection[T]) removing(key string) resourceWrite {
	old := c.items[key]
	return resourceWrite{kind: c.kind, key: key, old: old, put: func() {
		delete(c.items, key)
		c.notify(Deleted, old)
	}}
}

// Displaces lists the objects a write of obj would take the place of
// (pools: see displaces), and writes nothing: what an admission check
// refuses, so that what the cluster holds stays in place.
func (c *Collection[T]) Displaces(obj T) []string {
	c.r.mu.RLock()
	defer c.r.mu.RUnlock()
	if c.displaced == nil {
		return nil
	}
	return c.displaced(obj)
}

// displacing is the removals that go with a write of obj: the objects it
// takes the place of.
func (c *Collection[T]) displacing(obj T) []resourceWrite {
	if c.displaced == nil {
		return nil
	}
	var out []resourceWrite
	for _, key := range c.displaced(obj) {
		out = append(out, c.removing(key))
	}
	return out
}

// Update replaces a resource with obj whole: its writer (a source, a
// controller) says every field. A non-zero ResourceVersion must match the
// stored one.
func (c *Collection[T]) Update(obj T) (T, error) { return c.update(store.Guard{}, obj, nil, false) }

// UpdateGuarded is Update, made only while g holds: the writes of a job
// that only the leader of the replicas runs.
func (c *Collection[T]) UpdateGuarded(g store.Guard, obj T) (T, error) {
	return c.update(g, obj, nil, false)
}

// CheckUpdate runs every check Update would, and writes nothing.
func (c *Collection[T]) CheckUpdate(obj T) (T, error) { return c.update(store.Guard{}, obj, nil, true) }

// UpdateSpec is Update by a writer of the spec alone (the native API):
// what Weir writes itself (status) and what is never read back (a
// password) are kept as the collection's rule says (see Keep). With
// dryRun it writes nothing.
func (c *Collection[T]) UpdateSpec(obj T, dryRun bool) (T, error) {
	return c.update(store.Guard{}, obj, c.specRule, dryRun)
}

// UpdateKeeping is Update keeping of the stored object what keep says
// (nil: nothing). With dryRun it writes nothing.
func (c *Collection[T]) UpdateKeeping(obj T, keep Keep[T], dryRun bool) (T, error) {
	return c.update(store.Guard{}, obj, keep, dryRun)
}

// update returns the object stored (or that would be): obj with what
// keep kept.
func (c *Collection[T]) update(g store.Guard, obj T, keep Keep[T], dryRun bool) (T, error) {
	stored := obj
	_, err := c.r.write(func() (*pending, error) {
		var p *pending
		var err error
		stored, p, err = c.decideUpdate(g, obj, keep, dryRun)
		return p, err
	})
	return stored, err
}

// decideUpdate decides an update of the stored object by obj, under the
// registry's lock; keep runs here, against the object stored now, so
// what another writer wrote since the caller read the resource is never
// written over with what it read. obj is not changed by keep: a write
// decided again (after another replica's) starts from the request.
func (c *Collection[T]) decideUpdate(g store.Guard, obj T, keep Keep[T], dryRun bool) (T, *pending, error) {
	m := obj.GetMeta()
	key := m.Key()
	old, ok := c.items[key]
	if !ok {
		return obj, nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotFound)
	}
	if m.Source == "" {
		m.Source = old.GetMeta().Source
	}
	obj, err := c.replacing(obj, old, keep)
	if err != nil {
		return obj, nil, err
	}
	if err := c.check(obj); err != nil {
		return obj, nil, err
	}
	if dryRun {
		obj.GetMeta().ResourceVersion = old.GetMeta().ResourceVersion
		return obj, nil, nil
	}
	put := resourceWrite{kind: c.kind, key: key, obj: obj, old: old, put: func() {
		c.items[key] = obj
		c.notify(Modified, obj)
	}}
	p, err := c.r.pendingWrite(g, append([]resourceWrite{put}, c.displacing(obj)...)...)
	return obj, p, err
}

// replacing decides, under the registry's lock, whether obj may replace
// old (the version obj names, if any, is old's; so is its source) and
// what it keeps of it (keep, and the creation time). It returns the
// object to store.
func (c *Collection[T]) replacing(obj, old T, keep Keep[T]) (T, error) {
	m, om := obj.GetMeta(), old.GetMeta()
	if m.ResourceVersion != 0 && m.ResourceVersion != om.ResourceVersion {
		return obj, fmt.Errorf("%s %s is at version %d, not %d: %w", c.kind, om.Key(), om.ResourceVersion, m.ResourceVersion, ErrConflict)
	}
	if m.Source != om.Source {
		return obj, fmt.Errorf("%s %s is owned by the %s source: %w", c.kind, om.Key(), om.Source, ErrInUse)
	}
	if keep != nil {
		obj = keep(obj, old)
		m = obj.GetMeta()
	}
	// The creation time is the stored one, unless the cluster says when
	// its object was made (one deleted and made again while this server
	// was away keeps its name, not its age): what Precedes compares is
	// then the same on a replica that kept its store and one that did not.
	if m.Source != model.SourceKubernetes || m.CreateTime.IsZero() {
		m.CreateTime = om.CreateTime
	}
	return obj, nil
}

// Delete removes a resource that source owns (any source when empty) and
// returns the revision of the deletion. A non-zero resourceVersion must
// match.
func (c *Collection[T]) Delete(key string, resourceVersion uint64, source string) (uint64, error) {
	return c.r.write(func() (*pending, error) {
		old, ok := c.items[key]
		if !ok {
			return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotFound)
		}
		if src := old.GetMeta().Source; source != "" && src != source {
			return nil, fmt.Errorf("%s %s is owned by the %s source: %w", c.kind, key, src, ErrInUse)
		}
		if rv := old.GetMeta().ResourceVersion; resourceVersion != 0 && resourceVersion != rv {
			return nil, fmt.Errorf("%s %s is at version %d, not %d: %w", c.kind, key, rv, resourceVersion, ErrConflict)
		}
		return c.r.pendingWrite(store.Guard{}, c.removing(key))
	})
}

// Get returns one resource.
func (c *Collection[T]) Get(key string) (T, error) {
	c.r.mu.RLock()
	defer c.r.mu.RUnlock()
	obj, ok := c.items[key]
	if !ok {
		return obj, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotFound)
	}
	return obj, nil
}

// List returns the resources in namespace (all when empty) that match sel,
// sorted by key, and the revision they were read at.
func (c *Collection[T]) List(namespace string, sel Selector) ([]T, uint64) {
	c.r.mu.RLock()
	defer c.r.mu.RUnlock()
	return c.list(namespace, sel), c.r.rev
}

func (c *Collection[T]) list(namespace string, sel Selector) []T {
	var out []T
	for _, obj := range c.items {
		if matches(obj, namespace, sel) {
			out = append(out, obj)
		}
	}
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(a.GetMeta().Key(), b.GetMeta().Key()) })
	return out
}

func matches(obj model.Object, namespace string, sel Selector) bool {
	m := obj.GetMeta()
	return (namespace == "" || m.Namespace == namespace) && sel.Matches(m.Labels)
}

// EventType says what happened to a watched resource.
type EventType int

const (
	Added EventType = iota + 1
	Modified
	Deleted
)

// Event is one change seen by a watcher.
type Event[T model.Object] struct {
	Type   EventType
	Object T
}

type watcher[T model.Object] struct {
	namespace string
	sel       Selector
	ch        chan Event[T]
}

// Watch returns the current matching resources and a channel of every later
// change to them. The channel closes when ctx ends or when the watcher falls
// WatchBuffer events behind; the caller then lists and watches again.
func (c *Collection[T]) Watch(ctx context.Context, namespace string, sel Selector) ([]T, <-chan Event[T]) {
	w := &watcher[T]{namespace: namespace, sel: sel, ch: make(chan Event[T], WatchBuffer)}
	c.r.mu.Lock()
	initial := c.list(namespace, sel)
	c.watchers[w] = struct{}{}
	c.r.mu.Unlock()
	go func() {
		<-ctx.Done()
		c.r.mu.Lock()
		c.stopWatcher(w)
		c.r.mu.Unlock()
	}()
	return initial, w.ch
}

func (c *Collection[T]) stopWatcher(w *watcher[T]) {
	if _, ok := c.watchers[w]; ok {
		delete(c.watchers, w)
		close(w.ch)
	}
}

// notify tells the watchers; called with the registry's lock held.
func (c *Collection[T]) notify(typ EventType, obj T) {
	for w := range c.watchers {
		if !matches(obj, w.namespace, w.sel) {
			continue
		}
		select {
		case w.ch <- Event[T]{Type: typ, Object: obj}:
		default:
			c.stopWatcher(w)
		}
	}
}
