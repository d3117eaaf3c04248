// Package drain keeps the word of an operator's drain on the node. While
// the node is drained it counts, every CountPeriod, the external
// connections the node still serves (its conntrack entries of the TCP
// connections it DNAT'ed to a load-balancer IP, an external IP or one of
// its node ports) and reports the count. When the drain's deadline passes
// it deletes exactly those entries: the connections' next packets find no
// owner on any node, go round the ring of moved connections and are reset
// by an endpoint, so their clients learn at once. It is an observer of the
// state stream (agent/syncer), beside the health checks and the node
// speaker.
package drain

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/internal/report"
)

// CountPeriod is how often a drained node counts what it still serves.
const CountPeriod = 2 * time.Second

// ReportRefresh is how often an unchanged count is reported again, so
// that the status says it is still true; a changed one is reported at
// once.
const ReportRefresh = 10 * time.Second

// Drain follows the node's drain. Run counts and ends connections;
// Received, Applied and Report are the syncer's observer.
type Drain struct {
	ct    Conntrack
	clock clock.WithTicker
	log   *slog.Logger
	// connections is weir_drain_connections.
	connections prometheus.Gauge
	// wake tells Run that the drain or its deadline changed.
	wake notify.Kick

	mu sync.Mutex // guards the fields below
	// drained and deadline are the node's drain as last received;
	// frontends its external frontends, kept only while drained, for
	// the node's addresses.
	drained   bool
	deadline  time.Time
	frontends *frontends
	// counted is the last count, taken at countedAt (zero: none since
	// the drain began).
	counted   int
	countedAt time.Time
	// endedFor is the deadline whose connections were ended (by this
	// process), ended how many.
	endedFor time.Time
	ended    int
	// failing is set while the table cannot be read or changed, so that
	// a failure is logged once, not every count.
	failing bool
	// reported is what the last report said.
	reported report.DrainReport
}

// New returns the node's drain over ct; reg, when not nil, receives
// weir_drain_connections.
func New(ct Conntrack, clk clock.WithTicker, log *slog.Logger, reg prometheus.Registerer) *Drain {
	d := &Drain{ct: ct, clock: clk, log: log,
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_drain_connections",
			Help: "External connections this node still serves while an operator has it drained (conntrack entries of TCP connections it DNAT'ed to a load-balancer IP, an external IP or a node port), counted every 2 s; 0 when it is not drained.",
		})}
	if reg != nil {
		reg.MustRegister(d.connections)
	}
	return d
}

// frontends are the addresses and ports through which clients outside
// the cluster reach the node's services: every TCP port of every
// load-balancer and external IP, and every TCP node port on each of the
// node's addresses. They are kept per service, so that a change costs the
// services it names.
type frontends struct {
	addrs     []netip.Addr // the node's
	byService map[datapath.ServiceKey][]netip.AddrPort
	count     map[netip.AddrPort]int // how many services have each
}

func newFrontends(st datapath.NodeState) *frontends {
	f := &frontends{addrs: st.Node.Addresses, byService: map[datapath.ServiceKey][]netip.AddrPort{}, count: map[netip.AddrPort]int{}}
	for key, svc := range st.Services {
		f.set(key, svc)
	}
	return f
}

// set makes key's frontends those of svc (nil: gone).
func (f *frontends) set(key datapath.ServiceKey, svc *datapath.Service) {
	for _, fe := range f.byService[key] {
		if f.count[fe]--; f.count[fe] == 0 {
			delete(f.count, fe)
		}
	}
	delete(f.byService, key)
	if svc == nil {
		return
	}
	var out []netip.AddrPort
	for _, p := range svc.Ports {
		if p.Protocol != datapath.TCP {
			continue
		}
		for _, ip := range svc.LoadBalancerIPs {
			out = append(out, netip.AddrPortFrom(ip, p.Port))
		}
		for _, ip := range svc.ExternalIPs {
			out = append(out, netip.AddrPortFrom(ip, p.Port))
		}
		if p.NodePort != 0 {
			for _, a := range f.addrs {
				out = append(out, netip.AddrPortFrom(a, p.NodePort))
			}
		}
	}
	for _, fe := range out {
		f.count[fe]++
	}
	if out != nil {
		f.byService[key] = out
	}
}

// frontendSet is the frontends, each with how many services have it: a
// copy for a count that runs without the lock.
type frontendSet map[netip.AddrPort]int

// serves tells whether e is an external connection the node serves: not
// over, DNAT'ed here (its answers come from elsewhere than where the
// client sent it), to one of the node's frontends.
func (f frontendSet) serves(e Entry) bool {
	return !e.State.Ended() && e.ReplySrc != e.Dst && f[e.Dst] > 0
}

