package datapath

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/knftables"
)

// A full sync makes each family's table hold exactly a whole state,
// whatever it held before, by a generation switch (see switchGeneration):
// the state is worked out service by service and each element goes to the
// kernel as soon as it is known, while the table is being prepared and
// the kernel commits the elements before it. Only the frontends wait: the
// sets of their picks, and the session-affinity chains their verdicts go
// to, exist once the whole state is known.

// desired is a whole state as elements and objects, per family.
type desired struct {
	live    map[elemID]liveElement
	owned   map[ServiceKey][]ownedObject
	objects map[*family][]ownedObject
	picks   map[*family]map[pick]int // picks, with the frontends of each
	counts  map[*family]int          // elements, per family
}

// elements yields f's elements, made again from the live ones.
func (w *desired) elements(f *family) iter.Seq[element] {
	return func(yield func(element) bool) {
		for id, le := range w.live {
			if id.fam == f.index && !yield(element{elemID: id, value: le.value, pick: le.pick}) {
				return
			}
		}
	}
}

// desire works out the whole state, handing each element to emit (if not
// nil) the first time it comes.
func (d *Datapath) desire(state NodeState, emit func(element)) *desired {
	// Sized for the usual dozen elements a service contributes.
	w := &desired{
		live:    make(map[elemID]liveElement, 12*len(state.Services)),
		owned:   map[ServiceKey][]ownedObject{},
		objects: map[*family][]ownedObject{},
		picks:   map[*family]map[pick]int{},
		counts:  map[*family]int{},
	}
	for _, f := range d.families() {
		w.picks[f] = map[pick]int{}
	}
	collect := func(es []element) {
		for _, e := range es {
			if le, ok := w.live[e.elemID]; ok {
				le.refs++
				w.live[e.elemID] = le
				continue
			}
			w.live[e.elemID] = liveElement{value: e.value, pick: e.pick, refs: 1}
			f := e.family()
			w.counts[f]++
			if e.pick.exists() && w.picks[f] != nil {
				w.picks[f][e.pick]++
			}
			if emit != nil {
				emit(e)
			}
		}
	}
	collect(nodeElements(state.Node, d.cfg))
	var c contribution
	for key, svc := range state.Services {
		c.elems, c.owned = c.elems[:0], nil
		c.addServiceFamilies(svc, state.Node, d.cfg.MasqueradeMark)
		collect(c.elems)
		if len(c.owned) > 0 {
			w.owned[key] = c.owned
			for _, o := range c.owned {
				w.objects[o.family] = append(w.objects[o.family], o)
			}
		}
	}
	return w
}

