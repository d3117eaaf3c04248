package datapath

// A restarted agent adopts the table it finds when that table already
// holds the state: the table an agent left is right almost always, and
// checking it costs a fraction of loading it again.
//
// Every transaction Weir makes, over netlink or through nft, renames the
// generation's marker chain (generation_a_<digest>) in the same
// transaction: the digest sums up everything in the table, the chains and
// their rules, the sets' declarations, the services' own chains and sets,
// the counters, and every element, each by a 128-bit hash, summed so that
// a change updates it by what it adds and deletes. A restarted agent works
// the state out, and adopts the table when the marker's digest is the
// state's, the names of the table's objects exactly the generation's, and
// each chain holds as many rules as it should: no element is written,
// none is read. Anything else (the state changed meanwhile, no digest, an
// older layout, a foreign or missing object, a flushed chain) falls back
// to the generation switch, which replaces everything.
//
// The elements are not read back: the kernel dumps a set by walking it
// again from its start for each message of about 500 elements, which
// made reading a 10,000-service table back (122,000 elements) take 0.5 s,
// twice loading it, and grows with the square of the largest set. So
// someone else's change to elements (nft by hand) survives a restart that
// adopts, until the periodic resync, as it survives between resyncs.

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/datapath/internal/nfwire"
)

// sum128 is an order-free sum of 128-bit hashes: a set of items sums to
// the same whatever order they came in, and one item changes it by
// subtracting its old hash and adding its new one.
type sum128 [2]uint64

func (s sum128) plus(o sum128) sum128  { return sum128{s[0] + o[0], s[1] + o[1]} }
func (s sum128) minus(o sum128) sum128 { return sum128{s[0] - o[0], s[1] - o[1]} }

func hash128(parts ...[]byte) sum128 {
	h := sha256.New()
	for _, p := range parts {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	var b [32]byte
	h.Sum(b[:0])
	return sum128{binary.BigEndian.Uint64(b[0:]), binary.BigEndian.Uint64(b[8:])}
}

// digest sums up one family's table: the fixed part (chains and rules,
// sets' declarations, counters: the layout for the configuration and the
// picks), the services' own objects, and the elements, the last two kept
// up to date change by change.
type digest struct{ fixed, owned, elements sum128 }

func (d digest) String() string {
	s := d.fixed.plus(d.owned).plus(d.elements)
	return fmt.Sprintf("%016x%016x", s[0], s[1])
}

// fixedDigest is the fixed part of the digest with picks. It reads the
// same for both generations (the marker's name says which one it is), so
// that two tables of one state compare equal whichever forwards.
func fixedDigest(f family, cfg Config, picks map[pick]int) sum128 {
	const g = genA
	var sb strings.Builder
	sb.WriteString("weir table\n")
	for _, c := range tableChains(f, cfg, g, picks) {
		fmt.Fprintf(&sb, "chain %s", c.chain.Name)
		if c.base() {
			fmt.Fprintf(&sb, " %s %s %s", *c.chain.Type, *c.chain.Hook, *c.chain.Priority)
		}
		sb.WriteString("\n")
		for _, r := range c.rules {
			sb.WriteString(r + "\n")
		}
	}
	for _, d := range declared[f.index] {
		fmt.Fprintf(&sb, "set %+v\n", d)
	}
	for _, p := range slices.SortedFunc(maps.Keys(picks), comparePicks) {
		fmt.Fprintf(&sb, "set %+v\n", p.decl(f))
	}
	for _, c := range flowCounters(cfg) {
		fmt.Fprintf(&sb, "counter %s\n", c.Name)
	}
	return hash128([]byte(sb.String()))
}

func ownedDigest(o ownedObject) sum128 {
	return hash128([]byte(o.name), []byte(o.definition()))
}

// elementDigest is an element's hash, with the set (or pick) it is in:
// a few multiplications per word, since a full sync hashes every element.
func elementDigest(e element) sum128 {
	var b [80]byte
	b[0], b[1], b[2], b[3] = e.fam, byte(e.set), e.pick.kind, protocolNumber(e.pick.proto)
	if e.pick.hashed {
		b[4] = 1
	}
	b[6], b[7] = e.key.n, e.value.n
	binary.LittleEndian.PutUint32(b[8:], e.pick.n)
	copy(b[12:], e.key.bytes())
	copy(b[12+maxFields:], e.value.bytes())
	h1, h2 := uint64(0x9e3779b97f4a7c15), uint64(0xc2b2ae3d27d4eb4f)
	for i := 0; i < len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		h1 = bits.RotateLeft64((h1^w)*0xff51afd7ed558ccd, 29)
		h2 = bits.RotateLeft64((h2+w)*0xc4ceb9fe1a85ec53, 31) ^ h1
	}
	return sum128{fmix64(h1 ^ h2>>7), fmix64(h2 + h1)}
}

