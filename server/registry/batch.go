package registry

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
)

// BatchError says which object of a batch was refused.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string { return e.Err.Error() }
func (e *BatchError) Unwrap() error { return e.Err }

// Applied is what a batch did to one object.
type Applied struct {
	Object  model.Object
	Created bool
	// Old is the object the batch replaced; nil when it created it.
	Old model.Object
}

// staged is one object of a batch, in the registry's memory but not yet
// in the store; obj is nil for a removal.
type staged struct {
	kind, key string
	obj, old  model.Object
	undo      func()
	notify    func()
}

// Apply creates or replaces every object (each in its collection, by key)
// as one write: one store transaction and one revision, so that no reader,
// agent or restart ever sees some of them without the others. Each is
// checked as Create or Update would check it, against the registry with
// the objects before it in place, so two objects that conflict with each
// other are refused too. Any refusal, or a failed commit, leaves the
// registry as it was. With dryRun nothing is written.
func (r *Registry) Apply(objs []model.Object, dryRun bool) (uint64, []Applied, error) {
	return r.apply(objs, dryRun, false)
}

// ApplySpec is Apply by a writer of the specs alone (the native API):
// each object replacing one keeps what its collection's rule keeps, as
// UpdateSpec.
func (r *Registry) ApplySpec(objs []model.Object, dryRun bool) (uint64, []Applied, error) {
	return r.apply(objs, dryRun, true)
}

func (r *Registry) apply(objs []model.Object, dryRun, spec bool) (uint64, []Applied, error) {
	var out []Applied
	rev, err := r.writeStaged(dryRun, func() ([]staged, error) { return r.stageAll(objs, spec) }, func(done []staged) {
		out = make([]Applied, len(done))
		for i, s := range done {
			out[i] = Applied{Object: s.obj, Created: s.old == nil, Old: s.old}
		}
	})
	return rev, out, err
}

// Declare makes the address pools and BGP peers that source owns exactly
// pools and peers, as one write (see Apply): it creates what is new,
// replaces what changed, leaves what did not and removes the source's
// others, or, when any of them is refused (BatchError counts pools, then
// peers), does nothing at all. A source that declares its whole content
// (the resources file) is then never half-applied.
func (r *Registry) Declare(source string, pools []*model.AddressPool, peers []*model.BGPPeer) (uint64, error) {
	for _, p := range pools {
		p.Source = source
	}
	for _, p := range peers {
		p.Source = source
	}
	return r.writeStaged(false, func() ([]staged, error) {
		// Removals first: what leaves frees its addresses for what comes.
		done := append(stageRemovals(r.Pools, source, pools), stageRemovals(r.Peers, source, peers)...)
		more, err := stageChanged(r.Pools, pools, 0)
		if err == nil {
			done = append(done, more...)
			more, err = stageChanged(r.Peers, peers, len(pools))
		}
		if err != nil {
			unstage(done)
			return nil, err
		}
		return append(done, more...), nil
	}, func([]staged) {})
}

// stageRemovals stages the removal of the objects source owns in c that
// want does not name.
func stageRemovals[T model.Object](c *Collection[T], source string, want []T) []staged {
	named := map[string]bool{}
	for _, o := range want {
		named[o.GetMeta().Key()] = true
	}
	var done []staged
	for _, old := range c.list("", nil) {
		if m := old.GetMeta(); m.Source == source && !named[m.Key()] {
			done = append(done, stageRemoval(c, m.Key()))
		}
	}
	return done
}

// stageChanged stages the objects that differ from those stored (first is
// the first one's index, for a BatchError), or none.
func stageChanged[T model.Object](c *Collection[T], objs []T, first int) ([]staged, error) {
	var done []staged
	for i, obj := range objs {
		if old, ok := c.items[obj.GetMeta().Key()]; ok && sameContent(old, obj) {
			continue
		}
		s, err := stage(c, obj, false)
		if err != nil {
			unstage(done)
			return nil, &BatchError{Index: first + i, Err: err}
		}
		done = append(done, s)
	}
	return done, nil
}

