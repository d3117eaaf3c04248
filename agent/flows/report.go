package flows

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/report"
)

// CountPeriod is how often the Reporter reads the kernel's counters of
// moved connections: one netlink dump of each table's counters, which
// the kernel answers without listing the rest of the table.
const CountPeriod = 5 * time.Second

// Counts reads the kernel's counters of moved connections;
// *datapath.Datapath is the real one.
type Counts interface {
	FlowCounts(context.Context) (datapath.FlowCounts, error)
}

// Reporter tells the server and Prometheus what the node did with moved
// connections: where it sends them, which next nodes it passes over, and
// the kernel's counts. An agent syncer Observer.
type Reporter struct {
	flows  *Flows
	counts Counts
	now    func() time.Time

	mu sync.Mutex
	// last is the reading that saw the newest change; sent what the
	// last report said.
	last, sent         report.MovedReport
	haveLast, haveSent bool
	// refused is the newest reading's packets the tunnel refused: for
	// Prometheus only, not the server's status.
	refused refusedCounts
}

// refusedCounts are the packets the tunnel refused, by reason.
type refusedCounts struct{ notAPeer, notPassedOn uint64 }

// NewReporter reports on f with counts.
func NewReporter(f *Flows, counts Counts) *Reporter {
	return &Reporter{flows: f, counts: counts, now: time.Now}
}

// Run reads the counters every CountPeriod until ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	tick := time.NewTicker(CountPeriod)
	defer tick.Stop()
	for {
		r.read(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// read takes one reading; a failed one keeps the last.
func (r *Reporter) read(ctx context.Context) {
	c, err := r.counts.FlowCounts(ctx)
	if err != nil {
		r.flows.cfg.Log.Debug("reading the counters of moved connections", "error", err)
		return
	}
	next, passedOver := r.flows.sendingTo()
	m := report.MovedReport{Next: next, NotAnswering: passedOver, PassedPackets: c.PassedPackets, PassedConnections: c.PassedConnections,
		TakenPackets: c.TakenPackets, UnownedPackets: c.UnownedPackets, ChangedAt: r.now()}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = refusedCounts{notAPeer: c.RefusedNotAPeer, notPassedOn: c.RefusedNotPassedOn}
	if !r.haveLast || !m.Equal(r.last) {
		r.last, r.haveLast = m, true
	}
}

// Received is part of the Observer interface.
func (r *Reporter) Received(datapath.NodeState) {}

// Applied is part of the Observer interface.
func (r *Reporter) Applied(time.Duration) {}

// Report says what changed since the last report; with full, the newest
// reading whatever it is.
func (r *Reporter) Report(full bool) *report.Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.haveLast || (!full && r.haveSent && r.last.Equal(r.sent)) {
		return nil
	}
	r.sent, r.haveSent = r.last, true
	m := r.last
	return &report.Report{Full: full, Moved: &m}
}

// sendingTo is where moved packets go now, and the next nodes passed over.
func (f *Flows) sendingTo() (next string, passedOver []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, dead := range f.dead {
		if dead {
			passedOver = append(passedOver, name)
		}
	}
	slices.Sort(passedOver)
	return f.next.Name, passedOver
}

var (
	movedPacketsDesc = prometheus.NewDesc("weir_moved_packets_total",
		"Packets of established connections that a router moved to this node and that no entry here took, by what the node did: passed_on (to the next node of the ring) or unowned (round the ring, or no ring: served here as new, and refused by the endpoint).",
		[]string{"action"}, nil)
	movedConnectionsDesc = prometheus.NewDesc("weir_moved_connections_passed_total",
		"Connections whose packets this node passed on to the next node of the ring (counted at their first packet here).", nil, nil)
	movedTakenDesc = prometheus.NewDesc("weir_moved_packets_taken_total",
		"Packets that peers passed to this node and that it served, holding their connection, by how many nodes they crossed (1, 2, 3, 4+).",
		[]string{"hops"}, nil)
	movedRefusedDesc = prometheus.NewDesc("weir_moved_packets_refused_total",
		"Packets the tunnel of moved connections dropped, by reason: not_a_peer (sent to its UDP port from an address that is not one of the nodes that pass packets to this one) or not_passed_on (came through it, but not a TCP packet to a load-balancer or external IP, nor a probe).",
		[]string{"reason"}, nil)
	movedNotAnsweringDesc = prometheus.NewDesc("weir_moved_next_nodes_not_answering",
		"Next nodes of the ring of moved connections that this node passes over because they stopped answering its probes, or answer without their rules.", nil, nil)
)

// Describe is part of prometheus.Collector.
func (r *Reporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{movedPacketsDesc, movedConnectionsDesc, movedTakenDesc, movedRefusedDesc, movedNotAnsweringDesc} {
		ch <- d
	}
}

// Collect is part of prometheus.Collector: the newest reading, never a
// wait on the kernel.
func (r *Reporter) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	m, refused := r.last, r.refused
	r.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(movedPacketsDesc, prometheus.CounterValue, float64(m.PassedPackets), "passed_on")
	ch <- prometheus.MustNewConstMetric(movedPacketsDesc, prometheus.CounterValue, float64(m.UnownedPackets), "unowned")
	ch <- prometheus.MustNewConstMetric(movedConnectionsDesc, prometheus.CounterValue, float64(m.PassedConnections))
	for i, hops := range []string{"1", "2", "3", "4+"} {
		ch <- prometheus.MustNewConstMetric(movedTakenDesc, prometheus.CounterValue, float64(m.TakenPackets[i]), hops)
	}
	ch <- prometheus.MustNewConstMetric(movedRefusedDesc, prometheus.CounterValue, float64(refused.notAPeer), "not_a_peer")
	ch <- prometheus.MustNewConstMetric(movedRefusedDesc, prometheus.CounterValue, float64(refused.notPassedOn), "not_passed_on")
	ch <- prometheus.MustNewConstMetric(movedNotAnsweringDesc, prometheus.GaugeValue, float64(len(m.NotAnswering)))
}