// fmix64 is MurmurHash3's finaliser: every bit of the result depends on
// every bit of k.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// digest is f's digest of w.
func (w *desired) digest(f *family, cfg Config) digest {
	dg := digest{fixed: fixedDigest(*f, cfg, w.picks[f]), elements: w.elementSums[f.index]}
	for _, o := range w.objects[f] {
		dg.owned = dg.owned.plus(ownedDigest(o))
	}
	return dg
}

// markerOf names g's marker chain for a digest.
func markerOf(g generation, dg digest) string { return g.marker() + "_" + dg.String() }

// marker is one marker chain's reading: its generation, and the digest
// it carries ("" for an older agent's marker, which carries none).
type marker struct {
	name   string
	gen    generation
	digest string
}

// liveMarker is the table's marker among chains: none when there is none,
// or more than one.
func liveMarker(chains []string) (marker, bool) {
	var found []marker
	for _, c := range chains {
		for _, g := range []generation{genA, genB} {
			switch {
			case c == g.marker():
				found = append(found, marker{name: c, gen: g})
			case strings.HasPrefix(c, g.marker()+"_"):
				found = append(found, marker{name: c, gen: g, digest: strings.TrimPrefix(c, g.marker()+"_")})
			}
		}
	}
	if len(found) != 1 {
		return marker{}, false
	}
	return found[0], true
}

// isMarker: the chain is a generation's marker, of any digest.
func isMarker(chain string) bool {
	_, ok := liveMarker([]string{chain})
	return ok
}

// reading is what a restarted agent reads of one family's table while the
// state is worked out: its objects' names and its rules per chain.
type reading struct {
	done   chan struct{}
	err    error
	marker marker
	objs   tableObjects
	rules  map[string]int
	took   time.Duration
}

// startReading lists f's table and, when its marker carries a digest,
// counts its rules in the background; nil when there is nothing to adopt
// (no table, an older agent's, no netlink socket).
func (d *Datapath) startReading(f *family) *reading {
	if d.elements == nil {
		return nil
	}
	start := time.Now()
	objs, ok, err := d.elements.list(f)
	if !ok || err != nil || len(objs.chains) == 0 {
		return nil
	}
	m, ok := liveMarker(objs.chains)
	if !ok || m.digest == "" {
		return nil
	}
	r := &reading{done: make(chan struct{}), marker: m, objs: objs}
	go func() {
		defer close(r.done)
		rd, err := nfwire.NewReader()
		if err != nil {
			r.err = err
			return
		}
		defer rd.Close()
		r.rules, r.err = rd.RuleCounts(f.wire, TableName)
		r.took = time.Since(start)
	}()
	return r
}

// shape is what a state makes of each family's table, worked out without
// the bookkeeping of a full sync (no live map): the digest, the picks and
// the services' own objects.
type shape struct {
	digests map[*family]digest
	picks   map[*family]map[pick]int // the picks there are (each counted once)
	objects map[*family][]ownedObject
}

func (d *Datapath) shapeOf(state NodeState) shape {
	// Worked out on every core: a restart waits for nothing else.
	svcs := slices.Collect(maps.Values(state.Services))
	parts := make([]shapePart, min(runtime.GOMAXPROCS(0), 1+len(svcs)/1000))
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() {
			p := &parts[i]
			p.picks = [2]map[pick]bool{{}, {}}
			if i == 0 {
				p.add(nodeElements(state.Node, d.cfg))
			}
			var c contribution
			for j := i; j < len(svcs); j += len(parts) {
				c.elems, c.owned = c.elems[:0], nil
				c.addServiceFamilies(svcs[j], state.Node, d.cfg.MasqueradeMark)
				p.add(c.elems)
				p.objects = append(p.objects, c.owned...)
			}
		})
	}
	wg.Wait()
	sh := shape{digests: map[*family]digest{}, picks: map[*family]map[pick]int{}, objects: map[*family][]ownedObject{}}
	for _, f := range d.families() {
		picks := map[pick]int{}
		var dg digest
		for _, p := range parts {
			dg.elements = dg.elements.plus(p.sums[f.index])
			for pk := range p.picks[f.index] {
				picks[pk] = 1
			}
			for _, o := range p.objects {
				if o.family == f {
					sh.objects[f] = append(sh.objects[f], o)
					dg.owned = dg.owned.plus(ownedDigest(o))
				}
			}
		}
		dg.fixed = fixedDigest(*f, d.cfg, picks)
		sh.digests[f], sh.picks[f] = dg, picks
	}
	return sh
}

// shapePart is one worker's part of a shape.
type shapePart struct {
	sums    [2]sum128
	picks   [2]map[pick]bool
	objects []ownedObject
}