// Received takes each new desired state: whether the node is drained,
// until when, and its frontends.
func (d *Drain) Received(st datapath.NodeState) {
	d.mu.Lock()
	switch {
	case !st.Node.Drained:
		d.frontends = nil
	case d.frontends == nil || st.Changed == nil || !slices.Equal(st.Node.Addresses, d.frontends.addrs):
		d.frontends = newFrontends(st)
	default:
		for _, key := range st.Changed {
			d.frontends.set(key, st.Services[key])
		}
	}
	changed := st.Node.Drained != d.drained || !st.Node.DrainDeadline.Equal(d.deadline)
	if !st.Node.Drained {
		d.counted, d.countedAt, d.endedFor, d.ended = 0, time.Time{}, time.Time{}, 0
	} else if !st.Node.DrainDeadline.Equal(d.deadline) {
		d.ended = 0 // what a new deadline ends is yet to come
	}
	d.drained, d.deadline = st.Node.Drained, st.Node.DrainDeadline
	d.mu.Unlock()
	if changed {
		d.wake.Kick()
	}
}

// Applied is nothing to the drain: the connections a node serves do not
// wait for its rules.
func (d *Drain) Applied(time.Duration) {}

// Report gives the drain when it changed, or when its count was last
// reported ReportRefresh ago; in a full report, whenever the node is
// drained.
func (d *Drain) Report(full bool) *report.Report {
	d.mu.Lock()
	defer d.mu.Unlock()
	var now report.DrainReport
	if d.drained {
		now = report.DrainReport{Connections: d.counted, CountedAt: d.countedAt, Deadline: d.deadline, Ended: d.ended}
	}
	was := d.reported
	d.reported = now
	if full {
		if !d.drained {
			return nil // a full report without a drain says the node has none
		}
		return &report.Report{Drain: &now}
	}
	if now.Connections == was.Connections && now.Ended == was.Ended && now.Deadline.Equal(was.Deadline) &&
		now.CountedAt.IsZero() == was.CountedAt.IsZero() && now.CountedAt.Sub(was.CountedAt) < ReportRefresh {
		d.reported = was // an unchanged count keeps its time until the refresh
		return nil
	}
	return &report.Report{Drain: &now}
}

// Run counts what the node serves while it is drained, every CountPeriod
// and whenever the drain changes, and ends it at the deadline, until ctx
// ends.
func (d *Drain) Run(ctx context.Context) {
	tick := d.clock.NewTicker(CountPeriod)
	defer tick.Stop()
	for {
		checked := d.clock.Now()
		d.Check()
		var atDeadline <-chan time.Time
		var timer clock.Timer
		// A deadline Check has not seen pass yet. One it saw pass, and
		// could not keep (the table failing), is tried again at the next
		// count, not in a loop.
		if deadline, ok := d.pendingDeadline(); ok && deadline.After(checked) {
			timer = d.clock.NewTimer(max(deadline.Sub(d.clock.Now()), 0))
			atDeadline = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-tick.C():
		case <-d.wake.C():
		case <-atDeadline:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// pendingDeadline is the drain's deadline while it is still to be kept.
func (d *Drain) pendingDeadline() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.drained || d.deadline.IsZero() || d.endedFor.Equal(d.deadline) {
		return time.Time{}, false
	}
	return d.deadline, true
}

// Check counts what the node serves, when it is drained, and ends it once
// the deadline has passed (once per deadline; again after a restart of
// the agent, which ends what came since).
func (d *Drain) Check() {
	d.mu.Lock()
	drained, deadline := d.drained, d.deadline
	var f frontendSet
	if d.frontends != nil {
		// A copy: Received changes the frontends in place.
		f = maps.Clone(d.frontends.count)
	}
	due := drained && !deadline.IsZero() && !d.clock.Now().Before(deadline) && !d.endedFor.Equal(deadline)
	d.mu.Unlock()
	if !drained {
		d.connections.Set(0)
		return
	}
	if due {
		n, err := d.ct.Delete(f.serves)
		if d.failed("ending the connections the drained node still serves", err) {
			return // tried again at the next count
		}
		d.log.Info("drain deadline passed: ended the external connections the node still served; their clients are reset",
			"connections", n, "deadline", deadline)
		d.mu.Lock()
		if d.deadline.Equal(deadline) {
			d.endedFor, d.ended = deadline, n
		}
		d.mu.Unlock()
	}
	entries, err := d.ct.List()
	if d.failed("counting the connections the drained node still serves", err) {
		return
	}
	n := 0
	for _, e := range entries {
		if f.serves(e) {
			n++
		}
	}
	d.connections.Set(float64(n))
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.drained {
		d.counted, d.countedAt = n, d.clock.Now()
	}
}

// failed logs err, once while the table keeps failing, and says whether
// there was one.
func (d *Drain) failed(what string, err error) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		if d.failing {
			d.log.Info("the conntrack table answers again")
		}
		d.failing = false
		return false
	}
	if !d.failing {
		d.log.Error(what, "error", err)
	}
	d.failing = true
	return true
}
