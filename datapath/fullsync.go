package datapath

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirlb/weir/datapath/internal/nfwire"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// A full sync makes each family's table hold exactly a whole state,
// whatever it held before, by a generation switch (see switchGeneration):
// the state is worked out service by service, and each batch of elements
// goes to the kernel as soon as it is known, while the next is worked out.
// Only a few frontends wait for the whole state (see stream).

// desired is a whole state as elements and objects, per family.
type desired struct {
	live    liveSet
	owned   map[ServiceKey][]ownedObject
	objects map[*family][]ownedObject
	picks   map[*family]map[pick]int // picks, with the frontends of each
	counts  map[*family]int          // elements, per family
	// elementSums are the digests of what the node and each service
	// contribute (see digest), per family index.
	elementSums [2]sum128
}

// elements yields f's elements, made again from the live ones.
func (w *desired) elements(f *family) iter.Seq[element] {
	return func(yield func(element) bool) {
		for id, le := range w.live.all() {
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
		live:    newLiveSet(12 * len(state.Services)),
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
			w.elementSums[e.fam] = w.elementSums[e.fam].plus(elementDigest(e))
			if le, ok := w.live.get(e.elemID); ok {
				le.refs++
				w.live.put(e.elemID, le)
				continue
			}
			w.live.put(e.elemID, liveElement{value: e.value, pick: e.pick, refs: 1})
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
func (d *Datapath) fullSync(ctx context.Context, state NodeState, mayAdopt bool) error {
	d.needFull = true
	d.pending = nil
	// What the last state was is not needed for a whole one: let it go
	// before the new one takes the same memory again.
	d.live, d.owned = liveSet{}, nil
	fams := d.families()
	var adopted map[*family]bool
	if mayAdopt {
		if adopted = d.adoptTables(state); len(adopted) == len(fams) {
			d.adoptedWhole(state)
			return nil
		}
	}
	streams := make([]*stream, len(families))
	for _, f := range fams {
		if !d.tables[f].rebuild && !adopted[f] {
			streams[f.index] = d.startSwitch(ctx, f)
		}
	}
	start := time.Now()
	w := d.desire(state, func(e element) {
		if s := streams[e.fam]; s != nil {
			s.add(e)
		}
	})
	d.cfg.Log.Debug("whole state worked out", "services", len(state.Services), "elements", w.live.len(), "took", time.Since(start))
	errs := make([]error, len(fams))
	cleanups := make([]func(), len(fams))
	var wg sync.WaitGroup
	for i, f := range fams {
		if adopted[f] {
			d.tables[f].picks = w.picks[f]
			if w.digest(f, d.cfg) != d.tables[f].digest {
				errs[i] = fmt.Errorf("the %s table adopted disagrees with the state's bookkeeping; switched at the next apply", f)
				d.tables[f].known = false
			}
			continue
		}
		wg.Go(func() { cleanups[i], errs[i] = d.syncFamily(ctx, f, w, streams[f.index]) })
	}
	wg.Wait()
	deleteUnused := func() {
		for _, c := range cleanups {
			if c != nil {
				c()
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		deleteUnused()
		return err
	}
	d.needFull = false
	d.live, d.owned = w.live, w.owned
	d.node, d.services = state.Node, maps.Clone(state.Services)
	// Only after the rules are in, since a flow cleared earlier could be
	// re-created on the old path; beside the deletion, which the listing
	// does not wait for (a socket that stays open). Clearing runs the
	// conntrack program, whose exit waits for the kernel to free what was
	// deleted: only when a flow bypassed the rules.
	wg.Go(func() { d.clearNotDNATedUDP(ctx) })
	deleteUnused()
	wg.Wait()
	return nil
}

// syncFamily is one family's full sync: the generation switch s started,
// or when that fails (or failed last time) a rebuild. It records the
// outcome in the family's tableState, and returns what deletes the objects
// a switch left unused, to call once the rest is done.
func (d *Datapath) syncFamily(ctx context.Context, f *family, w *desired, s *stream) (cleanup func(), err error) {
	t := d.tables[f]
	if s != nil {
		cleanup, err = d.switchGeneration(ctx, f, w, s)
	}
	if s == nil || (err != nil && ctx.Err() == nil) {
		// The table holds something the switch could not get past
		// (errTableUnknown, an object in the way): replace it whole.
		if err != nil {
			d.cfg.Log.Warn("generation switch failed; replacing the table", "family", f.String(), "error", err)
		}
		cleanup, err = nil, d.rebuild(ctx, f, w)
	}
	if err != nil {
		t.known = false
		t.rebuild = ctx.Err() == nil
		return nil, err
	}
	t.known, t.rebuild, t.picks, t.adopted = true, false, w.picks[f], false
	return cleanup, nil
}

// stream loads the elements of a family's whole state into the generation
// the table's chains do not use, as they are worked out. The full sync's
// goroutine adds elements and, for the element writer, lays each batch out
// as netlink messages; the stream's loader lists the table, prepares the
// generation with the first batch, and commits each batch while the next
// is worked out.
//
// A frontend goes in its pick's set, which must exist first: the picks the
// first batch names are created with the generation (most states have
// few endpoint counts, all met early); the frontends of a pick met later,
// and session-affinity verdicts (whose chains come with the whole state),
// wait in held for the end (see switchGeneration).
type stream struct {
	f       *family
	netlink bool // batches are laid out for the element writer
	size    int
	batch   []element
	batches chan streamBatch
	sent    bool          // the first batch went
	picks   map[pick]bool // the first batch's picks
	held    []element
	// The interval sets' elements, which nft writes: those met before
	// the first batch went (which the preparing transaction writes), and
	// after.
	intervals, rest []element

	failed atomic.Bool
	ready  chan struct{} // closed once next and existing are known
	done   chan struct{} // closed once every batch is loaded
	// preparation closes once the transaction that prepares the generation
	// (prepare: it empties and writes the pick chains) has run, or never
	// will: step 3's pick chains must come after it.
	preparation chan struct{}
	// Set by the loader.
	started          time.Time
	listed, prepared time.Duration
	existing         tableObjects
	next             generation
	err              error
}

// streamBatch is one batch of a stream: its elements as netlink messages
// (encoded) or, without an element writer, for nft. The first also names
// the picks and carries the interval sets' elements that the transaction
// preparing the generation creates.
type streamBatch struct {
	encoded   *nfwire.Batch
	elems     []element
	first     bool
	picks     []pick
	intervals []element
}

// add hands the stream one element: the full sync's goroutine alone calls it.
func (s *stream) add(e element) {
	if e.format().interval {
		if s.sent {
			s.rest = append(s.rest, e)
		} else {
			s.intervals = append(s.intervals, e)
		}
		return
	}
	if e.frontend() {
		if s.sent && !s.picks[e.pick] || !e.pick.exists() {
			s.held = append(s.held, e)
			return
		}
		s.picks[e.pick] = true
	}
	if s.batch = append(s.batch, e); len(s.batch) == s.size {
		s.send()
	}
}

// send hands the batch to the loader, laid out as messages for the element
// writer once the generation it goes in is known.
func (s *stream) send() {
	sb := streamBatch{first: !s.sent}
	if !s.sent {
		<-s.ready
		sb.picks = slices.Collect(maps.Keys(s.picks))
		sb.intervals = s.intervals
	}
	switch {
	case s.failed.Load():
		// Nothing is loaded any more; the family will be rebuilt.
		s.batch = s.batch[:0]
	case s.netlink:
		sb.encoded = pooledBatch()
		encodeElements(sb.encoded, unix.NFT_MSG_NEWSETELEM, s.f, s.next, s.batch)
		s.batch = s.batch[:0]
	default:
		sb.elems = s.batch
		s.batch = make([]element, 0, s.size)
	}
	s.sent = true
	s.batches <- sb
}

// close sends the last batch; s.done closes once every batch is loaded.
func (s *stream) close() {
	if len(s.batch) > 0 || !s.sent {
		s.send()
	}
	close(s.batches)
}

// startSwitch starts the generation switch of f's table: its first steps
// run while the elements come (see switchGeneration).
func (d *Datapath) startSwitch(ctx context.Context, f *family) *stream {
	s := &stream{f: f, netlink: d.elements != nil, size: d.chunk, picks: map[pick]bool{},
		ready: make(chan struct{}), done: make(chan struct{}), preparation: make(chan struct{}), started: time.Now()}
	preparedOnce := sync.OnceFunc(func() { close(s.preparation) })
	queued := 4
	if s.netlink {
		// Room for what is worked out while the generation is prepared.
		s.size, queued = loadBatch, 32
	}
	s.batch = make([]element, 0, s.size)
	s.batches = make(chan streamBatch, queued)
	go func() {
		defer close(s.done)
		defer preparedOnce()
		s.existing, s.err = d.existingObjects(ctx, f)
		s.listed = time.Since(s.started)
		s.next = d.tables[f].gen.other()
		s.failed.Store(s.err != nil)
		close(s.ready)
		fail := func(err error) {
			if err != nil && !s.failed.Swap(true) {
				s.err = err
			}
		}
		// Over netlink the sets come first, in a moment, and the rest
		// of the preparation (chains, rules, counters: nft's work) runs
		// beside the loads.
		var chains chan error
		first, ok := <-s.batches
		if ok && !s.failed.Load() {
			if s.netlink {
				fail(d.prepareSets(f, s.next, first.picks))
				if !s.failed.Load() {
					chains = make(chan error, 1)
					go func() {
						defer preparedOnce()
						chains <- d.prepare(ctx, f, s.next, first.picks, first.intervals, false)
					}()
				}
			} else {
				fail(d.prepare(ctx, f, s.next, first.picks, first.intervals, true))
				preparedOnce()
			}
			s.prepared = time.Since(s.started)
			if !s.failed.Load() {
				fail(d.loadBatch(ctx, f, s.next, first, 0))
			}
		}
		loaders := 1
		if !s.netlink {
			loaders = len(d.nft[f]) // several nft processes parse at once
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range loaders {
			wg.Go(func() {
				for sb := range s.batches {
					if s.failed.Load() {
						continue // taken, so that the full sync never waits
					}
					err := d.loadBatch(ctx, f, s.next, sb, i)
					mu.Lock()
					fail(err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if chains != nil {
			fail(<-chains)
		}
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

// tableComment says whose the table is.
const tableComment = "rules for Kubernetes-style services, owned by weir-agent"

// prepareSets is the switch's first transaction over netlink: the table,
// generation g's empty sets and maps with the sets of picks of the first
// batch, and its pick chains emptied, as prepare (withSets) would make
// them through nft.
func (d *Datapath) prepareSets(f *family, g generation, picks []pick) error {
	b := newBatch()
	b.NewTable(f.wire, tableComment)
	for _, k := range frontendKinds {
		// Emptied first: a failed sync may have left rules in them that
		// refer to the sets made afresh next.
		b.NewChain(f.wire, k.pickChain(g))
		b.FlushChain(f.wire, k.pickChain(g))
	}
	fresh := func(decl setDecl) error {
		s, err := decl.wire(g)
		if err != nil {
			return err
		}
		// Created, deleted, created: empty even if a failed sync left
		// one behind.
		b.NewSet(f.wire, s)
		b.DeleteSet(f.wire, s.Name)
		b.NewSet(f.wire, s)
		return nil
	}
	for _, decl := range declared[f.index] {
		if err := fresh(decl); err != nil {
			return err
		}
	}
	for _, p := range picks {
		if err := fresh(p.decl(*f)); err != nil {
			return err
		}
	}
	ok, err := d.elements.send(b)
	if !ok {
		err = errors.New("no netlink socket to nf_tables")
	}
	if err != nil {
		return fmt.Errorf("preparing %s table %q: %w", f, TableName, err)
	}
	return nil
}

// prepare is the switch's first transaction through nft: the table,
// generation g's empty sets and maps with the sets of picks (withSets, or
// made already by prepareSets), the interval sets' elements of the first
// batch, and any missing chain, with the generation's pick chains.
func (d *Datapath) prepare(ctx context.Context, f *family, g generation, picks []pick, intervals []element, withSets bool) error {
	tx := d.nft[f][0].NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
	first := map[pick]int{}
	for _, p := range picks {
		first[p] = 1
	}
	pcs := pickChains(*f, d.cfg.MasqueradeMark, g, first)
	for _, pc := range pcs {
		// Emptied first: a failed sync may have left rules in them that
		// refer to the sets made afresh next.
		tx.Add(pc.chain)
		tx.Flush(pc.chain)
	}
	if withSets {
		for _, obj := range tableSets(*f, g) {
			addFresh(tx, obj)
		}
		for _, p := range picks {
			addFresh(tx, p.object(*f, g))
		}
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
	// The generation's own pick chains, while its maps are empty.
	for _, pc := range pcs {
		writeChain(tx, pc, g)
	}
	for _, e := range intervals {
		tx.Add(e.object(g))
	}
	return d.run(ctx, f, tx)
}

// addFresh adds an empty set or map, even if a failed sync left one behind.
func addFresh(tx *knftables.Transaction, obj knftables.Object) {
	tx.Add(obj)
	tx.Delete(obj)
	tx.Add(obj)
}

// addObjects adds step 3 of switchGeneration to tx: what the generation
// needs once the whole state is known, besides the elements the stream
// loads.
func (d *Datapath) addObjects(tx *knftables.Transaction, f *family, w *desired, s *stream) {
	late := map[uint8]bool{} // kinds with picks the first batch did not name
	for p := range w.picks[f] {
		if !s.picks[p] {
			addFresh(tx, p.object(*f, s.next))
			late[p.kind] = true
		}
	}
	for i, pc := range pickChains(*f, d.cfg.MasqueradeMark, s.next, w.picks[f]) {
		if late[uint8(i+1)] {
			writeChain(tx, pc, s.next)
		}
	}
	if c := planOwned(nil, w.objects[f])[f]; c != nil {
		c.render(tx)
	}
	for _, e := range s.rest {
		tx.Add(e.object(s.next))
	}
}

// switchGeneration loads w into the generation the table's chains do not
// use, while that one keeps forwarding, and switches over:
//  1. the table and the new generation's empty sets and maps are created
//     (s, while the state is worked out): over netlink, when the elements
//     load over netlink, and the chains and their rules through nft while
//     they load; otherwise in one nft transaction;
//  2. the elements load as they come, in batches (s);
//  3. once the whole state is known, the picks' later sets and the
//     services' own objects are made, with the interval sets' few elements
//     (addObjects): while the last batches load when frontends wait for
//     them, which then load; otherwise in step 4's transaction;
//  4. one transaction points every chain at the new generation and empties
//     every chain that is not Weir's now;
//  5. a last transaction (the cleanup returned, which the full sync calls
//     last) deletes the old generation and whatever else is not Weir's
//     now: objects that are no longer referenced only after the switch,
//     as kube-proxy deletes stale chains a sync after flushing them.
//
// A failure before step 4 leaves the old generation forwarding; a failure
// of step 5 leaves forwarding right and only litter, retried later.
func (d *Datapath) switchGeneration(ctx context.Context, f *family, w *desired, s *stream) (cleanup func(), err error) {
	held := len(s.held) > 0
	if err := d.finishObjects(ctx, f, w, s, held); err != nil {
		return nil, err
	}
	loaded := time.Since(s.started)
	if err := d.loadHeld(ctx, f, s); err != nil {
		return nil, err
	}
	frontends := time.Since(s.started)
	keep, existing, err := d.switchChains(ctx, f, w, s, !held)
	if err != nil {
		return nil, err
	}
	switched := time.Since(s.started)
	gone := staleObjects(existing, keep)
	d.cfg.Log.Debug("generation switched", "family", f.String(), "generation", string(s.next), "elements", w.counts[f],
		"listed", s.listed, "prepared", s.prepared, "loaded", loaded, "frontends", frontends, "switched", switched)
	return func() {
		start := time.Now()
		d.deleteObjects(ctx, f, gone)
		d.cfg.Log.Debug("old generation deleted", "family", f.String(), "objects", len(gone), "took", time.Since(start))
	}, nil
}

// finishObjects is step 3 of switchGeneration: the picks met after the
// first batch, the services' own objects, the interval sets' later
// elements. When frontends wait (held), in a transaction of their own
// while the last batches load; otherwise in the switch's, one nft run
// fewer. It returns once every batch is loaded.
func (d *Datapath) finishObjects(ctx context.Context, f *family, w *desired, s *stream, held bool) error {
	s.close()
	objects := make(chan error, 1)
	if s.failed.Load() || !held {
		objects <- nil
	} else {
		go func() {
			tx := d.nft[f][0].NewTransaction()
			d.addObjects(tx, f, w, s)
			// The late picks' chains are written whole, after the
			// preparation emptied them and wrote the first picks'.
			<-s.preparation
			objects <- d.run(ctx, f, tx)
		}()
	}
	<-s.done
	err := <-objects
	if s.err != nil {
		return s.err
	}
	return err
}

// loadHeld loads the frontends that waited for their picks' sets.
func (d *Datapath) loadHeld(ctx context.Context, f *family, s *stream) error {
	for batch := range slices.Chunk(s.held, s.size) {
		sb := streamBatch{elems: batch}
		if s.netlink {
			sb.encoded = pooledBatch()
			if rest := encodeElements(sb.encoded, unix.NFT_MSG_NEWSETELEM, f, s.next, batch); len(rest) > 0 {
				return fmt.Errorf("%d frontends could not be laid out", len(rest))
			}
		}
		if err := d.loadBatch(ctx, f, s.next, sb, 0); err != nil {
			return err
		}
	}
	return nil
}

// switchChains is step 4 of switchGeneration: one transaction (with step
// 3's objects, withObjects) points every chain at the new generation and
// empties every chain that is not Weir's now. It returns the names Weir
// keeps, and what the table held besides the old marker.
func (d *Datapath) switchChains(ctx context.Context, f *family, w *desired, s *stream, withObjects bool) (keep map[string]bool, existing tableObjects, err error) {
	next, existing := s.next, s.existing
	tx := d.nft[f][0].NewTransaction()
	if withObjects {
		d.addObjects(tx, f, w, s)
	}
	keep = d.keptNames(tx, f, w, next)
	dg := w.digest(f, d.cfg)
	mark := markerOf(next, dg)
	tx.Add(&knftables.Chain{Name: mark})
	keep[mark] = true
	oldMarker := func(c string) bool { return c != mark && isMarker(c) }
	for _, c := range existing.chains {
		if oldMarker(c) {
			tx.Delete(&knftables.Chain{Name: c})
		}
	}
	existing.chains = slices.DeleteFunc(existing.chains, oldMarker)
	// Emptied now, so that nothing they hold refers to what goes next.
	for _, name := range existing.chains {
		if !keep[name] {
			tx.Flush(&knftables.Chain{Name: name})
		}
	}
	if err := d.nft[f][0].Run(ctx, tx); err != nil {
		return nil, existing, fmt.Errorf("programming %s table %q: %w", f, TableName, err)
	}
	t := d.tables[f]
	t.gen, t.marker, t.digest = next, mark, dg
	return keep, existing, nil
}

// keptNames are the chains, sets and maps of generation next with w, and
// the fixed chains, which it writes to tx (but the generation's pick
// chains, written when its maps were empty).
func (d *Datapath) keptNames(tx *knftables.Transaction, f *family, w *desired, next generation) map[string]bool {
	keep := map[string]bool{}
	written := map[string]bool{} // the generation's pick chains
	for _, k := range frontendKinds {
		written[k.pickChain(next)] = true
	}
	for _, c := range tableChains(*f, d.cfg, next, w.picks[f]) {
		keep[c.chain.Name] = true
		if !c.base() && !written[c.chain.Name] {
			writeChain(tx, c, next)
		}
	}
	for _, decl := range declared[f.index] {
		keep[next.of(decl.name)] = true
	}
	for p := range w.picks[f] {
		keep[next.of(p.set())] = true
	}
	for _, o := range w.objects[f] {
		keep[o.name] = true
	}
	return keep
}

// staleObjects is what step 5 of switchGeneration deletes: maps first (an
// older layout's verdict maps jump to chains that may go), then sets, then
// chains. Anonymous sets and maps ("__map0") belong to rules and go with
// them.
func staleObjects(existing tableObjects, keep map[string]bool) []knftables.Object {
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
	return gone
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
	table := &knftables.Table{Comment: knftables.PtrTo(tableComment)}
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
	dg := w.digest(f, d.cfg)
	tx.Add(&knftables.Chain{Name: markerOf(g, dg)})
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
	t := d.tables[f]
	t.gen, t.marker, t.digest = g, markerOf(g, dg), dg
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
	objs := tableObjects{chains: []string{t.marker}}
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
	if d.elements != nil {
		var ok bool
		var err error
		if objs, ok, err = d.elements.list(f); err != nil {
			return objs, err
		}
		if ok {
			return d.learnGeneration(f, objs)
		}
	}
	for _, l := range []struct {
		kind string
		into *[]string
	}{{"chain", &objs.chains}, {"set", &objs.sets}, {"map", &objs.maps}} {
		names, err := d.nft[f][0].List(ctx, l.kind)
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
	return d.learnGeneration(f, objs)
}

// learnGeneration learns from the names of the family's objects which
// generation forwards.
func (d *Datapath) learnGeneration(f *family, objs tableObjects) (tableObjects, error) {
	t := d.tables[f]
	if len(objs.chains) == 0 {
		t.gen = genB // nothing forwards: load generation a
		return objs, nil
	}
	m, ok := liveMarker(objs.chains)
	if !ok {
		return objs, errTableUnknown
	}
	t.gen = m.gen
	return objs, nil
}

// errTableUnknown: the table has no single generation marker (an older
// agent's table, or one someone changed), so the switch cannot tell which
// generation to leave alone; the table is rebuilt instead.
var errTableUnknown = errors.New("the table names no live generation")

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

// loadBatch loads a batch into generation g of f's table: its messages
// over the element writer's socket, or its elements through nft, on the
// family's i-th interface.
func (d *Datapath) loadBatch(ctx context.Context, f *family, g generation, sb streamBatch, i int) error {
	if sb.encoded != nil {
		ok, err := d.elements.send(sb.encoded)
		releaseBatch(sb.encoded)
		if !ok {
			err = errors.New("no netlink socket to nf_tables")
		}
		if err != nil {
			return fmt.Errorf("loading %s table %q: %w", f, TableName, err)
		}
		return nil
	}
	if len(sb.elems) == 0 {
		return nil
	}
	nft := d.nft[f][i%len(d.nft[f])]
	tx := nft.NewTransaction()
	for _, e := range sb.elems {
		tx.Add(e.object(g))
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("loading %s table %q: %w", f, TableName, err)
	}
	return nil
}

// run commits one family's transaction, atomically.
func (d *Datapath) run(ctx context.Context, f *family, tx *knftables.Transaction) error {
	if err := d.nft[f][0].Run(ctx, tx); err != nil {
		return fmt.Errorf("programming %s table %q: %w", f, TableName, err)
	}
	return nil
}
