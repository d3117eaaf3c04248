package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// filled opens a store in a new folder, writes n records, and closes it.
func filled(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := s.Commit(uint64(i), Op{Kind: "services", Key: fmt.Sprintf("default/s%d", i), Value: []byte(strings.Repeat("x", 200))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOpenRefusesALostOrDamagedDatabase: an empty, missing or truncated
// database is an error naming the file, never an empty start or a panic;
// a new folder, and a store reopened, start normally.
func TestOpenRefusesALostOrDamagedDatabase(t *testing.T) {
	dir := filled(t, 500)
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	s.Close()

	for name, damage := range map[string]func(t *testing.T, dir string){
		"empty": func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "weir.db"), 0); err != nil {
				t.Fatal(err)
			}
		},
		"missing": func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "weir.db")); err != nil {
				t.Fatal(err)
			}
		},
		"truncated to half": func(t *testing.T, dir string) {
			fi, err := os.Stat(filepath.Join(dir, "weir.db"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(filepath.Join(dir, "weir.db"), fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filled(t, 500)
			damage(t, dir)
			s, err := Open(dir)
			if err == nil {
				s.Close()
				t.Fatalf("Open succeeded on a database %s", name)
			}
			if !strings.Contains(err.Error(), "weir.db") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// Init starts afresh only where the database was lost, never over one that
// holds a store.
func TestInitStartsAfreshOnlyWhereTheStoreWasLost(t *testing.T) {
	dir := filled(t, 10)
	if err := Init(dir); err == nil || !strings.Contains(err.Error(), "holds a store") {
		t.Fatalf("Init over a full store: %v", err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("the store after a refused Init: %v", err)
	}
	s.Close()
	for _, lose := range []func(string) error{
		func(path string) error { return os.Remove(path) },
		func(path string) error { return os.Truncate(path, 0) },
	} {
		if err := lose(filepath.Join(dir, "weir.db")); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(dir); err == nil {
			t.Fatal("Open of a lost store succeeded without Init")
		}
		if err := Init(dir); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir)
		if err != nil {
			t.Fatalf("Open after Init: %v", err)
		}
		s.Close()
	}
}
