package l2owner

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// The leader's timing defaults.
const (
	// DefaultPeriod is the least time between two computations of the
	// L2 candidates.
	DefaultPeriod = 50 * time.Millisecond
	// DefaultWarmUp bounds how long a server that starts leading waits
	// to hear from every node before it decides L2 owners.
	DefaultWarmUp = 10 * time.Second
)

// Registry is what the leader reads of the registry, and the writes it
// follows.
type Registry interface {
	Read(func(registry.View))
	OnChange(func(registry.Change))
}

// Status is the nodes' status as the hub observes it (agentsync.Hub).
type Status interface {
	Status() []observed.Node
	// StatusChanged is closed at the next change of Status.
	StatusChanged() <-chan struct{}
}

// LeaderConfig is what a Leader decides from and how it is timed.
type LeaderConfig struct {
	Owners   *Owners
	Registry Registry
	Status   Status
	// Clock times the leader (nil: the real clock).
	Clock clock.Clock
	// Period is the least time between two computations of the
	// candidates, WarmUp how long a new leader waits at most to hear
	// from every node (zero: DefaultPeriod, DefaultWarmUp).
	Period, WarmUp time.Duration
	Log            *slog.Logger
}

// Leader decides the L2 owners while its server leads: it has Owners
// answer the nodes' lease streams and gives it, at every change of the
// registry or of a node's status, each L2 address's candidates
// (receive.L2Addresses).
type Leader struct {
	cfg LeaderConfig
	// inputChanged is kicked after every write the candidates may
	// follow.
	inputChanged notify.Kick
	// sawL2 is whether the last look found an L2 pool; only Run's
	// goroutine reads and writes it.
	sawL2 bool
}

// NewLeader returns a leader over cfg; Run does the work.
func NewLeader(cfg LeaderConfig) *Leader {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.WarmUp == 0 {
		cfg.WarmUp = DefaultWarmUp
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	l := &Leader{cfg: cfg}
	cfg.Registry.OnChange(func(ch registry.Change) {
		// The candidates follow a service's own object, a node or its
		// drain, a pool. Not an endpoint slice: the endpoints a node has
		// reach the candidates through its agent's report, a change of
		// its status.
		if len(ch.ServiceObjects) > 0 || len(ch.Nodes) > 0 || len(ch.Pools) > 0 {
			l.inputChanged.Kick()
		}
	})
	return l
}

// Run decides the owners until ctx ends. It may run again after it
// stopped (a replica leading again).
func (l *Leader) Run(ctx context.Context) {
	done, heard := make(chan struct{}), make(chan struct{})
	go func() { l.cfg.Owners.Lead(ctx, heard); close(done) }()
	defer func() { <-done }()
	l.warmUp(ctx)
	close(heard)
	for {
		statusChanged := l.cfg.Status.StatusChanged()
		l.cfg.Owners.SetCandidates(l.look(false).candidates)
		// A node's status changes with every state it is sent and
		// applies: computations are Period apart at least, so a burst
		// of changes costs one more, while a lone change after a quiet
		// spell is taken at once (a change made meanwhile is already
		// signalled). A failing owner is seen sooner by its lease stream
		// (Owners).
		if !l.sleep(ctx, l.cfg.Period) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-l.inputChanged.C():
		case <-statusChanged:
		}
	}
}

// warmUp returns once every registered node's agent is connected, has
// applied a state and, where L2 addresses exist, has asked for its leases
// (and so said which it held), or after at most WarmUp: a server that
// has not heard from the nodes would take addresses from those that hold
// them. Meanwhile the owners keep theirs (Owners.Lead).
func (l *Leader) warmUp(ctx context.Context) {
	timeout := l.cfg.Clock.NewTimer(l.cfg.WarmUp)
	defer timeout.Stop()
	for {
		statusChanged, asked := l.cfg.Status.StatusChanged(), l.cfg.Owners.AskedChanged()
		lk := l.look(true)
		// The addresses bound what the nodes may claim meanwhile.
		l.cfg.Owners.SetCandidates(lk.candidates)
		waiting := lk.waiting(l.cfg.Owners.Asked)
		if len(waiting) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-timeout.C():
			l.cfg.Log.Warn("deciding L2 owners without having heard from every node", "waiting_for", waiting)
			return
		case <-statusChanged:
		case <-asked:
		case <-l.inputChanged.C():
		}
	}
}

// sleep waits d, and reports false when ctx ended first.
func (l *Leader) sleep(ctx context.Context, d time.Duration) bool {
	t := l.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// look is what the leader sees of the cluster at one moment.
type look struct {
	candidates map[netip.Addr][]string // of every L2 address
	nodes      []string                // the registered nodes
	observed   []observed.Node
}

// look reads the nodes' status, then the registry once. The status is
// read only where it is needed: while the leader waits for the nodes
// (forWarmUp), or when an L2 pool exists. A hub's status of every node is
// worked out under the hub's lock, which every state sent to an agent
// takes too: without an L2 pool the leader, woken by every round of
// acknowledgements, would take it for nothing.
func (l *Leader) look(forWarmUp bool) look {
	withStatus := forWarmUp || l.sawL2
	for {
		var lk look
		if withStatus {
			lk.observed = l.cfg.Status.Status()
		}
		var c receive.Cluster
		l2 := false
		l.cfg.Registry.Read(func(v registry.View) {
			lk.nodes = v.NodeNames()
			// Only an L2 pool has L2 addresses: without one, the services
			// are not looked at, however many there are.
			if l2 = slices.ContainsFunc(v.Pools(), func(p *model.AddressPool) bool { return p.L2 != nil }); l2 && withStatus {
				c = receive.ClusterOf(v, lk.observed)
			}
		})
		l.sawL2 = l2
		if l2 && !withStatus {
			withStatus = true // an L2 pool came: read again, with the status
			continue
		}
		if l2 {
			lk.candidates = receive.L2Addresses(c)
		}
		return lk
	}
}

// waiting are the registered nodes not heard from yet, by name: not
// connected, no state applied, or, where L2 addresses exist, no ask for
// their leases (asked).
func (lk look) waiting(asked func(node string) bool) []string {
	l2 := len(lk.candidates) > 0
	ready := map[string]bool{}
	for _, n := range lk.observed {
		ready[n.Node] = n.Connected && n.AppliedVersion > 0 && (!l2 || asked(n.Node))
	}
	var out []string
	for _, name := range lk.nodes {
		if !ready[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
