package server

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
)

// The L2 owner job works out its candidates again after a write of what
// they follow (a service's object, a node, its drain, a pool), never
// after an endpoint slice's, which reaches them through the agents'
// reports; and its candidates, from the load balancers alone, are those
// every service gives, at every step.
func TestL2CandidatesFollowTheirInputsOnly(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.store.Close()
	for _, n := range []string{"n1", "n2"} {
		s.Agents.SetRemoteStatus(n, &observed.Node{Node: n, Connected: true, SentVersion: 1, AppliedVersion: 1,
			Health: observed.Health{LivezCode: 200, NodeEligible: true}})
	}
	web := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "web"}, Type: model.LoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.100")}}
	other := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "db"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 5432}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	slice := func(addr string) *model.EndpointSlice {
		return &model.EndpointSlice{Meta: model.Meta{Namespace: "shop", Name: "web-1"}, ServiceName: "web",
			Endpoints: []model.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, NodeName: "n1"}}}
	}
	node := func(name, addr string) *model.Node {
		return &model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.MustParseAddr(addr)}}
	}
	noIPs := *web
	noIPs.LoadBalancerIPs = nil
	for _, step := range []struct {
		what  string
		write func() error
		wake  bool
		want  map[netip.Addr][]string
	}{
		{"an L2 pool", func() error {
			_, err := s.Registry.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "l2"}, L2: &model.L2Advertisement{},
				Ranges: []model.AddressRange{{First: netip.MustParseAddr("192.0.2.100"), Last: netip.MustParseAddr("192.0.2.110")}}})
			return err
		}, true, map[netip.Addr][]string{}},
		{"a node", func() error { _, err := s.Registry.Nodes.Create(node("n1", "198.51.100.1")); return err }, true, map[netip.Addr][]string{}},
		{"another node", func() error { _, err := s.Registry.Nodes.Create(node("n2", "198.51.100.2")); return err }, true, map[netip.Addr][]string{}},
		{"a load balancer", func() error { _, err := s.Registry.Services.Create(web); return err }, true,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"a service of no L2 address", func() error { _, err := s.Registry.Services.Create(other); return err }, true,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"its endpoints", func() error { _, err := s.Registry.EndpointSlices.Create(slice("10.0.0.1")); return err }, false,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"one endpoint changed", func() error { _, err := s.Registry.EndpointSlices.Update(slice("10.0.0.2")); return err }, false,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n1", "n2"}}},
		{"a drain", func() error { _, _, err := s.Registry.Drain("n1", time.Time{}); return err }, true,
			map[netip.Addr][]string{netip.MustParseAddr("192.0.2.100"): {"n2"}}},
		{"the load balancer's address taken away", func() error { _, err := s.Registry.Services.Update(&noIPs); return err }, true,
			map[netip.Addr][]string{}},
	} {
		if err := step.write(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		woke := false
		select {
		case <-s.l2InputChanged:
			woke = true
		default:
		}
		if woke != step.wake {
			t.Errorf("%s: the L2 job woken %v; want %v", step.what, woke, step.wake)
		}
		got := s.l2Candidates()
		pools, _ := s.Registry.Pools.List("", nil)
		nodes, _ := s.Registry.Nodes.List("", nil)
		services, _ := s.Registry.Services.List("", nil)
		every := receive.L2Addresses(receive.Cluster{Nodes: nodes, Pools: pools, Services: services, Observed: s.Agents.Status(), Aside: s.Registry.Aside})
		if diff := cmp.Diff(every, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: candidates from the load balancers (+) and from every service (-):\n%s", step.what, diff)
		}
		if diff := cmp.Diff(step.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: candidates (-want +got):\n%s", step.what, diff)
		}
	}
}
