package flows

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/report"
)

type fakeCounts struct {
	c   datapath.FlowCounts
	err error
}

func (f *fakeCounts) FlowCounts(context.Context) (datapath.FlowCounts, error) { return f.c, f.err }

// The server hears the counts when they change and whole in a full
// report; a failed reading keeps the last; Prometheus sees the newest.
func TestReporterReportsChanges(t *testing.T) {
	ctx := context.Background()
	f := New(Config{})
	f.next = datapath.FlowPeer{Name: "node2"}
	f.dead = map[string]bool{"node3": true, "node4": false}
	counts := &fakeCounts{}
	r := NewReporter(f, counts)
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return at }

	if got := r.Report(true); got != nil {
		t.Fatalf("report before any reading: %+v; want none", got)
	}
	counts.c = datapath.FlowCounts{PassedPackets: 10, PassedConnections: 2, TakenPackets: [4]uint64{5, 1, 0, 0}, UnownedPackets: 1}
	r.read(ctx)
	want := &report.Report{Full: true, Moved: &report.MovedReport{Next: "node2", NotAnswering: []string{"node3"},
		PassedPackets: 10, PassedConnections: 2, TakenPackets: [4]uint64{5, 1, 0, 0}, UnownedPackets: 1, ChangedAt: at}}
	if diff := cmp.Diff(want, r.Report(true)); diff != "" {
		t.Errorf("first report (-want +got):\n%s", diff)
	}
	at = at.Add(CountPeriod)
	r.read(ctx)
	if got := r.Report(false); got != nil {
		t.Errorf("nothing changed but the time, yet reported %+v", got.Moved)
	}
	// What the tunnel refused goes to Prometheus only: the server
	// hears of no change.
	counts.c.RefusedNotAPeer, counts.c.RefusedNotPassedOn = 5, 2
	r.read(ctx)
	if got := r.Report(false); got != nil {
		t.Errorf("only refused packets changed, yet reported %+v", got.Moved)
	}
	counts.c.PassedPackets, counts.err = 99, errors.New("nft: no table")
	r.read(ctx)
	if got := r.Report(false); got != nil {
		t.Errorf("a failed reading reported %+v", got.Moved)
	}
	counts.err = nil
	r.read(ctx)
	got := r.Report(false)
	if got == nil || got.Moved.PassedPackets != 99 || got.Full {
		t.Fatalf("a change: %+v; want a partial report with 99 packets passed on", got)
	}
	if got := r.Report(true); got == nil || !got.Full {
		t.Errorf("a full report after the change: %+v; want the reading again", got)
	}

	wantMetrics := `
# HELP weir_moved_packets_taken_total Packets that peers passed to this node and that it served, holding their connection, by how many nodes they crossed (1, 2, 3, 4+).
# TYPE weir_moved_packets_taken_total counter
weir_moved_packets_taken_total{hops="1"} 5
weir_moved_packets_taken_total{hops="2"} 1
weir_moved_packets_taken_total{hops="3"} 0
weir_moved_packets_taken_total{hops="4+"} 0
# HELP weir_moved_packets_total Packets of established connections that a router moved to this node and that no entry here took, by what the node did: passed_on (to the next node of the ring) or unowned (round the ring, or no ring: served here as new, and refused by the endpoint).
# TYPE weir_moved_packets_total counter
weir_moved_packets_total{action="passed_on"} 99
weir_moved_packets_total{action="unowned"} 1
# HELP weir_moved_packets_refused_total Packets the tunnel of moved connections dropped, by reason: not_a_peer (sent to its UDP port from an address that is not one of the nodes that pass packets to this one) or not_passed_on (came through it, but not a TCP packet to a load-balancer or external IP, nor a probe).
# TYPE weir_moved_packets_refused_total counter
weir_moved_packets_refused_total{reason="not_a_peer"} 5
weir_moved_packets_refused_total{reason="not_passed_on"} 2
# HELP weir_moved_next_nodes_not_answering Next nodes of the ring of moved connections that this node passes over because they stopped answering its probes, or answer without their rules.
# TYPE weir_moved_next_nodes_not_answering gauge
weir_moved_next_nodes_not_answering 1
`
	if err := testutil.CollectAndCompare(r, strings.NewReader(wantMetrics), "weir_moved_packets_taken_total", "weir_moved_packets_total", "weir_moved_packets_refused_total", "weir_moved_next_nodes_not_answering"); err != nil {
		t.Error(err)
	}
}
