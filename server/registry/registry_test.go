package registry_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
)

// flaky is a store that refuses commits with err while it is set.
type flaky struct {
	store.Backend
	err error
}

func (f *flaky) Commit(base uint64, ops ...store.Op) (uint64, error) {
	if f.err != nil {
		return 0, f.err
	}
	return f.Backend.Commit(base, ops...)
}

// A store that refuses writes is recorded, told once when it starts and
// once when it takes a write again, and a lost leadership is no fault of
// the store; nothing refused is half-applied.
func TestWriteFailuresAreRecordedAndCleared(t *testing.T) {
	bolt, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	st := &flaky{Backend: bolt}
	reg, err := registry.Open(st)
	if err != nil {
		t.Fatal(err)
	}
	var told []error
	reg.OnWriteFailure(func(err error) { told = append(told, err) })
	node := func(name string) *model.Node {
		return &model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	}
	if _, err := reg.Nodes.Create(node("n1")); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.WriteFailure(); err != nil || len(told) != 0 {
		t.Fatalf("after a write taken: failure %v, told %v", err, told)
	}

	full := errors.New("no space left on device")
	st.err = full
	for _, n := range []string{"n2", "n3"} {
		if _, err := reg.Nodes.Create(node(n)); !errors.Is(err, full) {
			t.Fatalf("a write the store refuses: %v, want the store's error", err)
		}
	}
	since, err := reg.WriteFailure()
	if !errors.Is(err, full) || since.IsZero() || len(told) != 1 || !errors.Is(told[0], full) {
		t.Fatalf("after two refused writes: failure %v since %v, told %v; want the error, a time, told once", err, since, told)
	}
	if _, err := reg.Nodes.Get("n2"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("a refused create is visible: %v", err)
	}

	st.err = store.ErrNotLeader
	reg.Nodes.Create(node("n4"))
	if _, err := reg.WriteFailure(); !errors.Is(err, full) || len(told) != 1 {
		t.Errorf("a lost leadership changed the store's record: %v, told %v", err, told)
	}

	st.err = nil
	if _, err := reg.Nodes.Create(node("n5")); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.WriteFailure(); err != nil || len(told) != 2 || told[1] != nil {
		t.Errorf("after a write taken again: failure %v, told %v; want none, told nil", err, told)
	}
}