// fullSync makes each family's table hold exactly state, whatever it held
// before: an older agent's generation, an older layout, a half-finished
// sync, foreign or damaged objects. The families go in parallel, each on
// its own; the state counts as applied only when both succeed.
func (d *Datapath) fullSync(ctx context.Context, state NodeState) error {
	d.needFull = true
	// What the last state was is not needed for a whole one: let it go
	// before the new one takes the same memory again.
	d.live, d.owned = nil, nil
	fams := d.families()
	streams := make([]*stream, len(families))
	for _, f := range fams {
		if !d.tables[f].rebuild {
			streams[f.index] = d.startSwitch(ctx, f)
		}
	}
	start := time.Now()
	w := d.desire(state, func(e element) {
		if s := streams[e.fam]; s != nil {
			s.add(e)
		}
	})
	d.cfg.Log.Debug("whole state worked out", "services", len(state.Services), "elements", len(w.live), "took", time.Since(start))
	errs := make([]error, len(fams))
	var wg sync.WaitGroup
	for i, f := range fams {
		wg.Go(func() { errs[i] = d.syncFamily(ctx, f, w, streams[f.index]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.needFull = false
	d.live, d.owned = w.live, w.owned
	d.node, d.services = state.Node, maps.Clone(state.Services)
	// Only after the rules are in: a flow cleared earlier could be
	// re-created on the old path.
	d.clearNotDNATedUDP(ctx)
	return nil
}

// syncFamily is one family's full sync: the generation switch s started,
// or when that fails (or failed last time) a rebuild. It records the
// outcome in the family's tableState.
func (d *Datapath) syncFamily(ctx context.Context, f *family, w *desired, s *stream) error {
	t := d.tables[f]
	var err error
	if s != nil {
		err = d.switchGeneration(ctx, f, w, s)
	}
	if s == nil || (err != nil && ctx.Err() == nil) {
		// The table holds something the switch could not get past
		// (errTableUnknown, an object in the way): replace it whole.
		if err != nil {
			d.cfg.Log.Warn("generation switch failed; replacing the table", "family", f.String(), "error", err)
		}
		err = d.rebuild(ctx, f, w)
	}
	if err != nil {
		t.known = false
		t.rebuild = ctx.Err() == nil
		return err
	}
	t.known, t.rebuild, t.picks = true, false, w.picks[f]
	return nil
}

// stream loads the elements of a family's whole state into the generation
// the table's chains do not use, as they are worked out: startSwitch
// prepares the generation, and loads each batch the full sync adds while
// the next is worked out. A frontend waits in held for the sets of the
// picks, known only at the end.
type stream struct {
	f       *family
	batch   []element
	size    int
	batches chan []element
	held    []element
	done    chan struct{}
	// Set before done closes.
	started          time.Time
	listed, prepared time.Duration
	existing         tableObjects
	next             generation
	rest             []element // interval sets', for nft
	err              error
}

// add hands the stream one element: the full sync's goroutine alone calls it.
func (s *stream) add(e element) {
	if e.frontend() {
		s.held = append(s.held, e)
		return
	}
	if s.batch = append(s.batch, e); len(s.batch) == s.size {
		s.batches <- s.batch
		s.batch = make([]element, 0, s.size)
	}
}

// finish sends the last batch and waits until every batch is loaded.
func (s *stream) finish() {
	if len(s.batch) > 0 {
		s.batches <- s.batch
		s.batch = nil
	}
	close(s.batches)
	<-s.done
}

// startSwitch starts the generation switch of f's table: its first steps
// run while the elements come (see switchGeneration).
func (d *Datapath) startSwitch(ctx context.Context, f *family) *stream {
	s := &stream{f: f, size: d.chunk, batches: make(chan []element, 2), done: make(chan struct{}), started: time.Now()}
	if d.elements != nil {
		s.size = loadBatch
	}
	s.batch = make([]element, 0, s.size)
	go func() {
		defer close(s.done)
		s.existing, s.err = d.existingObjects(ctx, f)
		s.listed = time.Since(s.started)
		if s.err == nil {
			s.next = d.tables[f].gen.other()
			s.err = d.prepare(ctx, f, s.next)
		}
		s.prepared = time.Since(s.started)
		var mu sync.Mutex
		var wg sync.WaitGroup
		loaders := 1
		if d.elements == nil {
			loaders = len(d.nft[f])
		}
		for i := range loaders {
			wg.Go(func() {
				for batch := range s.batches {
					mu.Lock()
					failed := s.err != nil
					mu.Unlock()
					if failed {
						continue // taken, so that the full sync never waits
					}
					rest, err := d.loadBatch(ctx, f, s.next, batch, i)
					mu.Lock()
					s.rest = append(s.rest, rest...)
					s.err = cmp.Or(s.err, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}()
	return s
}

// frontend: the element is in a kind's frontends, as a member of its
// pick's set or as a session-affinity verdict.
func (id elemID) frontend() bool {
	for _, k := range frontendKinds {
		if k.frontendsSet == id.set {
			return true
		}
	}
	return false
}

// prepare is the switch's first transaction: the table, generation g's
// empty sets and maps, and any missing chain.
func (d *Datapath) prepare(ctx context.Context, f *family, g generation) error {
	tx := d.nft[f][0].NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules for Kubernetes-style services, owned by weir-agent")})
	for _, obj := range tableSets(*f, g) {
		// Fresh, even if a failed sync left one behind.
		tx.Add(obj)
		tx.Delete(obj)
		tx.Add(obj)
	}
	for _, c := range flowCounters(d.cfg) {
		tx.Add(c) // an existing counter keeps its count
	}
	for _, c := range tableChains(*f, d.cfg, g, nil) {
		tx.Add(c.chain)
		if c.base() {
			// Base chains only jump to fixed chains: rewriting them
			// here changes nothing for packets.
			writeChain(tx, c, g)
		}
	}
	return d.run(ctx, f, tx)
}

// switchGeneration loads w into the generation the table's chains do not
// use, while that one keeps forwarding, and switches over:
//  1. one transaction creates the table, the new generation's empty sets
//     and maps, and any missing chain (s, while the state is worked out);
//  2. the elements load as they come, in batches (s);
//  3. once the whole state is known, one transaction creates the picks'
//     sets and the services' own objects, with the interval sets' few
//     elements, and the frontends load;
//  4. one transaction points every chain at the new generation and empties
//     every chain that is not Weir's now;
//  5. a last transaction deletes the old generation and whatever else is
//     not Weir's now: objects that are no longer referenced only after the
//     switch, as kube-proxy deletes stale chains a sync after flushing them.
//
// A failure before step 4 leaves the old generation forwarding; a failure
// of step 5 leaves forwarding right and only litter, retried later.
func (d *Datapath) switchGeneration(ctx context.Context, f *family, w *desired, s *stream) error {
	s.finish()
	if s.err != nil {
		return s.err
	}
	loaded := time.Since(s.started)
	t := d.tables[f]
	next, existing, picks := s.next, s.existing, w.picks[f]

	// 3. The picks and the services' own objects.
	tx := d.nft[f][0].NewTransaction()
	for p := range picks {
		obj := p.object(*f, next)
		tx.Add(obj)
		tx.Delete(obj)
		tx.Add(obj)
	}
	if c := planOwned(nil, w.objects[f])[f]; c != nil {
		c.render(tx)
	}
	for _, e := range s.rest {
		tx.Add(e.object(next))
	}
	if err := d.run(ctx, f, tx); err != nil {
		return err
	}
	for batch := range slices.Chunk(s.held, s.size) {
		rest, err := d.loadBatch(ctx, f, next, batch, 0)
		if err == nil && len(rest) > 0 {
			err = fmt.Errorf("%d frontends could not be loaded", len(rest))
		}
		if err != nil {
			return err
		}
	}
	frontends := time.Since(s.started)

	// 4. Switch.
	tx = d.nft[f][0].NewTransaction()
	keep := map[string]bool{}
	for _, c := range tableChains(*f, d.cfg, next, picks) {
		keep[c.chain.Name] = true
		if !c.base() {
			writeChain(tx, c, next)
		}
	}
	for _, obj := range tableSets(*f, next) {
		keep[setName(obj)] = true
	}
	for p := range picks {
		keep[next.of(p.set())] = true
	}
	for _, o := range w.objects[f] {
		keep[o.name] = true
	}
	tx.Add(&knftables.Chain{Name: next.marker()})
	keep[next.marker()] = true
	if slices.Contains(existing.chains, next.other().marker()) {
		tx.Delete(&knftables.Chain{Name: next.other().marker()})
		existing.chains = slices.DeleteFunc(existing.chains, func(c string) bool { return c == next.other().marker() })
	}
	// Emptied now, so that nothing they hold refers to what goes next.
	for _, name := range existing.chains {
		if !keep[name] {
			tx.Flush(&knftables.Chain{Name: name})
		}
	}
	if err := d.nft[f][0].Run(ctx, tx); err != nil {
		return fmt.Errorf("programming %s table %q: %w", f, TableName, err)
	}
	t.gen = next
	switched := time.Since(s.started)

	// 5. Delete: maps first (an older layout's verdict maps jump to
	// chains that may go), then sets, then chains. Anonymous sets and
	// maps ("__map0") belong to rules and go with them.
	var gone []knftables.Object
	for _, name := range existing.maps {
		if !keep[name] && !strings.HasPrefix(name, "__") {
			gone = append(gone, &knftables.Map{Name: name})
		}
	}
	for _, name := range existing.sets {
		if !keep[name] && !strings.HasPrefix(name, "__") {
			gone = append(gone, &knftables.Set{Name: name})
		}
	}
	for _, name := range existing.chains {
		if !keep[name] {
			gone = append(gone, &knftables.Chain{Name: name})
		}
	}
	d.deleteObjects(ctx, f, gone)
	d.cfg.Log.Debug("generation switched", "family", f.String(), "generation", string(next), "elements", w.counts[f],
		"listed", s.listed, "prepared", s.prepared, "loaded", loaded, "frontends", frontends, "switched", switched,
		"deleted", time.Since(s.started))
	return nil
}

// deleteObjects deletes what the table no longer needs, in one transaction
// (over the element writer's socket when there is one) or, when that
// fails, one by one through nft: an object something unexpected still
// refers to stays, logged, and the table is listed again at the next full
// sync. Forwarding is right either way.
func (d *Datapath) deleteObjects(ctx context.Context, f *family, objs []knftables.Object) {
	if len(objs) == 0 {
		return
	}
	if d.elements != nil {
		if ok, err := d.elements.deleteObjects(f, objs); ok && err == nil {
			return
		}
	}
	nft := d.nft[f][0]
	tx := nft.NewTransaction()
	for _, o := range objs {
		tx.Delete(o)
	}
	if nft.Run(ctx, tx) == nil {
		return
	}
	for _, o := range objs {
		tx := nft.NewTransaction()
		tx.Delete(o)
		if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
			d.cfg.Log.Warn("a stale object of the table could not be deleted; retried at the next full sync",
				"family", f.String(), "object", fmt.Sprintf("%T %s", o, objectName(o)), "error", err)
			d.tables[f].known = false
		}
	}
}

// rebuild replaces the family's table in one transaction: delete it with
// everything in it, create it with w. Atomic for packets (and conntrack
// keeps every established flow), but nft parses the whole state at once,
// so it is the way out of a table the generation switch could not handle,
// not the usual way.
func (d *Datapath) rebuild(ctx context.Context, f *family, w *desired) error {
	const g = genA
	nft := d.nft[f][0]
	tx := nft.NewTransaction()
	table := &knftables.Table{Comment: knftables.PtrTo("rules for Kubernetes-style services, owned by weir-agent")}
	tx.Add(table)
	tx.Delete(table)
	tx.Add(table)
	for _, obj := range tableSets(*f, g) {
		tx.Add(obj)
	}
	for p := range w.picks[f] {
		tx.Add(p.object(*f, g))
	}
	for _, c := range flowCounters(d.cfg) {
		tx.Add(c)
	}
	chains := tableChains(*f, d.cfg, g, w.picks[f])
	for _, c := range chains {
		tx.Add(c.chain)
	}
	tx.Add(&knftables.Chain{Name: g.marker()})
	if c := planOwned(nil, w.objects[f])[f]; c != nil {
		c.render(tx)
	}
	for _, c := range chains {
		writeChain(tx, c, g)
	}
	for e := range w.elements(f) {
		tx.Add(e.object(g))
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("replacing %s table %q: %w", f, TableName, err)
	}
	d.tables[f].gen = g
	return nil
}

// writeChain (re)writes a fixed chain's rules. The rules of the chains
// that read a generation carry its name as their comment, for whoever
// reads the ruleset.
func writeChain(tx *knftables.Transaction, c chainSpec, g generation) {
	tx.Flush(c.chain)
	for _, r := range c.rules {
		rule := &knftables.Rule{Chain: c.chain.Name, Rule: r}
		if !c.base() {
			rule.Comment = knftables.PtrTo(g.comment())
		}
		tx.Add(rule)
	}
}

// tableObjects names what a family's table holds.
type tableObjects struct{ chains, sets, maps []string }

// existingObjects names what the family's table holds: listed while the
// table is not known (an older agent, an older layout or someone else may
// have left anything), from memory otherwise.
func (d *Datapath) existingObjects(ctx context.Context, f *family) (tableObjects, error) {
	t := d.tables[f]
	if !t.known {
		return d.listObjects(ctx, f)
	}
	objs := tableObjects{chains: []string{t.gen.marker()}}
	for _, c := range tableChains(*f, d.cfg, t.gen, nil) {
		objs.chains = append(objs.chains, c.chain.Name)
	}
	for p := range t.picks {
		objs.sets = append(objs.sets, t.gen.of(p.set()))
	}
	for _, obj := range tableSets(*f, t.gen) {
		if m, ok := obj.(*knftables.Map); ok {
			objs.maps = append(objs.maps, m.Name)
		} else {
			objs.sets = append(objs.sets, setName(obj))
		}
	}
	for _, os := range d.owned {
		for _, o := range os {
			switch {
			case o.family != f:
			case o.set != nil:
				objs.sets = append(objs.sets, o.name)
			default:
				objs.chains = append(objs.chains, o.name)
			}
		}
	}
	return objs, nil
}

// listObjects lists the names of the family's objects (never their
// contents, which is what makes a listing slow) and learns from them which
// generation forwards, into the family's tableState, or fails with
// errTableUnknown.
func (d *Datapath) listObjects(ctx context.Context, f *family) (tableObjects, error) {
	var objs tableObjects
	for _, l := range []struct {
		kind string
		into *[]string
	}{{"chain", &objs.chains}, {"set", &objs.sets}, {"map", &objs.maps}} {
		names, err := d.lister[f].List(ctx, l.kind)
		if err != nil && !knftables.IsNotFound(err) {
			return objs, fmt.Errorf("listing %s %ss: %w", f, l.kind, err)
		}
		*l.into = names
		if len(objs.chains) == 0 {
			// No chains: no table of ours (Weir's always has chains),
			// and the netlink lister fails on sets of a missing table.
			break
		}
	}
	t := d.tables[f]
	if len(objs.chains) == 0 {
		t.gen = genB // nothing forwards: load generation a
		return objs, nil
	}
	g := liveGeneration(objs.chains)
	if g == "" {
		return objs, errTableUnknown
	}
	t.gen = g
	return objs, nil
}

// errTableUnknown: the table has no single generation marker (an older
// agent's table, or one someone changed), so the switch cannot tell which
// generation to leave alone; the table is rebuilt instead.
var errTableUnknown = errors.New("the table names no live generation")

// liveGeneration is the generation whose marker chain is among chains, or
// "" when neither or both are.
func liveGeneration(chains []string) generation {
	a, b := slices.Contains(chains, genA.marker()), slices.Contains(chains, genB.marker())
	switch {
	case a && !b:
		return genA
	case b && !a:
		return genB
	}
	return ""
}

func setName(obj knftables.Object) string {
	switch o := obj.(type) {
	case *knftables.Set:
		return o.Name
	case *knftables.Map:
		return o.Name
	}
	return ""
}

func objectName(obj knftables.Object) string {
	if c, ok := obj.(*knftables.Chain); ok {
		return c.Name
	}
	return setName(obj)
}

// loadBatch adds elements to generation g of f's table: over the element
// writer's netlink socket when the Datapath has one, else through nft, on
// the family's i-th interface, so that several nft processes may parse at
// once. It returns the elements the socket cannot write (the interval
// sets'), for nft.
func (d *Datapath) loadBatch(ctx context.Context, f *family, g generation, elems []element, i int) (rest []element, err error) {
	if d.elements != nil {
		rest, ok, err := d.elements.load(f, g, elems)
		if err != nil {
			return nil, fmt.Errorf("loading %s table %q: %w", f, TableName, err)
		}
		if ok {
			return rest, nil
		}
	}
	nft := d.nft[f][i%len(d.nft[f])]
	tx := nft.NewTransaction()
	for _, e := range elems {
		tx.Add(e.object(g))
	}
	if err := nft.Run(ctx, tx); err != nil {
		return nil, fmt.Errorf("loading %s table %q: %w", f, TableName, err)
	}
	return nil, nil
}

// run commits one family's transaction, atomically.
func (d *Datapath) run(ctx context.Context, f *family, tx *knftables.Transaction) error {
	if err := d.nft[f][0].Run(ctx, tx); err != nil {
		return fmt.Errorf("programming %s table %q: %w", f, TableName, err)
	}
	return nil
}
