package syncer

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/weirlb/weir/agent/bgp"
	"github.com/weirlb/weir/agent/drain"
	"github.com/weirlb/weir/agent/health"
	"github.com/weirlb/weir/agent/l2"
	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/bgpspeaker/bgpfake"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// benchNode is the node the bench's states are for.
const benchNode = "node0"

// benchService is service i of the datapath issue's workload: one TCP
// port, 10 ready endpoints spread over 50 nodes (so one service in five
// has one on this node), and every hundredth a LoadBalancer with a node
// port. variant changes the first endpoint's address: one endpoint
// changed.
func benchService(i, variant int) *weirv1.NodeService {
	ip := func(base byte, n int) string {
		return fmt.Sprintf("%d.%d.%d.%d", base, byte(n>>16), byte(n>>8), byte(n))
	}
	port := &weirv1.NodeServicePort{Name: "http", Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: 80}
	for j := range 10 {
		addr := ip(10, 16*i+j) // 10.0.0.0/8 holds 16 addresses per service up to a million
		if j == 0 && variant != 0 {
			addr = ip(10, 16*i+10+variant)
		}
		port.Endpoints = append(port.Endpoints, &weirv1.NodeEndpoint{Address: addr, Port: 8080,
			NodeName: fmt.Sprintf("node%d", (i+j)%50), Ready: true, Serving: true})
	}
	s := &weirv1.NodeService{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i),
		ClusterIps: []string{ip(100, i)}, Ports: []*weirv1.NodeServicePort{port}}
	if i%100 == 0 {
		port.NodePort = int32(30000 + (i/100)%2700)
		s.LoadBalancerIps = []string{ip(198, i/100)}
	}
	return s
}

// nopApplier programs nothing: the bench measures the agent, not nft.
type nopApplier struct{}

func (nopApplier) Apply(context.Context, datapath.NodeState) error { return nil }
func (nopApplier) Resync(context.Context) error                    { return nil }

// BenchmarkOneEndpointChange is the agent's CPU for one endpoint change
// at a growing number of services: the message decoded and merged into
// the state, the observers the agent runs (node health and health checks,
// the BGP announcer over a recording speaker, the drain, the L2 asker)
// told, and the report that follows built and encoded. The datapath is a
// stub: its own partial sync is benchmarked in datapath/.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			log := slog.New(slog.DiscardHandler)
			nodeHealth := health.NewAgent(time.Hour, health.ServiceLimits, log, nil)
			defer nodeHealth.Services.Close()
			leases := l2.NewLeases(clock.RealClock{}, func(l2.Owned) error { return nil })
			obs := Observers{
				nodeHealth,
				drain.New(nil, clock.RealClock{}, log, nil),
				bgp.NewAnnouncer(&benchSpeaker{}, func() bool { return true }, log),
				l2.NewAsker(nil, benchNode, leases, clock.RealClock{}, log),
			}
			s := New(Config{NodeName: benchNode}, nil, nopApplier{}, obs, log)
			ctx := context.Background()
			full := &weirv1.SyncResponse{Version: 1, Full: true, Node: &weirv1.NodeInfo{Name: benchNode, Addresses: []string{"192.0.2.10"}, Registered: true}}
			for i := range n {
				full.Upserts = append(full.Upserts, benchService(i, 0))
			}
			if a := s.handle(ctx, full); a.GetAck() == nil {
				b.Fatalf("the whole state: %v", a)
			}
			full = nil
			s.obs.Report(true)
			// Changes to 256 services spread over the range, each there
			// and back, so that every message changes something.
			const spread = 256
			var changes []*weirv1.SyncResponse
			for variant := range 2 {
				for k := range spread {
					i := (k * 7919) % n
					changes = append(changes, &weirv1.SyncResponse{Upserts: []*weirv1.NodeService{benchService(i, 1-variant)}})
				}
			}
			// The setup's garbage is not the changes' to collect.
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			for op := range b.N {
				msg := changes[op%len(changes)]
				msg.Version = uint64(op + 2)
				if a := s.handle(ctx, msg); a.GetAck() == nil {
					b.Fatalf("change %d: %v", op, a)
				}
				if r := s.obs.Report(false); r != nil {
					splitReport(reportToProto(r).GetReport(), ReportChunk)
				}
			}
		})
	}
}

// benchSpeaker is a BGP speaker that takes everything and records
// nothing, so that the bench does not grow a log.
type benchSpeaker struct{ bgpfake.Recorder }

func (*benchSpeaker) Announce(context.Context, netip.Prefix, bgpspeaker.Announcement) error {
	return nil
}
func (*benchSpeaker) Withdraw(context.Context, netip.Prefix, bgpspeaker.Announcement) error {
	return nil
}
func (*benchSpeaker) SetPeers(context.Context, []bgpspeaker.Peer) error             { return nil }
func (*benchSpeaker) SetExportRules(context.Context, []bgpspeaker.ExportRule) error { return nil }
func (*benchSpeaker) Close()                                                        {}
