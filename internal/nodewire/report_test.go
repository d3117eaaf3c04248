package nodewire

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// What an agent reports reaches the server as it was said: the server
// decides receive verdicts on the decoded form.
func TestReportRoundTrip(t *testing.T) {
	since := time.Date(2026, 11, 25, 1, 0, 0, 7, time.UTC)
	for _, r := range []*report.Report{
		{Full: true, Node: report.NodeReport{HealthzCode: 200, LivezCode: 200, NodeEligible: true, LastUpdated: since},
			Services: []report.ServiceReport{{Namespace: "shop", Name: "web", LocalReady: 2, LocalServing: 3, LocalTerminating: 1,
				HealthCheckNodePort: 32000, HealthCheckCode: 503, HealthCheckError: "address in use"}},
			LastSync: 3 * time.Millisecond,
			BGP: &report.BGPReport{
				Sessions: []report.BGPSession{{PeerAddress: netip.MustParseAddr("2001:db8::1"), PeerASN: 64500, State: "established", Since: since,
					LastError: "hold timer expired", Families: []report.BGPFamily{{Name: "ipv6", Negotiated: true, Sent: 4, Received: 2, Accepted: 1}}}},
				Announcements: []report.BGPAnnouncement{{Prefix: netip.MustParsePrefix("203.0.113.0/28"), NextHop: netip.MustParseAddr("192.0.2.11"), Weight: 2}},
			}},
		{Removed: []string{"shop/web"}},
		{BGP: &report.BGPReport{Sessions: []report.BGPSession{}}}, // a speaker with no sessions left
		{Moved: &report.MovedReport{Next: "node2", NotAnswering: []string{"node3"}, PassedPackets: 10, PassedConnections: 2,
			TakenPackets: [4]uint64{5, 4, 3, 2}, UnownedPackets: 1, ChangedAt: since}},
		{Moved: &report.MovedReport{}}, // no ring, nothing counted
		{Drain: &report.DrainReport{Connections: 12, CountedAt: since, Deadline: since.Add(10 * time.Minute), Ended: 3}},
		{Drain: &report.DrainReport{Connections: 4, CountedAt: since}}, // drained without a deadline
		{Drain: &report.DrainReport{}}, // no longer drained
	} {
		b, err := proto.Marshal(EncodeReport(r))
		if err != nil {
			t.Fatal(err)
		}
		var w weirv1.Report
		if err := proto.Unmarshal(b, &w); err != nil {
			t.Fatal(err)
		}
		got := DecodeReport(&w)
		if d := cmp.Diff(r, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) }),
			cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
			t.Errorf("(-sent +read):\n%s", d)
		}
	}
}