// sameContent compares two objects without their bookkeeping (version,
// creation time), so that a source declaring what the registry holds
// writes nothing. Stored objects are shared: it compares their JSON and
// changes neither.
func sameContent(a, b model.Object) bool {
	strip := func(o model.Object) map[string]any {
		var m map[string]any
		j, _ := json.Marshal(o)
		json.Unmarshal(j, &m)
		delete(m, "resourceVersion")
		delete(m, "createTime")
		return m
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// writeStaged makes what stageAll stages (in memory, checked; a nil
// object is a removal) one write: one store transaction and one revision.
// seen is told what was staged when the write is decided, and again when
// it is published, with the objects then stored. Any refusal, or a failed
// commit, leaves the registry as it was. With dryRun nothing is written.
func (r *Registry) writeStaged(dryRun bool, stageAll func() ([]staged, error), seen func([]staged)) (uint64, error) {
	return r.write(func() (*pending, error) {
		done, err := stageAll()
		if err != nil {
			return nil, err
		}
		seen(done)
		// Out of memory again until the store holds them.
		defer unstage(done)
		if dryRun || len(done) == 0 {
			return nil, nil
		}
		ops := make([]store.Op, len(done))
		for i, s := range done {
			ops[i] = store.Op{Kind: s.kind, Key: s.key}
			if s.obj == nil {
				continue
			}
			if ops[i].Value, err = r.encode(s.obj); err != nil {
				return nil, &BatchError{Index: i, Err: err}
			}
		}
		return &pending{ops: ops, what: fmt.Sprintf("%d resources", len(ops)), publish: func(rev uint64, readBack bool) {
			stamp := func(ss []staged) {
				for _, s := range ss {
					if s.obj != nil {
						s.obj.GetMeta().ResourceVersion = rev
					}
				}
			}
			if readBack {
				stamp(done)
				return
			}
			// The registry is as it was when they were checked (with the
			// versions they were checked at): staging them again cannot
			// fail.
			again, err := stageAll()
			if err != nil {
				panic(fmt.Sprintf("registry: a batch refused when published at revision %d: %v", rev, err))
			}
			seen(again) // what a rule kept is a copy: the one now stored
			// At their new version before anyone is told: a watch event
			// carries the object itself.
			stamp(again)
			ch := Change{Revision: rev}
			for _, s := range again {
				r.touched(s.obj, s.old, &ch)
				s.notify()
			}
			r.notifyListeners(ch)
		}}, nil
	})
}

// stageAll stages every object in order, or none (BatchError names the
// one refused); spec: as writes of the spec alone (ApplySpec). Called
// with mu held.
func (r *Registry) stageAll(objs []model.Object, spec bool) ([]staged, error) {
	var done []staged
	for i, obj := range objs {
		var s staged
		var err error
		switch o := obj.(type) {
		case *model.Service:
			s, err = stage(r.Services, o, spec)
		case *model.EndpointSlice:
			s, err = stage(r.EndpointSlices, o, spec)
		case *model.Node:
			s, err = stage(r.Nodes, o, spec)
		case *model.AddressPool:
			s, err = stage(r.Pools, o, spec)
		case *model.BGPPeer:
			s, err = stage(r.Peers, o, spec)
		case *model.ServiceCIDR:
			s, err = stage(r.ServiceCIDRs, o, spec)
		default:
			err = fmt.Errorf("%T is not a resource", obj)
		}
		if err != nil {
			unstage(done)
			return nil, &BatchError{Index: i, Err: err}
		}
		done = append(done, s)
	}
	return done, nil
}

// unstage takes staged objects out again, last first.
func unstage(done []staged) {
	for i := len(done) - 1; i >= 0; i-- {
		done[i].undo()
	}
}

// stage checks obj as Create or Update (UpdateSpec when spec) would and
// puts it in place in memory (items and indexes), returning how to take
// it out again.
func stage[T model.Object](c *Collection[T], obj T, spec bool) (staged, error) {
	m := obj.GetMeta()
	if m.Source == "" {
		m.Source = model.SourceNative
	}
	key := m.Key()
	old, exists := c.items[key]
	if exists {
		var keep Keep[T]
		if spec {
			keep = c.specRule
		}
		var err error
		if obj, err = c.replacing(obj, old, keep); err != nil {
			return staged{}, err
		}
	} else {
		if m.ResourceVersion != 0 {
			return staged{}, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotFound)
		}
		if m.CreateTime.IsZero() {
			m.CreateTime = c.r.now().UTC()
		}
	}
	if err := c.check(obj); err != nil {
		return staged{}, err
	}
	// A batch takes no object's place: its writers (the native API, the
	// resources file) are refused what another holds.
	if c.displaced != nil {
		if gone := c.displaced(obj); len(gone) > 0 {
			return staged{}, fmt.Errorf("%s %s would take the place of %s: %w", c.kind, key, gone[0], ErrInUse)
		}
	}
	s := staged{kind: c.kind, key: key, obj: obj}
	var oldObj model.Object
	if exists {
		oldObj, s.old = old, old
	}
	c.items[key] = obj
	c.r.reindex(obj, oldObj)
	s.undo = func() {
		c.r.reindex(oldObj, obj)
		if exists {
			c.items[key] = old
		} else {
			delete(c.items, key)
		}
	}
	s.notify = func() {
		if exists {
			c.notify(Modified, obj)
		} else {
			c.notify(Added, obj)
		}
	}
	return s, nil
}

// stageRemoval takes the object of key out of c in memory (items and
// indexes), returning how to put it back.
func stageRemoval[T model.Object](c *Collection[T], key string) staged {
	old := c.items[key]
	delete(c.items, key)
	c.r.reindex(nil, old)
	return staged{kind: c.kind, key: key, old: old,
		undo:   func() { c.r.reindex(old, nil); c.items[key] = old },
		notify: func() { c.notify(Deleted, old) }}
}
