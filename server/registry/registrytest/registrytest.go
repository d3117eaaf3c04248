// Package registrytest opens a registry on a fresh store for tests.
package registrytest

import (
	"testing"

	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
)

// Open opens a registry in a temporary folder, closed when the test ends.
func Open(t testing.TB) *registry.Registry {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg, err := registry.Open(st)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
