// Package syncer is the agent's side of the state stream: it keeps the
// node's desired state as the server sends it, applies every version to the
// datapath, answers ACK or NACK, and reconnects (to the next replica, then
// with backoff) when the server goes away, while the kernel keeps
// forwarding on the last good rules.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/internal/report"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/recv"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Applier programs a node's state; *datapath.Datapath is the real one.
// The state's Services map is the syncer's own and changes after Apply
// returns (the *Service values in it never do): an Applier keeps the
// values it needs, never the map.
type Applier interface {
	Apply(context.Context, datapath.NodeState) error
	Resync(context.Context) error
}

// Observer follows what the syncer receives and applies, and has something
// to report to the server; the node's health (*health.Agent) is one.
type Observer interface {
	// Received sees each new desired state before it is applied. Its
	// Changed names the services that may differ from the state last
	// received (nil: any may); a node whose NodeInfo differs may mean
	// every service looks different to the observer. The Services map is
	// the syncer's own and changes after Received returns: an observer
	// keeps what it needs from it, never the map.
	Received(datapath.NodeState)
	// Applied sees each successful apply.
	Applied(took time.Duration)
	// Report returns what changed since the last report (everything when
	// full), or nil.
	Report(full bool) *report.Report
}

// Observers fans events out to several observers and merges their
// reports.
type Observers []Observer

func (os Observers) Received(st datapath.NodeState) {
	for _, o := range os {
		o.Received(st)
	}
}

func (os Observers) Applied(took time.Duration) {
	for _, o := range os {
		o.Applied(took)
	}
}

func (os Observers) Report(full bool) *report.Report {
	var out *report.Report
	for _, o := range os {
		switch r := o.Report(full); {
		case r == nil:
		case out == nil:
			out = r
		default:
			out.Merge(r)
		}
	}
	return out
}

// ReportPeriod is how often the syncer looks for health changes that no
// state change caused (a node going stale, say) to report them.
const ReportPeriod = time.Second

// Config is how the syncer runs.
type Config struct {
	NodeName     string
	AgentVersion string
	// ResyncPeriod is how often the whole table is rewritten, repairing
	// rules someone else changed.
	ResyncPeriod time.Duration
	// RetryPeriod is how soon a failed apply is tried again.
	RetryPeriod time.Duration
	// MaxBackoff caps the wait between reconnection attempts (default 1 s,
	// so that agents are back within a second of a server's return).
	MaxBackoff time.Duration
	// Metrics receives the syncer's metrics when not nil.
	Metrics prometheus.Registerer
}

// metrics follow kube-proxy's names where it has them.
type metrics struct {
	syncDuration prometheus.Histogram
	lastSync     prometheus.Gauge
	failures     prometheus.Counter
	version      prometheus.Gauge
	lastQueued   prometheus.Gauge
	pending      prometheus.Gauge
	// stale is 1 per reason the kernel may not hold what the server
	// wants: no stream to a server, or the newest state not applied.
	// Set, never read under the syncer's lock: a scrape must not wait
	// for an apply that hangs.
	stale *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weir_sync_proxy_rules_duration_seconds",
			Help:    "How long applying a state to the kernel took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_sync_proxy_rules_last_timestamp_seconds", Help: "When a state was last applied successfully.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_sync_proxy_rules_failures_total", Help: "States that could not be applied (each one NACKed).",
		}),
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_sync_applied_version", Help: "The last state version applied.",
		}),
		lastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "When a state or change last arrived from the server (kube-proxy's hang signal: above weir_sync_proxy_rules_last_timestamp_seconds for long, the agent is not applying).",
		}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "weir_agent_configuration_stale",
			Help: "1 while the kernel may not hold what the server wants, by reason: disconnected (no state stream to a server; forwarding on the last state) or not_applied (the newest state received is not in the kernel: refused, failed, or still being applied; forwarding on the last one applied).",
		}, []string{"reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_sync_proxy_rules_pending_changes",
			Help: "Services changed since the last successful apply (every service after a whole state): 0 unless an apply is failing, hung or under way.",
		}),
	}
	m.stale.WithLabelValues("disconnected").Set(1)
	m.stale.WithLabelValues("not_applied").Set(0)
	if reg != nil {
		reg.MustRegister(m.syncDuration, m.lastSync, m.failures, m.version, m.lastQueued, m.stale, m.pending)
	}
	return m
}

