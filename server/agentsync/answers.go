package agentsync

// Answers: what an agent sends back (acknowledgements, refusals,
// reports), the latency they settle, and the bounds on a report.

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirlb/weir/internal/bounded"
	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync/cache"
	"github.com/weirlb/weir/server/observed"
)

func (h *Hub) receiveAnswers(stream weirv1.AgentService_SyncServer, st *observed.Node, inflight *inflight, refused *atomic.Bool, log *slog.Logger) error {
	defer inflight.end()
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		now := h.clock.Now()
		// What needs no shared state is done before the hub's lock, so
		// that thousands of agents answering the same change hold it
		// only to write their own node's fields.
		var settled []time.Time
		var decoded *report.Report
		switch m := req.Message.(type) {
		case *weirv1.SyncRequest_Ack:
			settled = inflight.settle(m.Ack.GetVersion())
		case *weirv1.SyncRequest_Nack:
			// Recorded, never resent: the same state would fail the same
			// way. The next change goes as a whole state.
			inflight.settle(m.Nack.GetVersion())
			refused.Store(true)
			h.metrics.nacks.Inc()
			log.Warn("agent rejected state", "version", m.Nack.GetVersion(), "error", m.Nack.GetError())
		case *weirv1.SyncRequest_Report:
			h.boundReport(m.Report)
			decoded = nodewire.DecodeReport(m.Report)
		}
		var longest time.Duration
		for _, since := range settled {
			h.metrics.programming.Observe(now.Sub(since).Seconds())
			longest = max(longest, now.Sub(since))
		}
		h.mu.Lock()
		st.LastSeen = now
		switch m := req.Message.(type) {
		case *weirv1.SyncRequest_Ack:
			st.AppliedVersion = m.Ack.GetVersion()
			st.LastError, st.LastErrorVersion = "", 0
			if longest > 0 {
				// From the acceptance of the oldest change this answer
				// covers to this node's kernel.
				st.ProgrammingLatency = longest
			}
		case *weirv1.SyncRequest_Nack:
			st.LastError, st.LastErrorVersion = truncate(m.Nack.GetError()), m.Nack.GetVersion()
		case *weirv1.SyncRequest_Report:
			st.Record(decoded)
		}
		h.statusChanged()
		h.mu.Unlock()
	}
}

// inflight remembers, per version sent, when its oldest change was
// accepted, until the agent answers; and who waits for an answer.
type inflight struct {
	mu    sync.Mutex
	sends []sentAt
	// waiters are closed by an answer to their version or a later one,
	// or when the agent's answers end.
	waiters []waiter
	ended   bool
}

type waiter struct {
	version uint64
	done    chan struct{}
}

type sentAt struct {
	version uint64
	since   time.Time
}

func newInflight() *inflight { return &inflight{} }

func (f *inflight) add(version uint64, since time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends = append(f.sends, sentAt{version, since})
}

// answered returns a channel closed when the agent answers version (an
// acknowledgement or a refusal) or a later one, or its answers end.
func (f *inflight) answered(version uint64) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	done := make(chan struct{})
	if f.ended {
		close(done)
	} else {
		f.waiters = append(f.waiters, waiter{version, done})
	}
	return done
}

// end releases every waiter: the agent will answer nothing more.
func (f *inflight) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = true
	for _, w := range f.waiters {
		close(w.done)
	}
	f.waiters = nil
}

// settle removes and returns the sends an answer for version covers, and
// releases its waiters.
func (f *inflight) settle(version uint64) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	waiting := f.waiters[:0]
	for _, w := range f.waiters {
		if w.version <= version {
			close(w.done)
		} else {
			waiting = append(waiting, w)
		}
	}
	f.waiters = waiting
	var out []time.Time
	keep := f.sends[:0]
	for _, s := range f.sends {
		if s.version <= version {
			out = append(out, s.since)
		} else {
			keep = append(keep, s)
		}
	}
	f.sends = keep
	return out
}

// What an agent's report may hold: the server keeps the last one of every
// registered node (until it is deleted), so a report can cost no more than
// the node's share of the cluster.
const (
	maxReportText     = 1024 // bytes of any error or message
	maxReportSessions = 256  // BGP sessions
	maxAnnouncements  = 65536
)

// boundReport drops what a report says of services the server does not
// have (they would be kept for nothing), and cuts its texts and lists to
// the bounds above. It runs before h.mu is taken.
func (h *Hub) boundReport(r *weirv1.Report) {
	r.Services = cache.KeepHeld(h.cache, r.GetServices(), func(s *weirv1.ServiceHealth) string { return s.GetNamespace() + "/" + s.GetName() })
	for _, s := range r.Services {
		s.HealthCheckError = truncate(s.GetHealthCheckError())
	}
	if bgp := r.GetBgp(); bgp != nil {
		if len(bgp.Sessions) > maxReportSessions {
			bgp.Sessions = bgp.Sessions[:maxReportSessions]
		}
		if len(bgp.Announcements) > maxAnnouncements {
			bgp.Announcements = bgp.Announcements[:maxAnnouncements]
		}
	}
}

func truncate(s string) string { return bounded.String(s, maxReportText) }
