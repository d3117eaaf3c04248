package datapath

import "iter"

// The live elements are the largest thing a node keeps: 1.2 million at
// 100,000 services. An element id has room for the longest key (44 bytes)
// and a value for the longest value (20), yet every IPv4 element's key
// fits in 16 bytes and its value in 8. liveSet keeps the elements that fit
// in a map whose entries are half the size, and only the others (mostly
// IPv6's longer addresses) in one with room for any element.

// liveSet is every element of the tables, with the services (and the node)
// that contribute it: each in compact if it fits, else in wide.
type liveSet struct {
	compact map[compactID]compactLive
	wide    map[elemID]liveElement
}

// compactID is an elemID whose key fits compactKey.
type compactID struct {
	fam uint8
	set setID
	n   uint8
	key [compactKey]byte
}

// compactLive is a liveElement whose value fits compactValue.
type compactLive struct {
	n     uint8
	value [compactValue]byte
	pick  pick
	refs  int32
}

const compactKey, compactValue = 16, 8

func newLiveSet(hint int) liveSet {
	return liveSet{compact: make(map[compactID]compactLive, hint), wide: map[elemID]liveElement{}}
}

// compact is id in a compact entry, when its key fits.
func (id elemID) compact() (compactID, bool) {
	if id.key.n > compactKey {
		return compactID{}, false
	}
	c := compactID{fam: id.fam, set: id.set, n: id.key.n}
	copy(c.key[:], id.key.bytes())
	return c, true
}

func (c compactID) id() elemID {
	id := elemID{fam: c.fam, set: c.set, key: fields{n: c.n}}
	copy(id.key.b[:], c.key[:c.n])
	return id
}

func (le liveElement) compact() compactLive {
	c := compactLive{n: le.value.n, pick: le.pick, refs: le.refs}
	copy(c.value[:], le.value.bytes())
	return c
}

func (c compactLive) live() liveElement {
	le := liveElement{value: elemValue{n: c.n}, pick: c.pick, refs: c.refs}
	copy(le.value.b[:], c.value[:c.n])
	return le
}

// get is the live element id, and whether there is one.
func (s *liveSet) get(id elemID) (liveElement, bool) {
	if c, ok := id.compact(); ok {
		if cl, found := s.compact[c]; found {
			return cl.live(), true
		}
	}
	if len(s.wide) == 0 {
		return liveElement{}, false
	}
	le, found := s.wide[id]
	return le, found
}

// put makes le the live element id.
func (s *liveSet) put(id elemID, le liveElement) {
	if c, ok := id.compact(); ok && le.value.n <= compactValue {
		s.compact[c] = le.compact()
		if len(s.wide) > 0 {
			delete(s.wide, id)
		}
		return
	}
	s.remove(id)
	s.wide[id] = le
}

func (s *liveSet) remove(id elemID) {
	if c, ok := id.compact(); ok {
		delete(s.compact, c)
	}
	if len(s.wide) > 0 {
		delete(s.wide, id)
	}
}

func (s *liveSet) len() int { return len(s.compact) + len(s.wide) }

// all yields every live element, in no order.
func (s *liveSet) all() iter.Seq2[elemID, liveElement] {
	return func(yield func(elemID, liveElement) bool) {
		for c, cl := range s.compact {
			if !yield(c.id(), cl.live()) {
				return
			}
		}
		for id, le := range s.wide {
			if !yield(id, le) {
				return
			}
		}
	}
}