// Syncer keeps one node in step with the server.
type Syncer struct {
	cfg     Config
	conn    grpc.ClientConnInterface
	dp      Applier
	obs     Observer
	log     *slog.Logger
	metrics *metrics

	mu sync.Mutex // guards the fields below
	// state is the desired state as received. Its Services map is changed
	// in place, key by key, so that a change costs the same at 100,000
	// services as at 10; the *Service values in it are never changed.
	state datapath.NodeState
	// changed names the services the messages since the last successful
	// apply touched, for the datapath to look at those alone; nil when
	// not known (a whole state came). unheard is the same since the
	// observers last received a state.
	changed, unheard map[datapath.ServiceKey]bool
	received         uint64 // version of state
	applied          uint64 // last version applied successfully
	// receivedHistory and appliedHistory are the histories of received
	// and applied (SyncResponse.history).
	receivedHistory, appliedHistory string
	lastErr                         error // why state is not applied, if it is not
	synced                          time.Time
	partial                         bool // state holds the first parts of a version still arriving
	// assembling is the version whose parts are arriving, and pieces the
	// services its parts have carried so far: a service that comes again
	// in a later part of the same version is joined, not replaced.
	assembling uint64
	pieces     map[datapath.ServiceKey]bool
	// before is the state as it was when the version's first part came,
	// for a refused part to take the state back to.
	before   undo
	rejected uint64 // a version refused, whose later parts are ignored
	// missing is a version refused since the last whole state: a delta
	// after it would be applied without it, and answered as if the
	// kernel held what the server sent. Until a whole state comes, every
	// delta is refused too (the server answers a refusal with a whole
	// state at its next change).
	missing uint64
}

// New returns a syncer for conn's server. obs may be nil.
func New(cfg Config, conn grpc.ClientConnInterface, dp Applier, obs Observer, log *slog.Logger) *Syncer {
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = 5 * time.Minute
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = time.Second
	}
	if obs == nil {
		obs = noObserver{}
	}
	s := &Syncer{cfg: cfg, conn: conn, dp: dp, obs: obs, log: log,
		state: datapath.NodeState{Services: map[datapath.ServiceKey]*datapath.Service{}}}
	s.metrics = newMetrics(cfg.Metrics)
	return s
}

// Status is what the syncer has done so far.
type Status struct {
	ReceivedVersion, AppliedVersion uint64
	LastError                       error
	LastSync                        time.Time
}

// Status returns the syncer's progress.
func (s *Syncer) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{ReceivedVersion: s.received, AppliedVersion: s.applied, LastError: s.lastErr, LastSync: s.synced}
}

