package registry

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
)

// openTestRegistry opens a registry over a store of its own, closed when
// the test ends.
func openTestRegistry(t *testing.T) (*store.Bolt, *Registry) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r, err := Open(st)
	if err != nil {
		t.Fatal(err)
	}
	return st, r
}

// TestDrainsReadBackFromTheStore: a replica learns another's drains from
// the store (etcd), each write as it comes (putStored) or the whole store
// again when its place in the history is gone (reload); both formats are
// read, and a changed deadline alone is a change of the node.
func TestDrainsReadBackFromTheStore(t *testing.T) {
	st, r := openTestRegistry(t)
	if _, err := r.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n1"}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}); err != nil {
		t.Fatal(err)
	}
	var changed [][]string
	r.OnChange(func(ch Change) { changed = append(changed, ch.Nodes) })
	deadline := time.Date(2026, 5, 1, 10, 0, 8, 0, time.UTC)
	check := func(what string, drained bool, want time.Time) {
		t.Helper()
		r.mu.RLock()
		n := r.withDrain(r.Nodes.items["n1"])
		r.mu.RUnlock()
		if n.Drained != drained || !n.DrainDeadline.Equal(want) {
			t.Errorf("%s: drained %v, deadline %v; want %v, %v", what, n.Drained, n.DrainDeadline, drained, want)
		}
		if len(changed) != 1 || !slices.Contains(changed[0], "n1") {
			t.Errorf("%s: changes %v, want one naming n1", what, changed)
		}
		changed = nil
	}

	// Another replica's writes to the store, read back one by one.
	head := func() uint64 {
		rev, err := st.Load(func(string, string, uint64, []byte) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	write := func(value []byte) (uint64, []store.Op) {
		ops := []store.Op{{Kind: drainsKind, Key: "n1", Value: value}}
		rev, err := st.Commit(head(), ops...)
		if err != nil {
			t.Fatal(err)
		}
		return rev, ops
	}
	timed, _ := encodeDrain(deadline)
	for _, step := range []struct {
		what     string
		value    []byte
		drained  bool
		deadline time.Time
	}{
		{"a drain with a deadline", timed, true, deadline},
		{"the same drain without one (an older replica's)", []byte{1}, true, time.Time{}},
		{"uncordoned", nil, false, time.Time{}},
	} {
		if err := r.putStored(write(step.value)); err != nil {
			t.Fatal(err)
		}
		check(step.what, step.drained, step.deadline)
	}

	// The whole store read again: first a drain, then only its deadline
	// differs.
	write([]byte{1})
	if err := r.reload(); err != nil {
		t.Fatal(err)
	}
	check("reloaded, drained", true, time.Time{})
	write(timed)
	if err := r.reload(); err != nil {
		t.Fatal(err)
	}
	check("reloaded with a deadline", true, deadline)
}

func TestDecodeDrain(t *testing.T) {
	deadline := time.Date(2026, 5, 1, 10, 0, 8, 0, time.UTC)
	for _, tc := range []struct {
		value string
		want  time.Time
	}{
		{"\x01", time.Time{}},
		{`{"deadline":"2026-05-01T10:00:08Z"}`, deadline},
		{`{"deadline":"2026-05-01T12:00:08+02:00"}`, deadline},
		// What it cannot read is still a drain, without a deadline.
		{`{"deadline":"soon"}`, time.Time{}},
		{"x", time.Time{}},
	} {
		if got := decodeDrain([]byte(tc.value)); !got.Equal(tc.want) {
			t.Errorf("decodeDrain(%q) = %v, want %v", tc.value, got, tc.want)
		}
	}
}
