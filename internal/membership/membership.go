// Package membership is Weir's fast failure detector: agents and
// load-balancer speakers join one memberlist cluster (SWIM: members probe
// each other directly and through others, and gossip what they find),
// tuned for a rack LAN so that a node whose agent or link dies is declared
// dead on every member in well under a second, without waiting for
// Kubernetes, the server or BGP hold timers.
package membership

import (
	"bytes"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config is one member.
type Config struct {
	// Name is unique in the cluster: the node's name for agents.
	Name string
	Bind netip.AddrPort
	// Join lists members to contact ("HOST:PORT"); the member keeps trying
	// while it is alone.
	Join []string
	// SecretKey, when set, encrypts and authenticates the gossip (16, 24
	// or 32 bytes: AES-128, -192 or -256); every member needs the same.
	SecretKey []byte
	// OnChange hears of every member that joins (alive) or is declared
	// dead or leaves (not alive). It must return quickly.
	OnChange func(name string, alive bool)
	Log      *slog.Logger
}

// LANConfig is memberlist tuned for one rack: a member is probed about
// every 100 ms, a probe unanswered in 50 ms (directly and through three
// others) makes the member suspect, and a suspect not refuted in
// SuspicionMult x log10(members) probe intervals (200 ms under ten
// members) is dead. Gossip leaves every 20 ms.
func LANConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.SuspicionMaxTimeoutMult = 2
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = 15 * time.Second
	c.TCPTimeout = time.Second
	// A restarted agent may come back on another address or port.
	c.DeadNodeReclaimTime = time.Second
	return c
}

// Member is this process in the cluster.
type Member struct {
	ml   *memberlist.Memberlist
	join []string
	log  *slog.Logger
	stop chan struct{}
	done sync.WaitGroup
}

// Start joins the cluster (in the background while no seed answers).
func Start(cfg Config) (*Member, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := LANConfig()
	c.Name = cfg.Name
	c.BindAddr, c.BindPort = cfg.Bind.Addr().String(), int(cfg.Bind.Port())
	c.AdvertiseAddr, c.AdvertisePort = c.BindAddr, c.BindPort
	c.SecretKey = cfg.SecretKey
	c.Logger = log.New(&logWriter{cfg.Log}, "", 0)
	if cfg.OnChange != nil {
		c.Events = &events{cfg.OnChange}
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		return nil, fmt.Errorf("membership on %s: %w", cfg.Bind, err)
	}
	m := &Member{ml: ml, join: cfg.Join, log: cfg.Log, stop: make(chan struct{})}
	m.done.Add(1)
	go m.keepJoined()
	return m, nil
}

// keepJoined contacts, every second, the seeds that are not alive members:
// at start, after a partition, and when a seed restarted (it came back
// alone and must be told of the others).
func (m *Member) keepJoined() {
	defer m.done.Done()
	if len(m.join) == 0 {
		return
	}
	warned := false
	for {
		alive := map[string]bool{}
		for _, n := range m.ml.Members() {
			if a, ok := netip.AddrFromSlice(n.Addr); ok {
				alive[netip.AddrPortFrom(a.Unmap(), n.Port).String()] = true
			}
		}
		var missing []string
		for _, s := range m.join {
			if ap, err := netip.ParseAddrPort(s); err != nil || !alive[ap.String()] {
				missing = append(missing, s)
			}
		}
		if len(missing) > 0 {
			if _, err := m.ml.Join(missing); err != nil && !warned && m.ml.NumMembers() <= 1 {
				m.log.Warn("membership: alone, no seed answers", "seeds", missing, "error", err)
				warned = true
			}
		} else {
			warned = false
		}
		select {
		case <-m.stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// Alive lists the members alive now, this one included.
func (m *Member) Alive() []string {
	var out []string
	for _, n := range m.ml.Members() {
		out = append(out, n.Name)
	}
	return out
}

// Leave tells the others this member goes (they drop it at once rather
// than after a failed probe) and stops.
func (m *Member) Leave() {
	close(m.stop)
	m.done.Wait()
	if err := m.ml.Leave(time.Second); err != nil {
		m.log.Warn("membership: leaving", "error", err)
	}
	m.ml.Shutdown()
}

type events struct{ on func(string, bool) }

func (e *events) NotifyJoin(n *memberlist.Node)   { e.on(n.Name, true) }
func (e *events) NotifyLeave(n *memberlist.Node)  { e.on(n.Name, false) }
func (e *events) NotifyUpdate(n *memberlist.Node) {}

// logWriter sends memberlist's "[LEVEL] memberlist: ..." lines to slog.
type logWriter struct{ l *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(bytes.TrimRight(p, "\n")))
	level := slog.LevelDebug
	switch {
	case strings.HasPrefix(line, "[ERR]"):
		level = slog.LevelError
	case strings.HasPrefix(line, "[WARN]"):
		level = slog.LevelWarn
	case strings.HasPrefix(line, "[INFO]"):
		level = slog.LevelInfo
	}
	if _, rest, ok := strings.Cut(line, "] "); ok {
		line = rest
	}
	w.l.Log(context.Background(), level, line)
	return len(p), nil
}

// Flags are a component's membership settings, as given on its command
// line.
type Flags struct {
	Bind    string // ADDRESS:PORT; empty: no membership
	Join    string // comma-separated ADDRESS:PORT
	KeyFile string // base64 AES key
}

// Start joins as name when f.Bind is set; nil without membership.
func (f Flags) Start(name string, onChange func(string, bool), log *slog.Logger) (*Member, error) {
	if f.Bind == "" {
		return nil, nil
	}
	bind, err := netip.ParseAddrPort(f.Bind)
	if err != nil {
		return nil, fmt.Errorf("--memberlist-bind-address: %q is not ADDRESS:PORT", f.Bind)
	}
	cfg := Config{Name: name, Bind: bind, OnChange: onChange, Log: log}
	for _, s := range strings.Split(f.Join, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Join = append(cfg.Join, s)
		}
	}
	if f.KeyFile != "" {
		raw, err := os.ReadFile(f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--memberlist-key-file: %w", err)
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
		if err != nil || (len(key) != 16 && len(key) != 24 && len(key) != 32) {
			return nil, fmt.Errorf("--memberlist-key-file: want a base64 key of 16, 24 or 32 bytes (openssl rand -base64 32)")
		}
		cfg.SecretKey = key
	}
	return Start(cfg)
}

// AddFlags defines the membership flags on fs.
func (f *Flags) AddFlags(fs *flag.FlagSet, joinHelp string) {
	fs.StringVar(&f.Bind, "memberlist-bind-address", "", "ADDRESS:PORT (TCP and UDP) of this member of the failure-detection membership; empty: no membership")
	fs.StringVar(&f.Join, "memberlist-join", "", joinHelp)
	fs.StringVar(&f.KeyFile, "memberlist-key-file", "", "file with the membership's shared key, base64 (16, 24 or 32 bytes), to encrypt and authenticate the gossip")
}