// Run keeps streaming until ctx ends. When conn is one of several
// replicas (*dial.Servers), a stream that ends moves it to the next.
func (s *Syncer) Run(ctx context.Context) error {
	retry := dial.NewReconnect(s.conn, s.cfg.MaxBackoff)
	for {
		server := retry.Server()
		gotState, err := s.session(ctx, server, retry.AcceptStale(), retry.WaitForReady())
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := retry.Ended(err, gotState)
		// A move to another replica within a round is Debug: a round of
		// refusals would otherwise be as many warnings.
		level := slog.LevelWarn
		if !gotState && wait == 0 {
			level = slog.LevelDebug
		}
		s.log.Log(ctx, level, "stream to server ended; keeping the programmed rules and reconnecting",
			"server", server, "error", err, "next", retry.Server(), "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// session runs one stream to server (the replica conn is on, or "" for a
// plain conn); gotState reports whether the server sent anything.
func (s *Syncer) session(ctx context.Context, server string, acceptStale, waitForReady bool) (gotState bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// WaitForReady (with one server): while the server is away the call
	// waits for the connection (which the dialer retries every half
	// second at most) instead of failing at once, so the stream is back
	// as soon as the server is.
	stream, err := weirv1.NewAgentServiceClient(s.conn).Sync(ctx, grpc.WaitForReady(waitForReady))
	if err != nil {
		return false, err
	}
	msgs, recvErr := recv.Pump(ctx, stream.Recv, 0)
	if err := s.hello(stream, acceptStale); err != nil {
		return false, recv.SendError(ctx, err, msgs, recvErr)
	}
	reports := time.NewTicker(ReportPeriod)
	defer reports.Stop()
	// One timer: the retry of a failed apply when there is one, else the
	// periodic resync.
	ss := &stateSession{s: s, stream: stream, fullReport: true, timer: time.NewTimer(s.cfg.ResyncPeriod)}
	defer ss.timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return gotState, ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				err = errors.New("server closed the stream")
			}
			return gotState, err
		case msg := <-msgs:
			if !gotState {
				s.log.Info("streaming state from server", "server", server, "accept_stale", acceptStale)
				s.metrics.stale.WithLabelValues("disconnected").Set(0)
				defer s.metrics.stale.WithLabelValues("disconnected").Set(1)
			}
			s.metrics.lastQueued.SetToCurrentTime()
			gotState = true
			err = ss.answer(ctx, msg)
		case <-reports.C:
			err = ss.report()
		case <-ss.timer.C:
			err = ss.resync(ctx)
		}
		if err != nil {
			return gotState, recv.SendError(ctx, err, msgs, recvErr)
		}
	}
}

// hello opens a stream: what the node has applied, or nothing when it
// needs a whole state.
func (s *Syncer) hello(stream weirv1.AgentService_SyncClient, acceptStale bool) error {
	s.mu.Lock()
	applied, history := s.applied, s.appliedHistory
	if s.partial || s.missing != 0 {
		// A state broke off half-way, or a refused version is missing:
		// ask for a whole one.
		applied = 0
	}
	s.mu.Unlock()
	return stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{
		NodeName: s.cfg.NodeName, AppliedVersion: applied, AppliedHistory: history, AgentVersion: s.cfg.AgentVersion,
		AcceptStale: acceptStale,
	}}})
}

// stateSession is one Sync stream's sending side: the node's reports
// and answers, and the timer of the next resync or retry.
type stateSession struct {
	s          *Syncer
	stream     weirv1.AgentService_SyncClient
	fullReport bool // the first report of a stream is whole
	timer      *time.Timer
}

// answer applies one message and, once a version is whole, answers it.
func (ss *stateSession) answer(ctx context.Context, msg *weirv1.SyncResponse) error {
	answer := ss.s.handle(ctx, msg)
	if answer == nil {
		return nil // more parts to come
	}
	// What the node now reports goes first: when the server hears the
	// ACK, it already knows the health of the state acknowledged (the
	// load-balancer tier's targets and WaitProgrammed rely on it).
	if err := ss.report(); err != nil {
		return err
	}
	if err := ss.stream.Send(answer); err != nil {
		return err
	}
	ss.rearm()
	return nil
}

// report sends what the observers have to report, if anything.
func (ss *stateSession) report() error {
	r := ss.s.obs.Report(ss.fullReport)
	if r == nil {
		return nil
	}
	ss.fullReport = false
	for _, part := range splitReport(reportToProto(r).GetReport(), ReportChunk) {
		if err := ss.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: part}}); err != nil {
			return err
		}
	}
	return nil
}

