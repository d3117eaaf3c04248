package agentsync

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// FuzzReport: whatever an agent reports, the server keeps at most the
// health of the services it has, with bounded texts; never a panic.
func FuzzReport(f *testing.F) {
	reg := registrytest.Open(f)
	if _, err := reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "shop", Name: "web"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}); err != nil {
		f.Fatal(err)
	}
	h := New(reg, Config{})
	for _, r := range []*weirv1.Report{
		{Full: true, NodeHealth: &weirv1.NodeHealth{HealthzCode: 200, LivezCode: 200, NodeEligible: true},
			Services: []*weirv1.ServiceHealth{{Namespace: "shop", Name: "web", LocalReady: 2, HealthCheckNodePort: 32000, HealthCheckCode: 200}}},
		{Bgp: &weirv1.BgpSessions{Sessions: []*weirv1.BgpSession{{PeerAddress: "192.0.2.1", State: "established"}},
			Announcements: []*weirv1.BgpAnnouncement{{Prefix: "203.0.113.10/32"}}}, RemovedServices: []string{"shop/web"}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r weirv1.Report
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		st := &observed.Node{}
		h.boundReport(&r)
		st.Record(nodewire.DecodeReport(&r))
		if len(st.Services) > 1 {
			t.Fatalf("kept the health of %d services; the server has 1", len(st.Services))
		}
		for k, s := range st.Services {
			if k != "shop/web" || len(s.HealthCheckError) > maxReportText+len("…") {
				t.Fatalf("kept %q with a %d-byte error", k, len(s.HealthCheckError))
			}
		}
		if len(st.BGPSessions) > maxReportSessions || len(st.BGPAnnouncements) > maxAnnouncements {
			t.Fatalf("kept %d sessions and %d announcements", len(st.BGPSessions), len(st.BGPAnnouncements))
		}
	})
}
