package datapath

// A restarted agent adopts the table it finds when it can: the table an
// agent left is right almost always, and reading it back costs a fraction
// of loading it again.
//
// What the elements over netlink hold is read back and compared element
// by element. Everything else, what nft writes (the chains and their
// rules, the sets' declarations, the services' own chains and sets, the
// interval sets' few elements, the counters), is summed up in a digest
// that every transaction changing any of it writes into the name of the
// generation's marker chain (generation_a_<digest>), in the same
// transaction. Adopting takes the marker's digest equal to the one the
// state works out, the names of the table's objects exactly the
// generation's, and each chain holding as many rules as it should; then a
// single transaction of the elements that differ makes the table the
// state's. Any doubt (no digest, an older layout, a foreign or missing
// object, a flushed chain, an element nobody writes, more changes than a
// transaction holds) falls back to the generation switch, which replaces
// everything.

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
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

// digest sums up what nft writes in one family's table: the fixed part
// (chains and rules, sets' declarations, counters: the layout for the
// configuration and the picks), the services' own objects and the
// interval sets' elements, the last two kept up to date change by change.
type digest struct{ fixed, owned, intervals sum128 }

func (d digest) String() string {
	s := d.fixed.plus(d.owned).plus(d.intervals)
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

func intervalDigest(e element) sum128 {
	return hash128([]byte{byte(e.set)}, e.key.bytes(), e.value.bytes())
}

// digest is f's digest of w.
func (w *desired) digest(f *family, cfg Config) digest {
	dg := digest{fixed: fixedDigest(*f, cfg, w.picks[f]), intervals: w.intervals[f.index]}
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
// state is worked out: its objects' names, its rules per chain and the
// elements of its live generation's sets.
type reading struct {
	done   chan struct{}
	err    error // why the table cannot be adopted
	marker marker
	objs   tableObjects
	rules  map[string]int
	elems  []element // as element, with the generation's sets' setIDs and picks
	took   time.Duration
}

// startReading lists f's table and, when its marker carries a digest,
// reads the rest in the background; nil when there is nothing to adopt
// (no table, an older agent's, none over netlink), which the switch
// handles as before.
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
		r.err = r.read(f)
		r.took = time.Since(start)
	}()
	return r
}

// read dumps the rules and the elements of the live generation's sets
// (but the interval sets, in the digest, and the services' own sets,
// which hold what packets wrote).
func (r *reading) read(f *family) error {
	rd, err := nfwire.NewReader()
	if err != nil {
		return err
	}
	defer rd.Close()
	if r.rules, err = rd.RuleCounts(f.wire, TableName); err != nil {
		return err
	}
	g := r.marker.gen
	for _, name := range slices.Concat(r.objs.sets, r.objs.maps) {
		var dest destination
		if id, ok := setIDs[strings.TrimSuffix(name, "_"+string(g))]; ok && name == g.of(id.String()) {
			if formats[f.index][id].interval {
				continue
			}
			dest.set = id
		} else if p, ok := pickOfSet(name, g); ok {
			dest = destination{set: p.frontendKind().frontendsSet, pick: p}
		} else {
			continue // not the generation's: the names' check says so
		}
		var bad error
		err := rd.Elements(f.wire, TableName, name, func(ke nfwire.Element) {
			e, err := kernelElement(f, dest, ke)
			if err != nil && bad == nil {
				bad = fmt.Errorf("set %s: %w", name, err)
			}
			r.elems = append(r.elems, e)
		})
		if err != nil {
			return err
		}
		if bad != nil {
			return bad
		}
	}
	return nil
}

// kernelElement is an element read back, as an element of dest.
func kernelElement(f *family, dest destination, ke nfwire.Element) (element, error) {
	e := element{elemID: elemID{fam: f.index, set: dest.set}, pick: dest.pick}
	format := e.format()
	if ke.Flags != 0 {
		return e, fmt.Errorf("an element with flags %#x", ke.Flags)
	}
	if len(ke.Key) > maxFields || len(ke.Value) > maxValue {
		return e, errors.New("an element longer than any written")
	}
	e.key.n = uint8(copy(e.key.b[:], ke.Key))
	switch {
	case format.verdict:
		if id, local, ok := parseAffinityChain(ke.Goto); ok {
			e.value.n = uint8(copy(e.value.b[:], (&fields{}).affinityRef(id, local).bytes()))
		}
		// Any other verdict stays empty: it differs from every one the
		// state holds, and is replaced.
	default:
		e.value.n = uint8(copy(e.value.b[:], ke.Value))
	}
	return e, nil
}

