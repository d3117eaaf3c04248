package datapath

import (
	"maps"
	"math/rand/v2"
	"testing"
	"unsafe"

	"sigs.k8s.io/knftables"
)

// TestLiveSetAsAMap: the live set answers as one map of every element
// would, over random puts and removals of every kind of element of both
// families (values long and short, an element's value growing past what a
// compact entry holds), and keeps every IPv4 element compact.
func TestLiveSetAsAMap(t *testing.T) {
	state, cfg := everyKindOfElement()
	dp := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), cfg)
	w := dp.desire(state, nil)
	var ids []elemID
	want := map[elemID]liveElement{}
	for id, le := range w.live.all() {
		ids = append(ids, id)
		if _, twice := want[id]; twice {
			t.Fatalf("%v yielded twice", id)
		}
		want[id] = le
		if id.fam == ipv4.index && id.key.n <= compactKey && le.value.n <= compactValue {
			if _, ok := w.live.compact[mustCompact(t, id)]; !ok {
				t.Errorf("%s %s is not compact", setNames[id.set], id.key.text(id.format().key, id.format().interval))
			}
		}
	}
	if len(w.live.compact) == 0 || len(w.live.wide) == 0 {
		t.Fatalf("compact %d, wide %d: the state should need both", len(w.live.compact), len(w.live.wide))
	}
	if len(ids) != w.live.len() {
		t.Fatalf("all yielded %d, len is %d", len(ids), w.live.len())
	}

	rng := rand.New(rand.NewPCG(1, 2))
	s := newLiveSet(0)
	want = map[elemID]liveElement{}
	for step := range 20000 {
		id := ids[rng.IntN(len(ids))]
		switch rng.IntN(3) {
		case 0:
			s.remove(id)
			delete(want, id)
		default:
			le := liveElement{pick: pick{kind: 1, n: uint32(rng.IntN(9))}, refs: int32(1 + rng.IntN(3))}
			le.value.n = uint8(rng.IntN(maxValue + 1)) // up to IPv6's address . port
			for i := range le.value.n {
				le.value.b[i] = byte(rng.Uint32())
			}
			s.put(id, le)
			want[id] = le
		}
		got, ok := s.get(id)
		if wantLE, wantOK := want[id]; ok != wantOK || got != wantLE {
			t.Fatalf("step %d: get %v = %+v %v, want %+v %v", step, id, got, ok, wantLE, wantOK)
		}
		if s.len() != len(want) {
			t.Fatalf("step %d: len %d, want %d", step, s.len(), len(want))
		}
	}
	got := maps.Collect(s.all())
	if !maps.Equal(got, want) {
		t.Fatalf("all yields %d elements, want %d (or their values differ)", len(got), len(want))
	}
	for id := range want {
		c, compact := id.compact()
		_, inCompact := s.compact[c]
		_, inWide := s.wide[id]
		if inWide == (compact && inCompact) {
			t.Fatalf("%v is in both maps or in neither", id)
		}
	}
}

func mustCompact(t *testing.T, id elemID) compactID {
	t.Helper()
	c, ok := id.compact()
	if !ok {
		t.Fatalf("%v has no compact id", id)
	}
	return c
}

// TestCompactEntriesAreHalfTheSize: a compact entry, key and value, takes
// at most 44 bytes, where a wide one takes 84.
func TestCompactEntriesAreHalfTheSize(t *testing.T) {
	if size := unsafe.Sizeof(compactID{}) + unsafe.Sizeof(compactLive{}); size > 44 {
		t.Errorf("a compact live element takes %d bytes, more than 44", size)
	}
}