// resync rewrites the tables, or retries a failed apply, and answers
// when a retry succeeds.
func (ss *stateSession) resync(ctx context.Context) error {
	answer := ss.s.resync(ctx)
	ss.rearm()
	if answer == nil {
		return nil
	}
	return ss.stream.Send(answer)
}

// rearm sets the timer: the retry while an apply fails, else the resync.
func (ss *stateSession) rearm() {
	ss.s.mu.Lock()
	failing := ss.s.lastErr != nil
	ss.s.mu.Unlock()
	if failing {
		ss.timer.Reset(ss.s.cfg.RetryPeriod)
	} else {
		ss.timer.Reset(ss.s.cfg.ResyncPeriod)
	}
}

// handle folds one message into the desired state, applies it and returns
// the answer. A message that cannot be decoded changes nothing.
func (s *Syncer) handle(ctx context.Context, msg *weirv1.SyncResponse) *weirv1.SyncRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rejected != 0 && msg.GetVersion() == s.rejected {
		return nil // the rest of a version already refused
	}
	if s.missing != 0 && !msg.GetFull() && (!s.partial || msg.GetVersion() != s.assembling) {
		s.rejected = msg.GetVersion()
		return nack(msg.GetVersion(), fmt.Errorf("version %d, refused before, is missing from this change: waiting for a whole state", s.missing))
	}
	if !s.partial || msg.GetVersion() != s.assembling {
		s.assembling, s.pieces = msg.GetVersion(), map[datapath.ServiceKey]bool{}
		s.before = undo{node: s.state.Node, replaced: map[datapath.ServiceKey]*datapath.Service{}}
	}
	d, err := decode(msg, s.cfg.NodeName)
	if err != nil {
		s.log.Error("rejecting state from server", "version", msg.GetVersion(), "error", err)
		// Earlier parts of the version make no sense without this one.
		s.before.restore(&s.state)
		if msg.GetMore() || s.partial {
			// Nor do later ones: ask for a whole state on the next
			// stream.
			s.partial = true
		}
		s.rejected, s.missing = msg.GetVersion(), msg.GetVersion()
		s.metrics.stale.WithLabelValues("not_applied").Set(1)
		return nack(msg.GetVersion(), err)
	}
	if msg.GetFull() {
		s.missing = 0 // a whole state has everything
	}
	s.fold(msg.GetFull(), d)
	if msg.GetMore() {
		// Part of a bigger state: apply and answer once it is whole.
		s.partial = true
		return nil
	}
	s.partial, s.received, s.receivedHistory = false, msg.GetVersion(), msg.GetHistory()
	s.before = undo{} // the version is whole: nothing to go back to, nor to keep
	s.metrics.stale.WithLabelValues("not_applied").Set(1)
	if s.changed == nil {
		s.metrics.pending.Set(float64(len(s.state.Services)))
	} else {
		s.metrics.pending.Set(float64(len(s.changed)))
	}
	s.obs.Received(withChanged(s.state, s.unheard))
	s.unheard = map[datapath.ServiceKey]bool{} // what follows is a change from this
	return s.applyLocked(ctx)
}

// withChanged is st naming the services in changed (nil: not known). No
// change is an empty list, not nil, which would mean every service.
func withChanged(st datapath.NodeState, changed map[datapath.ServiceKey]bool) datapath.NodeState {
	if changed != nil {
		st.Changed = slices.AppendSeq(make([]datapath.ServiceKey, 0, len(changed)), maps.Keys(changed))
	}
	return st
}

