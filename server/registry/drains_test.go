package registry_test

import (
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
)

// storedDrains is what the store holds under "drains", by node.
func storedDrains(t *testing.T, st store.Backend) map[string]string {
	t.Helper()
	out := map[string]string{}
	if _, err := st.Load(func(kind, key string, _ uint64, value []byte) error {
		if kind == "drains" {
			out[key] = string(value)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// drainOf is the node's drain as the registry's readers see it.
func drainOf(t *testing.T, reg *registry.Registry, name string) (bool, time.Time) {
	t.Helper()
	n, err := reg.Nodes.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	n = reg.WithDrain(n)
	return n.Drained, n.DrainDeadline
}

// TestDrainDeadlineIsStoredSoOlderServersReadIt: a drain without a
// deadline is stored as before ({1}), one with a deadline as a JSON
// document (which a server before deadlines, taking any value as drained,
// still reads as drained); a server reads both, keeps the deadline across
// a restart, and a drain again sets or clears it.
func TestDrainDeadlineIsStoredSoOlderServersReadIt(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A drain an older server stored, before this one opens the store.
	if _, err := st.Commit(0, store.Op{Kind: "drains", Key: "old", Value: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"old", "plain", "timed"} {
		if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}); err != nil {
			t.Fatal(err)
		}
	}
	if drained, deadline := drainOf(t, reg, "old"); !drained || !deadline.IsZero() {
		t.Errorf("a drain stored as {1}: drained %v, deadline %v; want drained without a deadline", drained, deadline)
	}
	deadline := time.Date(2026, 5, 1, 10, 0, 8, 0, time.FixedZone("CEST", 2*3600))
	if _, _, err := reg.Drain("plain", time.Time{}); err != nil {
		t.Fatal(err)
	}
	n, _, err := reg.Drain("timed", deadline)
	if err != nil {
		t.Fatal(err)
	}
	if !n.Drained || !n.DrainDeadline.Equal(deadline) {
		t.Errorf("Drain returned drained %v, deadline %v; want %v", n.Drained, n.DrainDeadline, deadline)
	}
	want := map[string]string{"old": "\x01", "plain": "\x01", "timed": `{"deadline":"2026-05-01T08:00:08Z"}`}
	if got := storedDrains(t, st); !maps.Equal(got, want) {
		t.Errorf("stored drains %q, want %q", got, want)
	}

	// A restart keeps them.
	st.Close()
	if st, err = store.Open(dir); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if reg, err = registry.Open(st); err != nil {
		t.Fatal(err)
	}
	for name, wantDeadline := range map[string]time.Time{"old": {}, "plain": {}, "timed": deadline} {
		if drained, got := drainOf(t, reg, name); !drained || !got.Equal(wantDeadline) || got.IsZero() != wantDeadline.IsZero() {
			t.Errorf("%s after a restart: drained %v, deadline %v; want drained, deadline %v", name, drained, got, wantDeadline)
		}
	}

	// Drained again: a new deadline replaces the old, none clears it, the
	// same one changes nothing.
	later := deadline.Add(time.Hour)
	rev := reg.Revision()
	if _, _, err := reg.Drain("plain", later); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reg.Drain("timed", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, again, err := reg.Drain("plain", later); err != nil || again != rev+2 {
		t.Errorf("the same drain again: revision %d, %v; want %d, no write", again, err, rev+2)
	}
	if _, _, err := reg.Uncordon("old"); err != nil {
		t.Fatal(err)
	}
	want = map[string]string{"plain": `{"deadline":"2026-05-01T09:00:08Z"}`, "timed": "\x01"}
	if got := storedDrains(t, st); !maps.Equal(got, want) {
		t.Errorf("stored drains %q, want %q", got, want)
	}
	if drained, _ := drainOf(t, reg, "old"); drained {
		t.Error("uncordoned, still drained")
	}
}
