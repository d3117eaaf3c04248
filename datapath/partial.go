package datapath

// A partial sync changes only what the changed services and node touch,
// in three steps: the bookkeeping of live elements (what each service
// contributes, counted per element) says what the touched elements were
// and are; a typed plan per family says what changes in the table; the
// plan is rendered once, to a netlink batch when it changes elements
// alone, else to one nft transaction.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"sigs.k8s.io/knftables"
)

// touched is what a partial sync changed in the datapath's bookkeeping:
// the touched elements as they were (nil: absent), the services replaced
// (as they were; nil: new), and the owned chains and sets before and after.
type touched struct {
	before             map[elemID]*liveElement
	replaced           map[ServiceKey]*Service
	oldOwned, newOwned []ownedObject
	// sums is how the contributions' digests changed, per family index.
	sums [2]sum128
}

// familyChange is one family's part of a partial sync, in the order its
// transaction makes it: element deletes (which empty the sets of picks
// that go), the picks that come and go (their sets, and the pick chains
// of their kinds rewritten), the owned chains and sets that change,
// element adds (which go into sets and refer to chains that come).
type familyChange struct {
	deletes           []element
	picksIn, picksOut []pick
	owned             ownedChange
	adds              []element
	// remark is the marker chain's new name, with the digest it carries,
	// when the table changes (see digest); "" otherwise.
	remark string
	digest digest
}

// elementsOnly: the change touches no chain or set, only elements.
func (c *familyChange) elementsOnly() bool {
	return len(c.picksIn) == 0 && len(c.picksOut) == 0 && c.owned.empty()
}

func (c *familyChange) empty() bool {
	return c.elementsOnly() && len(c.deletes) == 0 && len(c.adds) == 0 && c.remark == ""
}

func (d *Datapath) partialSync(ctx context.Context, state NodeState) error {
	t := d.track(state)
	if err := d.runPartial(ctx, d.planPartial(t)); err != nil {
		d.needFull = true
		d.forget()
		return err
	}
	// Our own copy, kept in step key by key: the caller may change its map
	// for the next Apply, and cloning it whole costs more than the change.
	d.node = state.Node
	for key := range t.replaced {
		if svc, ok := state.Services[key]; ok {
			d.services[key] = svc
		} else {
			delete(d.services, key)
		}
	}
	// Only after the new rules are in: a flow cleared earlier could be
	// re-created on the old path.
	if d.cfg.Conntrack != nil {
		for _, flow := range d.staleUDPFlows(t.before, t.replaced) {
			if err := d.cfg.Conntrack.ClearUDP(ctx, flow); err != nil {
				d.cfg.Log.Warn("stale UDP conntrack entries not cleared", "flow", flow.String(), "error", err)
			}
		}
	}
	return nil
}

// track brings the live elements and the owned objects to state, for the
// services that may have changed, and says what they were.
func (d *Datapath) track(state NodeState) touched {
	t := touched{before: map[elemID]*liveElement{}, replaced: map[ServiceKey]*Service{}}
	nodeChanged := !nodeInfoEqual(state.Node, d.node)
	if nodeChanged {
		d.change(&t, nodeElements(d.node, d.cfg), nodeElements(state.Node, d.cfg))
	}
	for _, key := range d.candidates(state, nodeChanged) {
		svc, now := state.Services[key]
		old, was := d.services[key]
		switch {
		case now && (nodeChanged || old != svc):
			d.changeService(&t, key, serviceContribution(svc, state.Node, d.cfg.MasqueradeMark))
			if old != svc {
				t.replaced[key] = old
			}
		case !now && was:
			d.changeService(&t, key, contribution{})
			t.replaced[key] = old
		}
	}
	return t
}

// candidates are the services that may have changed: those the caller
// names, or every one when the node changed (its zone and addresses shape
// every service's elements) or the caller names none.
func (d *Datapath) candidates(state NodeState, nodeChanged bool) []ServiceKey {
	candidates := state.Changed
	if nodeChanged || candidates == nil {
		candidates = slices.Collect(maps.Keys(state.Services))
		for key := range d.services {
			if _, ok := state.Services[key]; !ok {
				candidates = append(candidates, key)
			}
		}
	} else if len(candidates) > 1 {
		// A caller may name a service twice; it must change once.
		candidates = slices.Clone(candidates)
		slices.SortFunc(candidates, ServiceKey.Compare)
		candidates = slices.Compact(candidates)
	}
	return candidates
}

// changeService replaces what the service key contributes with c. A
// service's elements as they were are worked out again from the service
// as it was, rather than kept: they are most of what a Datapath would hold
// in memory.
func (d *Datapath) changeService(t *touched, key ServiceKey, c contribution) {
	var was []element
	if old := d.services[key]; old != nil {
		was = serviceContribution(old, d.node, d.cfg.MasqueradeMark).elems
	}
	d.change(t, was, c.elems)
	t.oldOwned = append(t.oldOwned, d.owned[key]...)
	t.newOwned = append(t.newOwned, c.owned...)
	if len(c.owned) > 0 {
		d.owned[key] = c.owned
	} else {
		delete(d.owned, key)
	}
}