func (p *shapePart) add(es []element) {
	for _, e := range es {
		p.sums[e.fam] = p.sums[e.fam].plus(elementDigest(e))
		if e.pick.exists() {
			p.picks[e.fam][e.pick] = true
		}
	}
}

// adoptTables adopts each family's table that already holds state,
// changing nothing, and says which it adopted.
func (d *Datapath) adoptTables(state NodeState) map[*family]bool {
	readings := map[*family]*reading{}
	for _, f := range d.families() {
		if t := d.tables[f]; !t.known && !t.rebuild {
			if r := d.startReading(f); r != nil {
				readings[f] = r
			}
		}
	}
	if len(readings) == 0 {
		return nil
	}
	start := time.Now()
	sh := d.shapeOf(state)
	adopted := map[*family]bool{}
	for f, r := range readings {
		if err := d.adopts(f, sh, r); err != nil {
			d.cfg.Log.Info("the table found is not adopted; switching to the state", "family", f.String(), "reason", err)
			continue
		}
		t := d.tables[f]
		t.known, t.adopted = true, true
		t.gen, t.marker, t.digest = r.marker.gen, r.marker.name, sh.digests[f]
		adopted[f] = true
		d.cfg.Log.Debug("table adopted", "family", f.String(), "generation", string(t.gen), "read", r.took, "took", time.Since(start))
	}
	return adopted
}

// adoptedWhole finishes a full sync whose every table was adopted: the
// state's bookkeeping (the live elements, each pick's frontends) is worked
// out afterwards (see settle), so that the node counts as converged as
// soon as the tables are known to be right.
func (d *Datapath) adoptedWhole(state NodeState) {
	d.needFull = false
	d.node, d.services = state.Node, maps.Clone(state.Services)
	pending := &NodeState{Node: d.node, Services: d.services}
	d.pending = pending
	go func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.pending == pending {
			d.settle()
		}
	}()
}

// adopts says why f's table cannot be adopted for a state of shape sh,
// or nil when it holds it.
func (d *Datapath) adopts(f *family, sh shape, r *reading) error {
	<-r.done
	if r.err != nil {
		return r.err
	}
	if r.marker.digest != sh.digests[f].String() {
		return errors.New("the table holds another state, layout or configuration (its digest differs)")
	}
	return d.checkObjects(f, sh.picks[f], sh.objects[f], r.marker.gen, r)
}

// settle works out the bookkeeping of an adopted state, if it is not yet:
// whatever uses it calls it first.
func (d *Datapath) settle() {
	if d.pending == nil {
		return
	}
	start := time.Now()
	w := d.desire(*d.pending, nil)
	d.pending = nil
	d.live, d.owned = w.live, w.owned
	for _, f := range d.families() {
		t := d.tables[f]
		t.picks = w.picks[f]
		if w.digest(f, d.cfg) != t.digest {
			// Never expected: the two ways of working a state out
			// disagree. A full sync makes sure.
			d.cfg.Log.Error("an adopted state's bookkeeping disagrees with its digest; the table is switched at the next apply", "family", f.String())
			d.needFull = true
			d.forget()
		}
	}
	d.cfg.Log.Debug("adopted state's bookkeeping worked out", "took", time.Since(start))
}

// checkObjects says whether the table's objects are exactly generation
// g's with picks and objects, and each chain holds its rules.
func (d *Datapath) checkObjects(f *family, picks map[pick]int, objects []ownedObject, g generation, r *reading) error {
	rules := map[string]int{r.marker.name: 0} // chains, with their rules
	others := map[string]bool{}               // sets and maps
	for _, c := range tableChains(*f, d.cfg, g, picks) {
		rules[c.chain.Name] = len(c.rules)
	}
	for _, decl := range declared[f.index] {
		others[g.of(decl.name)] = true
	}
	for p := range picks {
		others[g.of(p.set())] = true
	}
	for _, o := range objects {
		if o.set != nil {
			others[o.name] = true
		} else {
			rules[o.name] = len(o.rules)
		}
	}
	if len(r.objs.chains) != len(rules) {
		return fmt.Errorf("the table has %d chains, the state %d", len(r.objs.chains), len(rules))
	}
	for _, c := range r.objs.chains {
		n, ok := rules[c]
		switch {
		case !ok:
			return fmt.Errorf("chain %s is not the state's", c)
		case r.rules[c] != n:
			return fmt.Errorf("chain %s has %d rules, the state %d", c, r.rules[c], n)
		}
	}
	listed := 0
	for _, s := range slices.Concat(r.objs.sets, r.objs.maps) {
		if strings.HasPrefix(s, "__") {
			continue // a rule's anonymous set
		}
		if !others[s] {
			return fmt.Errorf("set %s is not the state's", s)
		}
		listed++
	}
	if listed != len(others) {
		return fmt.Errorf("the table has %d sets and maps, the state %d", listed, len(others))
	}
	return nil
}
