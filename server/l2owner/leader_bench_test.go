package l2owner

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// BenchmarkL2Round is one round of the L2 leader (Leader.Run) at a
// growing number of services, every hundredth a LoadBalancer with an
// address from an L2 pool, and 10 nodes whose agents applied their
// state: the candidates of every L2 address worked out and handed to the
// owners, unchanged. A round follows a change to the registry or to a
// node's status (each acknowledgement is one), at most every Period.
func BenchmarkL2Round(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			reg := registrytest.Open(b)
			st := &fakeStatus{}
			objs := []model.Object{&model.AddressPool{Meta: model.Meta{Name: "l2"}, L2: &model.L2Advertisement{},
				Ranges: []model.AddressRange{{First: netip.MustParseAddr("172.16.0.0"), Last: netip.MustParseAddr("172.16.255.255")}}}}
			for i := range n {
				// Cluster IPs from 10.96.0.1: the range's network address is
				// no service's.
				ip := i + 1
				svc := &model.Service{Meta: model.Meta{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, Type: model.ClusterIP,
					ClusterIPs:            []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + ip>>16), byte(ip >> 8), byte(ip)})},
					Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
					ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
				if i%100 == 0 {
					svc.Type = model.LoadBalancer
					svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{172, 16, byte(i / 100 >> 8), byte(i / 100)})}
				}
				objs = append(objs, svc)
				if len(objs) >= 2000 || i == n-1 {
					if _, _, err := reg.Apply(objs, false); err != nil {
						b.Fatal(err)
					}
					objs = objs[:0]
				}
			}
			var nodes []string
			for k := range 10 {
				node := fmt.Sprintf("node%d", k)
				if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: node}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + k)})}}); err != nil {
					b.Fatal(err)
				}
				nodes = append(nodes, node)
			}
			// As the hub would report them: connected, their state applied.
			st.set(nodes...)
			o := NewOwners(clocktesting.NewFakeClock(time.Unix(0, 0)), testTTL, testMargin, slog.New(slog.DiscardHandler), nil)
			l := NewLeader(LeaderConfig{Owners: o, Registry: reg, Status: st})
			candidates := l.look(false).candidates
			if len(candidates) != (n+99)/100 {
				b.Fatalf("%d L2 addresses; want %d", len(candidates), (n+99)/100)
			}
			for a, nodes := range candidates {
				if len(nodes) != 10 {
					b.Fatalf("%s: candidates %v; want every node", a, nodes)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				o.SetCandidates(l.look(false).candidates)
			}
		})
	}
}