// parseAffinityChain reads affinityChain's name back.
func parseAffinityChain(name string) (id uint32, local, ok bool) {
	rest, found := strings.CutPrefix(name, "affinity_")
	if !found || len(rest) < 9 || rest[8] != '_' {
		return 0, false, false
	}
	n, err := strconv.ParseUint(rest[:8], 16, 32)
	if err != nil {
		return 0, false, false
	}
	switch rest[9:] {
	case "local":
		local = true
	case "cluster":
	default:
		return 0, false, false
	}
	return uint32(n), local, affinityChain(uint32(n), local) == name
}

// pickOfSet reads a pick's set name of generation g back.
func pickOfSet(name string, g generation) (pick, bool) {
	base, found := strings.CutSuffix(name, "_"+string(g))
	if !found {
		return pick{}, false
	}
	for _, k := range frontendKinds {
		for _, proto := range protocols {
			for _, hashed := range []bool{false, true} {
				p := k.pick(proto, 0)
				p.hashed = hashed
				prefix := strings.TrimSuffix(p.set(), "0")
				if s, ok := strings.CutPrefix(base, prefix); ok {
					n, err := strconv.ParseUint(s, 10, 32)
					p.n = uint32(n)
					if err == nil && p.set() == base {
						return p, true
					}
				}
			}
		}
	}
	return pick{}, false
}

// errTooManyChanges: a restarted agent found more changed elements than
// one transaction holds; the switch loads the state instead.
var errTooManyChanges = errors.New("more elements changed than one transaction holds")

// adopt makes f's table w by changing only the elements that differ, when
// r shows the table is w's in everything else; it fails, changing
// nothing, with the doubt that stops it. adds reports whether any element
// was added.
func (d *Datapath) adopt(f *family, w *desired, r *reading) (adds bool, err error) {
	<-r.done
	if r.err != nil {
		return false, r.err
	}
	g := r.marker.gen
	want := w.digest(f, d.cfg)
	if r.marker.digest != want.String() {
		return false, errors.New("the table was written for another layout, configuration or set of chains")
	}
	if err := d.checkObjects(f, w, g, r); err != nil {
		return false, err
	}
	ops, err := diffElements(f, w, r.elems)
	if err != nil {
		return false, err
	}
	if len(ops.adds)+len(ops.deletes) > 0 {
		ok, err := d.elements.commit(f, g, ops)
		if !ok {
			err = errors.New("no netlink socket to nf_tables")
		}
		if err != nil {
			return false, fmt.Errorf("programming %s table %q: %w", f, TableName, err)
		}
	}
	d.cfg.Log.Debug("table adopted", "family", f.String(), "generation", string(g), "elements", len(r.elems),
		"deleted", len(ops.deletes), "added", len(ops.adds), "read", r.took)
	t := d.tables[f]
	t.gen, t.marker, t.digest = g, r.marker.name, want
	return len(ops.adds) > 0, nil
}

// checkObjects says whether the table's objects are exactly generation
// g's with w, and each chain holds its rules.
func (d *Datapath) checkObjects(f *family, w *desired, g generation, r *reading) error {
	rules := map[string]int{r.marker.name: 0} // chains, with their rules
	others := map[string]bool{}               // sets and maps
	for _, c := range tableChains(*f, d.cfg, g, w.picks[f]) {
		rules[c.chain.Name] = len(c.rules)
	}
	for _, decl := range declared[f.index] {
		others[g.of(decl.name)] = true
	}
	for p := range w.picks[f] {
		others[g.of(p.set())] = true
	}
	for _, o := range w.objects[f] {
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

// diffElements is what makes the elements read back f's elements of w,
// as long as one transaction holds it.
func diffElements(f *family, w *desired, read []element) (*elementOps, error) {
	ops := &elementOps{}
	same := func(e element) bool {
		le, ok := w.live[e.elemID]
		return ok && le.value == e.value && le.pick == e.pick
	}
	matched := 0
	for _, e := range read {
		if same(e) {
			matched++
			continue
		}
		ops.deletes = append(ops.deletes, e)
	}
	if missing := w.counts[f] - w.intervalCount[f.index] - matched; missing > 0 {
		// Rare (the state changed while no agent ran): a second pass.
		written := make(map[elemID]bool, matched)
		for _, e := range read {
			if same(e) {
				written[e.elemID] = true
			}
		}
		for id, le := range w.live {
			if id.fam == f.index && !id.format().interval && !written[id] {
				ops.adds = append(ops.adds, element{elemID: id, value: le.value, pick: le.pick})
			}
		}
	}
	// An element whose value or pick changed is deleted then added: the
	// deletes go first in the transaction.
	if len(ops.adds)+len(ops.deletes) > loadBatch {
		return nil, fmt.Errorf("%w: %d", errTooManyChanges, len(ops.adds)+len(ops.deletes))
	}
	slices.SortFunc(ops.deletes, func(a, b element) int { return compareIDs(a.elemID, b.elemID) })
	slices.SortFunc(ops.adds, func(a, b element) int { return compareIDs(a.elemID, b.elemID) })
	return ops, nil
}
