package conntrack

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeRoot makes the tunables' files under a temporary root with the
// given values.
func fakeRoot(t *testing.T, values map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, v := range values {
		path := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func value(t *testing.T, root, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestAppliesKubeProxysDefaults(t *testing.T) {
	root := fakeRoot(t, map[string]string{
		maxPath: "65536", hashsizePath: "16384", establishedPath: "432000", closeWaitPath: "60",
	})
	if err := Apply(root, 8, Defaults, quiet); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		maxPath:         "262144", // 8 × 32768, above the minimum 131072
		hashsizePath:    "65536",  // a quarter of the table
		establishedPath: "86400",
		closeWaitPath:   "3600",
	} {
		if got := value(t, root, path); got != want {
			t.Errorf("%s = %s, want %s", filepath.Base(path), got, want)
		}
	}
}

func TestNeverLowersTheTableAndLeavesZeroesAlone(t *testing.T) {
	root := fakeRoot(t, map[string]string{
		maxPath: "1048576", hashsizePath: "262144", establishedPath: "432000", closeWaitPath: "60",
	})
	cfg := Defaults
	cfg.TCPEstablished = 0 // as it is
	if err := Apply(root, 2, cfg, quiet); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{maxPath: "1048576", hashsizePath: "262144", establishedPath: "432000", closeWaitPath: "3600"} {
		if got := value(t, root, path); got != want {
			t.Errorf("%s = %s, want %s", filepath.Base(path), got, want)
		}
	}
	// The minimum when the CPUs give less.
	root = fakeRoot(t, map[string]string{maxPath: "65536", hashsizePath: "16384", establishedPath: "1", closeWaitPath: "1"})
	if err := Apply(root, 2, Defaults, quiet); err != nil {
		t.Fatal(err)
	}
	if got := value(t, root, maxPath); got != "131072" {
		t.Errorf("nf_conntrack_max = %s, want the minimum 131072", got)
	}
}

func TestATableSizeThatCannotBeWrittenIsNotAnError(t *testing.T) {
	root := fakeRoot(t, map[string]string{maxPath: "65536", hashsizePath: "16384", establishedPath: "1", closeWaitPath: "1"})
	// A network namespace other than the host's: nf_conntrack_max is
	// read-only there (EACCES, even for root).
	writeFile = func(name string, data []byte, perm os.FileMode) error {
		if strings.HasSuffix(name, maxPath) {
			return &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
		}
		return os.WriteFile(name, data, perm)
	}
	t.Cleanup(func() { writeFile = os.WriteFile })
	if err := Apply(root, 8, Defaults, quiet); err != nil {
		t.Fatalf("a read-only table size: %v, want a warning only", err)
	}
	if got := value(t, root, closeWaitPath); got != "3600" {
		t.Errorf("the timeouts are still set: close_wait = %s", got)
	}
}

func TestRejectsWhatIsNotWholeSeconds(t *testing.T) {
	for _, c := range []Config{
		{TCPEstablished: 1500 * time.Millisecond},
		{TCPCloseWait: -time.Second},
		{MaxPerCore: -1},
		{Min: -1},
	} {
		root := fakeRoot(t, map[string]string{maxPath: "1", hashsizePath: "1", establishedPath: "7", closeWaitPath: "7"})
		if err := Apply(root, 1, c, quiet); err == nil {
			t.Errorf("%+v accepted", c)
		}
		if got := value(t, root, establishedPath); got != "7" {
			t.Errorf("%+v changed the established timeout to %s", c, got)
		}
	}
}