// change replaces the live elements was with now, remembering in t what
// each was before.
func (d *Datapath) change(t *touched, was, now []element) {
	remember := func(id elemID) {
		if _, ok := t.before[id]; !ok {
			t.before[id] = d.liveAt(id)
		}
	}
	for _, e := range was {
		t.sums[e.fam] = t.sums[e.fam].minus(elementDigest(e))
		id := e.elemID
		remember(id)
		if le, _ := d.live.get(id); le.refs > 1 {
			le.refs--
			d.live.put(id, le)
		} else {
			d.live.remove(id)
		}
	}
	for _, e := range now {
		t.sums[e.fam] = t.sums[e.fam].plus(elementDigest(e))
		id := e.elemID
		remember(id)
		le, _ := d.live.get(id)
		if le.refs == 0 {
			le = liveElement{value: e.value, pick: e.pick}
		}
		le.refs++
		d.live.put(id, le)
	}
}

// planPartial is what changes in each family's table: the touched
// elements whose value changed, and the pick chains that gain their first
// reference or lose their last. It counts the pick chains' references
// as planned; a run that fails forgets them with everything else.
func (d *Datapath) planPartial(t touched) map[*family]*familyChange {
	plan := partialPlan{}
	picks := d.planElements(plan, t)
	d.planPicks(plan, picks)
	for f, c := range planOwned(t.oldOwned, t.newOwned) {
		plan.of(f).owned = *c
	}
	d.planDigests(plan, t)
	// Sorted, for transactions that read the same every time.
	for _, c := range plan {
		slices.SortFunc(c.deletes, func(a, b element) int { return compareIDs(a.elemID, b.elemID) })
		slices.SortFunc(c.adds, func(a, b element) int { return compareIDs(a.elemID, b.elemID) })
	}
	return plan
}

// planDigests works out each family's digest after the change, and
// plans the marker's new name where it changes.
func (d *Datapath) planDigests(plan partialPlan, t touched) {
	for _, f := range d.families() {
		tab, c := d.tables[f], plan[f]
		if c == nil {
			c = &familyChange{}
		}
		dg := tab.digest
		if len(c.picksIn)+len(c.picksOut) > 0 {
			dg.fixed = fixedDigest(*f, d.cfg, tab.picks)
		}
		for _, o := range t.oldOwned {
			if o.family == f {
				dg.owned = dg.owned.minus(ownedDigest(o))
			}
		}
		for _, o := range t.newOwned {
			if o.family == f {
				dg.owned = dg.owned.plus(ownedDigest(o))
			}
		}
		dg.elements = dg.elements.plus(t.sums[f.index])
		if dg != tab.digest {
			c.remark, c.digest = markerOf(tab.gen, dg), dg
			plan[f] = c
		}
	}
}

// partialPlan is the change of each family a partial sync makes.
type partialPlan map[*family]*familyChange

func (plan partialPlan) of(f *family) *familyChange {
	if plan[f] == nil {
		plan[f] = &familyChange{}
	}
	return plan[f]
}

// planElements plans the element deletes and adds of what t touched, and
// returns the change in each pick's frontends.
func (d *Datapath) planElements(plan partialPlan, t touched) map[*family]map[pick]int {
	picks := map[*family]map[pick]int{}
	countPick := func(f *family, p pick, n int) {
		if p.exists() {
			if picks[f] == nil {
				picks[f] = map[pick]int{}
			}
			picks[f][p] += n
		}
	}
	for id, was := range t.before {
		now := d.liveAt(id)
		f := id.family()
		if d.tables[f] == nil {
			continue // a family this Datapath leaves alone
		}
		if was != nil && (now == nil || !now.sameAs(was)) {
			plan.of(f).deletes = append(plan.of(f).deletes, element{elemID: id, value: was.value, pick: was.pick})
			countPick(f, was.pick, -1)
		}
		if now != nil && (was == nil || !now.sameAs(was)) {
			plan.of(f).adds = append(plan.of(f).adds, element{elemID: id, value: now.value, pick: now.pick})
			countPick(f, now.pick, +1)
		}
	}
	return picks
}

// planPicks plans the picks whose sets a change makes or empties, and
// counts each table's picks' frontends anew.
func (d *Datapath) planPicks(plan partialPlan, picks map[*family]map[pick]int) {
	for f, change := range picks {
		tab := d.tables[f]
		for _, chain := range slices.SortedFunc(maps.Keys(change), comparePicks) {
			before, existed := tab.picks[chain]
			switch after := before + change[chain]; {
			case after > 0 && !existed:
				plan.of(f).picksIn = append(plan.of(f).picksIn, chain)
				tab.picks[chain] = after
			case after <= 0 && existed:
				plan.of(f).picksOut = append(plan.of(f).picksOut, chain)
				delete(tab.picks, chain)
			case after > 0:
				tab.picks[chain] = after
			}
		}
	}
}

