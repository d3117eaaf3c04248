// Package conntrack sets the kernel's connection-tracking tunables a
// service proxy is expected to set, as kube-proxy does at start: the table
// size (raised, never lowered) and the TCP timeouts of established and
// CLOSE_WAIT connections. A service's connections live in that table: a
// table too small drops new connections under load, and a timeout too
// short forgets an idle established connection, whose next packet is then
// no longer translated back.
package conntrack

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Config is what to set; a zero field leaves that tunable as it is.
// Defaults gives kube-proxy's.
type Config struct {
	// MaxPerCore and Min size the table: MaxPerCore times the CPUs, at
	// least Min. It is only ever raised.
	MaxPerCore, Min int
	// TCPEstablished and TCPCloseWait are the timeouts of TCP connections
	// in those states, in whole seconds.
	TCPEstablished, TCPCloseWait time.Duration
}

// Defaults are kube-proxy's defaults.
var Defaults = Config{MaxPerCore: 32768, Min: 131072, TCPEstablished: 24 * time.Hour, TCPCloseWait: time.Hour}

// Validate says which field is out of range.
func (c Config) Validate() error {
	switch {
	case c.MaxPerCore < 0:
		return errors.New("conntrack max per core: negative")
	case c.Min < 0:
		return errors.New("conntrack min: negative")
	case c.TCPEstablished < 0 || c.TCPEstablished%time.Second != 0:
		return errors.New("conntrack TCP established timeout: not whole non-negative seconds")
	case c.TCPCloseWait < 0 || c.TCPCloseWait%time.Second != 0:
		return errors.New("conntrack TCP CLOSE_WAIT timeout: not whole non-negative seconds")
	}
	return nil
}

// The files, under a root that is "/" but in tests.
const (
	maxPath         = "proc/sys/net/netfilter/nf_conntrack_max"
	hashsizePath    = "sys/module/nf_conntrack/parameters/hashsize"
	establishedPath = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
	closeWaitPath   = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"
)

// Apply sets the tunables under root ("/") for a machine of cpus CPUs and
// logs what it changed. The table size is a host-wide setting a network
// namespace cannot write: that is logged and not an error.
func Apply(root string, cpus int, c Config, log *slog.Logger) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.MaxPerCore > 0 {
		want := max(c.MaxPerCore*cpus, c.Min)
		if err := raiseMax(root, want, log); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		path string
		d    time.Duration
	}{{establishedPath, c.TCPEstablished}, {closeWaitPath, c.TCPCloseWait}} {
		if t.d == 0 {
			continue
		}
		if err := set(root, t.path, int(t.d/time.Second), log); err != nil {
			return err
		}
	}
	return nil
}

// raiseMax raises the table's size to want, and its hash table to a
// quarter of that, as kube-proxy does, when they are smaller.
func raiseMax(root string, want int, log *slog.Logger) error {
	cur, err := read(root, maxPath)
	if err != nil {
		return err
	}
	if cur >= want {
		return nil
	}
	if err := write(root, maxPath, want); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			log.Warn("conntrack table size not raised: not writable here (a container's network namespace?); raise it on the host",
				"nf_conntrack_max", cur, "want", want)
			return nil
		}
		return err
	}
	log.Info("conntrack table size raised", "nf_conntrack_max", want, "was", cur)
	if hash, err := read(root, hashsizePath); err == nil && hash < want/4 {
		if err := write(root, hashsizePath, want/4); err != nil {
			log.Warn("conntrack hash size not raised", "hashsize", hash, "want", want/4, "err", err)
		}
	}
	return nil
}

// set writes v to path unless it holds v already.
func set(root, path string, v int, log *slog.Logger) error {
	cur, err := read(root, path)
	if err != nil {
		return err
	}
	if cur == v {
		return nil
	}
	if err := write(root, path, v); err != nil {
		return err
	}
	log.Info("conntrack tunable set", "name", filepath.Base(path), "value", v, "was", cur)
	return nil
}

func read(root, path string) (int, error) {
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return 0, fmt.Errorf("conntrack: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("conntrack: %s: %w", path, err)
	}
	return v, nil
}

// writeFile is os.WriteFile; tests make it fail as a namespace's
// read-only file does.
var writeFile = os.WriteFile

func write(root, path string, v int) error {
	if err := writeFile(filepath.Join(root, path), []byte(strconv.Itoa(v)+"\n"), 0o644); err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	return nil
}
