package registry

import (
	"fmt"

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
// in the store.
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
	rev, err := r.write(func() (*pending, error) {
		done, err := r.stageAll(objs, spec)
		if err != nil {
			return nil, err
		}
		out = make([]Applied, len(done))
		for i, s := range done {
			out[i] = Applied{Object: s.obj, Created: s.old == nil, Old: s.old}
		}
		// Out of memory again until the store holds them.
		defer unstage(done)
		if dryRun || len(done) == 0 {
			return nil, nil
		}
		ops := make([]store.Op, len(done))
		for i, s := range done {
			b, err := r.encode(s.obj)
			if err != nil {
				return nil, &BatchError{Index: i, Err: err}
			}
			ops[i] = store.Op{Kind: s.kind, Key: s.key, Value: b}
		}
		return &pending{ops: ops, what: fmt.Sprintf("%d resources", len(ops)), publish: func(rev uint64, readBack bool) {
			stamp := func() {
				for _, a := range out {
					a.Object.GetMeta().ResourceVersion = rev
				}
			}
			if readBack {
				stamp()
				return
			}
			// The registry is as it was when they were checked (with the
			// versions they were checked at): staging them again cannot
			// fail.
			again, err := r.stageAll(objs, spec)
			if err != nil {
				panic(fmt.Sprintf("registry: a batch refused when published at revision %d: %v", rev, err))
			}
			for i, s := range again {
				out[i].Object = s.obj // what a rule kept is a copy: the one now stored
			}
			// At their new version before anyone is told: a watch event
			// carries the object itself.
			stamp()
			ch := Change{Revision: rev}
			for _, s := range again {
				r.touched(s.obj, s.old, &ch)
				s.notify()
			}
			r.notifyListeners(ch)
		}}, nil
	})
	return rev, out, err
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