func (s *Syncer) applyLocked(ctx context.Context) *weirv1.SyncRequest {
	start := time.Now()
	if err := s.dp.Apply(ctx, withChanged(s.state, s.changed)); err != nil {
		s.metrics.failures.Inc()
		s.lastErr = err
		s.log.Error("applying state failed; the last good rules stay in place", "version", s.received, "error", err)
		return nack(s.received, err)
	}
	took := time.Since(start)
	s.changed = map[datapath.ServiceKey]bool{} // what follows is a change from this
	s.applied, s.appliedHistory, s.lastErr, s.synced = s.received, s.receivedHistory, nil, time.Now()
	s.obs.Applied(took)
	s.metrics.syncDuration.Observe(took.Seconds())
	s.metrics.lastSync.SetToCurrentTime()
	s.metrics.version.Set(float64(s.applied))
	s.metrics.stale.WithLabelValues("not_applied").Set(0)
	s.metrics.pending.Set(0)
	s.log.Debug("applied state", "version", s.received, "services", len(s.state.Services), "took", took)
	return &weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: s.received}}}
}

// resync retries a failed apply, or rewrites the table from the applied
// state; it returns an answer for the server when the retry settles a version.
func (s *Syncer) resync(ctx context.Context) *weirv1.SyncRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr != nil {
		if answer := s.applyLocked(ctx); answer.GetAck() != nil {
			return answer
		}
		return nil // already nacked this version
	}
	start := time.Now()
	if err := s.dp.Resync(ctx); err != nil {
		s.lastErr = err
		s.log.Error("periodic resync failed", "error", err)
		return nil
	}
	s.synced = time.Now()
	s.obs.Applied(time.Since(start))
	return nil
}

func nack(version uint64, err error) *weirv1.SyncRequest {
	return &weirv1.SyncRequest{Message: &weirv1.SyncRequest_Nack{Nack: &weirv1.Nack{Version: version, Error: err.Error()}}}
}

// decoded is one message, decoded whole before any of it changes the
// state: a message that cannot be decoded changes nothing.
type decoded struct {
	node     *datapath.NodeInfo // nil: unchanged
	upserts  []*datapath.Service
	removals []datapath.ServiceKey
}

func decode(msg *weirv1.SyncResponse, node string) (decoded, error) {
	var d decoded
	if msg.GetNode() != nil {
		n, err := nodewire.DecodeNode(msg.GetNode())
		if err != nil {
			return decoded{}, err
		}
		d.node = &n
	}
	d.upserts = make([]*datapath.Service, 0, len(msg.GetUpserts()))
	for _, ws := range msg.GetUpserts() {
		svc, err := nodewire.DecodeService(ws, node)
		if err != nil {
			return decoded{}, err
		}
		d.upserts = append(d.upserts, svc)
	}
	d.removals = make([]datapath.ServiceKey, 0, len(msg.GetRemovals()))
	for _, key := range msg.GetRemovals() {
		ns, name, ok := strings.Cut(key, "/")
		if !ok || ns == "" || name == "" {
			return decoded{}, fmt.Errorf("removal %q is not namespace/name", key)
		}
		d.removals = append(d.removals, datapath.ServiceKey{Namespace: ns, Name: name})
	}
	return d, nil
}

// fold brings the state to what d says, in place: a whole state (full)
// replaces the services, a change replaces or removes the services it
// names. Every *Service replaced stays as it was, so that the datapath
// sees which ones changed by comparing pointers. The services earlier
// parts of the same version carried are joined with this part's (a
// service bigger than one message comes in several, each with every
// port and some of the endpoints).
func (s *Syncer) fold(full bool, d decoded) {
	if full {
		s.before.replaceAll(s.state.Services)
		s.state.Services = make(map[datapath.ServiceKey]*datapath.Service, len(d.upserts))
		s.changed = nil
		s.unheard = nil
	}
	if d.node != nil {
		s.state.Node = *d.node
	}
	set := func(key datapath.ServiceKey, svc *datapath.Service) {
		s.before.note(key, s.state.Services)
		if svc == nil {
			delete(s.state.Services, key)
		} else {
			s.state.Services[key] = svc
		}
		// Since a whole state (nil), every service is compared anyway.
		if s.changed != nil {
			s.changed[key] = true
		}
		if s.unheard != nil {
			s.unheard[key] = true
		}
	}
	for _, svc := range d.upserts {
		// A piece whose service a part removed since starts it anew.
		if prev := s.state.Services[svc.Key]; s.pieces[svc.Key] && prev != nil {
			svc = joinPieces(prev, svc)
		}
		set(svc.Key, svc)
		s.pieces[svc.Key] = true
	}
	for _, key := range d.removals {
		set(key, nil)
	}
}