// render is the nft transaction that makes c in f's table of generation g.
func (d *Datapath) render(f *family, c *familyChange, g generation) *knftables.Transaction {
	tx := d.nft[f][0].NewTransaction()
	for _, e := range c.deletes {
		tx.Delete(e.object(g))
	}
	for _, p := range c.picksIn {
		tx.Add(p.object(*f, g))
	}
	if len(c.picksIn)+len(c.picksOut) > 0 {
		// The pick chains of the kinds whose picks changed, rewritten
		// with the picks there are now.
		kinds := map[uint8]bool{}
		for _, p := range slices.Concat(c.picksIn, c.picksOut) {
			kinds[p.kind] = true
		}
		for i, pc := range pickChains(*f, d.cfg.MasqueradeMark, g, d.tables[f].picks) {
			if kinds[uint8(i+1)] {
				tx.Add(pc.chain)
				writeChain(tx, pc, g)
			}
		}
	}
	for _, p := range c.picksOut {
		tx.Delete(p.object(*f, g))
	}
	c.owned.render(tx)
	for _, e := range c.adds {
		tx.Add(e.object(g))
	}
	if c.remark != "" {
		tx.Delete(&knftables.Chain{Name: d.tables[f].marker})
		tx.Add(&knftables.Chain{Name: c.remark})
	}
	return tx
}

// runPartial makes the planned changes, IPv4 first, each family's
// atomically: element changes alone as one netlink batch (elementWriter),
// or when that cannot write them, or anything else changes, as one nft
// transaction.
func (d *Datapath) runPartial(ctx context.Context, plan map[*family]*familyChange) error {
	var errs []error
	for _, f := range []*family{&ipv4, &ipv6} {
		c := plan[f]
		if c == nil || c.empty() {
			continue
		}
		g := d.tables[f].gen
		if d.elements != nil && c.elementsOnly() {
			ops := &elementOps{deletes: c.deletes, adds: c.adds}
			if c.remark != "" {
				ops.marker = [2]string{d.tables[f].marker, c.remark}
			}
			done, err := d.elements.commit(f, g, ops)
			if err != nil {
				errs = append(errs, fmt.Errorf("programming %s table %q: %w", f, TableName, err))
				continue
			}
			if done {
				if c.remark != "" {
					d.tables[f].marker, d.tables[f].digest = c.remark, c.digest
				}
				continue
			}
		}
		if err := d.run(ctx, f, d.render(f, c, g)); err != nil {
			errs = append(errs, err)
			continue
		}
		if c.remark != "" {
			d.tables[f].marker, d.tables[f].digest = c.remark, c.digest
		}
	}
	return errors.Join(errs...)
}

// ownedChange is how one family's owned chains and sets change: those to
// (re)write, and those that vanished.
type ownedChange struct{ rewrite, gone []ownedObject }

func (c ownedChange) empty() bool { return len(c.rewrite) == 0 && len(c.gone) == 0 }

// planOwned turns the owned chains and sets from old into new, per
// family: new and changed ones are (re)written, vanished ones deleted.
// Sets never change definition (their names carry it), so an existing
// one is left as it is, with its clients.
func planOwned(old, new []ownedObject) map[*family]*ownedChange {
	out := map[*family]*ownedChange{}
	of := func(f *family) *ownedChange {
		if out[f] == nil {
			out[f] = &ownedChange{}
		}
		return out[f]
	}
	oldByID := map[objID]ownedObject{}
	for _, o := range old {
		oldByID[o.id()] = o
	}
	newByID := map[objID]bool{}
	for _, o := range new {
		newByID[o.id()] = true
		if was, existed := oldByID[o.id()]; existed && was.definition() == o.definition() {
			continue
		}
		of(o.family).rewrite = append(of(o.family).rewrite, o)
	}
	for id, o := range oldByID {
		if !newByID[id] {
			of(o.family).gone = append(of(o.family).gone, o)
		}
	}
	return out
}

// render adds the change to tx. Chains are created empty first, so that
// rules may refer to any of them; vanished chains are flushed first
// (their rules may refer to each other and to sets), then deleted, then
// the vanished sets.
func (c ownedChange) render(tx *knftables.Transaction) {
	for _, o := range c.rewrite {
		tx.Add(o.create())
	}
	for _, o := range c.rewrite {
		if o.set == nil {
			tx.Flush(&knftables.Chain{Name: o.name})
			for _, r := range o.rules {
				tx.Add(&knftables.Rule{Chain: o.name, Rule: r})
			}
		}
	}
	for _, o := range c.gone {
		if o.set == nil {
			tx.Flush(&knftables.Chain{Name: o.name})
		}
	}
	for _, o := range c.gone {
		if o.set == nil {
			tx.Delete(&knftables.Chain{Name: o.name})
		}
	}
	for _, o := range c.gone {
		if o.set != nil {
			tx.Delete(&knftables.Set{Name: o.name})
		}
	}
}
