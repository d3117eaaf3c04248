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
	"fmt"
	"log"
	"log/slog"
	"net/netip"
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

// keepJoined contacts the seeds while this member is alone: at start, and
// after a partition left it by itself.
func (m *Member) keepJoined() {
	defer m.done.Done()
	if len(m.join) == 0 {
		return
	}
	wasAlone := true
	for {
		if m.ml.NumMembers() <= 1 {
			if _, err := m.ml.Join(m.join); err != nil && !wasAlone {
				m.log.Warn("membership: alone, no seed answers", "seeds", m.join, "error", err)
			}
			wasAlone = true
		} else {
			wasAlone = false
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
