package lbtier

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// BGP is the seam to the BGP speaker (bgpspeaker.GoBGP in production).
type BGP interface {
	bgpspeaker.Paths
	Sessions(ctx context.Context) ([]bgpspeaker.Session, error)
}

// Config is a load-balancer speaker.
type Config struct {
	Name   string
	Probes ProbeConfig
	// Report hears the speaker's status whenever it changes; it may block
	// (a newer status replaces one not yet taken). A status it fails to
	// deliver is offered again a second later, unless a newer one came.
	Report func(*weirv1.SpeakerStatus) error
	Log    *slog.Logger
}

// Speaker keeps the routers' paths equal to the plan of its inputs.
type Speaker struct {
	cfg    Config
	bgp    BGP
	prober *Prober
	kick   notify.Kick // the inputs changed: sync again
	report chan *weirv1.SpeakerStatus

	mu          sync.Mutex // guards the fields below
	targets     []Target
	haveTargets bool
	revision    uint64 // of targets
	applied     uint64 // the revision of the targets the paths follow
	dead        map[string]bool
	ids         map[string]uint32
	announced   map[PathKey]bgpspeaker.Announcement
	status      []PathStatus
	reported    *weirv1.SpeakerStatus
	warned      map[netip.Addr]bool // routers said to lack ADD-PATH
}

// New makes a speaker announcing through b.
func New(cfg Config, b BGP) *Speaker {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Speaker{cfg: cfg, bgp: b, report: make(chan *weirv1.SpeakerStatus, 1),
		dead: map[string]bool{}, ids: map[string]uint32{}, announced: map[PathKey]bgpspeaker.Announcement{}, warned: map[netip.Addr]bool{}}
	s.prober = NewProber(cfg.Probes, s.poke)
	return s
}

func (s *Speaker) poke() { s.kick.Kick() }

// SetTargets takes the server's newest targets, which reflect every
// write through store revision revision.
func (s *Speaker) SetTargets(targets []Target, revision uint64) {
	keys := map[ProbeKey]bool{}
	for _, t := range targets {
		keys[t.Probe] = true
	}
	s.prober.Set(keys)
	s.mu.Lock()
	s.targets, s.haveTargets, s.revision = targets, true, revision
	s.mu.Unlock()
	s.poke()
}

// MemberChanged takes the membership's word on a node.
func (s *Speaker) MemberChanged(node string, alive bool) {
	s.mu.Lock()
	if alive {
		delete(s.dead, node)
	} else {
		s.dead[node] = true
	}
	s.mu.Unlock()
	if !alive {
		s.cfg.Log.Info("node declared dead by the membership", "node", node)
	}
	s.poke()
}

// WaitReady returns once the speaker has targets and every probe has
// answered once (or ctx ends): only then is its plan worth sending to a
// router, which after a restart replaces the old paths with it.
func (s *Speaker) WaitReady(ctx context.Context) error {
	for {
		s.mu.Lock()
		ready := s.haveTargets
		for _, t := range s.targets {
			ready = ready && s.prober.State(t.Probe).Known
		}
		s.mu.Unlock()
		if ready {
			s.sync(ctx)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Run keeps the paths up to date until ctx ends; sessions are checked
// every second for the status.
func (s *Speaker) Run(ctx context.Context) {
	go s.reporter(ctx)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	defer s.prober.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick.C():
			s.sync(ctx)
		case <-tick.C:
		}
		s.publish(ctx)
	}
}

// sync withdraws the paths the plan dropped and announces the rest.
func (s *Speaker) sync(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want, status := Plan(s.targets, Inputs{
		Probe:       s.prober.State,
		Unreachable: func(n string) bool { return s.dead[n] },
		PathID:      s.pathID,
	})
	s.status = status
	// The tier has no applied state to wait for: it always rises.
	_, failed := bgpspeaker.Reconcile(ctx, s.bgp, s.announced, want, func(k PathKey) netip.Prefix { return k.Prefix }, true, s.cfg.Log)
	// The targets are applied once every path is decided: announced or
	// withdrawn without error, and no target waiting for its first probe
	// in the plan just carried out.
	decided := !failed
	for _, st := range status {
		decided = decided && st.Reason != ReasonProbePending
	}
	if decided {
		s.applied = s.revision
	}
}

// pathID gives each node one path identifier for all its paths. Called
// with mu held.
func (s *Speaker) pathID(node string) uint32 {
	id, ok := s.ids[node]
	if !ok {
		id = uint32(len(s.ids) + 1)
		s.ids[node] = id
	}
	return id
}

// Announced lists the paths announced now.
func (s *Speaker) Announced() map[PathKey]bgpspeaker.Announcement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.announced)
}

// publish sends the status when it changed, and says once per router
// that it did not negotiate ADD-PATH while some prefix has several paths.
func (s *Speaker) publish(ctx context.Context) {
	sessions, err := s.bgp.Sessions(ctx)
	if err != nil {
		s.cfg.Log.Error("listing BGP sessions failed", "error", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	status := append([]PathStatus(nil), s.status...)
	explainSessions(status, sessions)
	multi := false
	for _, st := range status {
		multi = multi || st.Reason == ReasonAddPathNotNegotiate
	}
	st := &weirv1.SpeakerStatus{Name: s.cfg.Name, AppliedRevision: s.applied}
	for _, ses := range sessions {
		if multi && ses.State == "established" && !ses.AddPath && !s.warned[ses.PeerAddress] {
			s.warned[ses.PeerAddress] = true
			s.cfg.Log.Error("router did not negotiate ADD-PATH: it hears one next hop per load-balancer IP instead of all of them; enable ADD-PATH receive for this speaker on the router",
				"peer", ses.PeerAddress)
		}
		bs := nodewire.EncodeSession(report.BGPSession{PeerAddress: ses.PeerAddress, PeerASN: ses.PeerASN, State: ses.State, Since: ses.Since})
		st.Sessions = append(st.Sessions, &weirv1.SpeakerSession{Session: bs, AddPath: ses.AddPath})
	}
	for _, p := range status {
		st.Paths = append(st.Paths, &weirv1.SpeakerPath{
			Prefix: p.Prefix.String(), Service: p.Service, Node: p.Node,
			NextHop: p.NextHop.String(), Weight: p.Weight, Announced: p.Announced, Reason: p.Reason, Probe: p.Probe,
		})
	}
	if proto.Equal(st, s.reported) {
		return
	}
	s.reported = st
	select {
	case <-s.report:
	default:
	}
	s.report <- st
}

// reporter hands statuses to cfg.Report off the sync path, until the
// newest is delivered: a lost report would leave the server showing a
// state the speaker has left until something else changed.
func (s *Speaker) reporter(ctx context.Context) {
	var pending *weirv1.SpeakerStatus
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case pending = <-s.report:
		case <-retry:
		}
		retry = nil
		if pending == nil || s.cfg.Report == nil {
			continue
		}
		if err := s.cfg.Report(pending); err != nil {
			retry = time.After(reportRetry)
			continue
		}
		pending = nil
	}
}

// reportRetry is how long a failed report waits before it is sent again.
const reportRetry = time.Second

// resendStatus makes the next publish send the status even if unchanged.
func (s *Speaker) resendStatus() {
	s.mu.Lock()
	s.reported = nil
	s.mu.Unlock()
	s.poke()
}