// undo takes the state back to what it was before a version's first
// part, at the cost of what the version's parts changed.
type undo struct {
	node datapath.NodeInfo
	// whole is the services as they were, when a part replaced them all
	// (a whole state); replaced holds what the parts replaced in that map
	// before (nil: the service was absent).
	whole    map[datapath.ServiceKey]*datapath.Service
	replaced map[datapath.ServiceKey]*datapath.Service
}

// note remembers what key was in services, unless it is remembered
// already or services is a map the version made whole.
func (u *undo) note(key datapath.ServiceKey, services map[datapath.ServiceKey]*datapath.Service) {
	if u.whole != nil {
		return
	}
	if _, ok := u.replaced[key]; !ok {
		u.replaced[key] = services[key]
	}
}

// replaceAll remembers services, about to be replaced whole.
func (u *undo) replaceAll(services map[datapath.ServiceKey]*datapath.Service) {
	if u.whole == nil {
		u.whole = services
	}
}

// restore takes st back to what it was before the version, and forgets
// what it remembered.
func (u *undo) restore(st *datapath.NodeState) {
	if u.whole != nil {
		st.Services = u.whole
	}
	for key, svc := range u.replaced {
		if svc == nil {
			delete(st.Services, key)
		} else {
			st.Services[key] = svc
		}
	}
	st.Node = u.node
	*u = undo{node: u.node, replaced: map[datapath.ServiceKey]*datapath.Service{}}
}

// joinPieces is a service with the endpoints of both pieces, port by port.
// Neither piece is changed.
func joinPieces(a, b *datapath.Service) *datapath.Service {
	out := *a
	out.Ports = slices.Clone(a.Ports)
	for _, bp := range b.Ports {
		i := slices.IndexFunc(out.Ports, func(p datapath.ServicePort) bool {
			return p.Name == bp.Name && p.Protocol == bp.Protocol && p.Port == bp.Port
		})
		if i < 0 {
			out.Ports = append(out.Ports, bp)
			continue
		}
		out.Ports[i].Endpoints = append(slices.Clip(out.Ports[i].Endpoints), bp.Endpoints...)
	}
	return &out
}

type noObserver struct{}

func (noObserver) Received(datapath.NodeState) {}
func (noObserver) Applied(time.Duration)       {}
func (noObserver) Report(bool) *report.Report  { return nil }

// ReportChunk is the most services one report message carries, so that a
// node with very many services never sends a message the server refuses
// for its size (and then reconnects to send it again).
const ReportChunk = 1000

// splitReport cuts a report into messages of at most n services: the first
// carries everything else (and replaces the server's record when full),
// the rest only add services, and the last carries the removals.
func splitReport(r *weirv1.Report, n int) []*weirv1.Report {
	if len(r.GetServices()) <= n {
		return []*weirv1.Report{r}
	}
	// r is the caller's own, new for this send: its first part is r itself.
	services, removed := r.Services, r.RemovedServices
	r.Services, r.RemovedServices = services[:n], nil
	parts := []*weirv1.Report{r}
	for rest := services[n:]; len(rest) > 0; {
		k := min(n, len(rest))
		parts = append(parts, &weirv1.Report{Services: rest[:k]})
		rest = rest[k:]
	}
	parts[len(parts)-1].RemovedServices = removed
	return parts
}

// reportToProto is the wire form of a health report.
func reportToProto(r *report.Report) *weirv1.SyncRequest {
	return &weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: nodewire.EncodeReport(r)}}
}
