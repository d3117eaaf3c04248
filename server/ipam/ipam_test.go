package ipam

import (
	"net/netip"
	"testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// TestScopedPoolsServeTheirServicesFirst: a pool scoped to namespaces or
// service labels gives addresses to those services only, even asked for
// one by address, and is tried before the pools that are not scoped, in
// priority order.
func TestScopedPoolsServeTheirServicesFirst(t *testing.T) {
	reg := registrytest.Open(t)
	pool := func(name, cidr string, alloc *model.ServiceAllocation) {
		r, err := model.ParseAddressRange(cidr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: name}, Ranges: []model.AddressRange{r}, Allocation: alloc}); err != nil {
			t.Fatal(err)
		}
	}
	pool("open", "198.51.100.0/30", nil)
	pool("team-a", "203.0.113.0/30", &model.ServiceAllocation{Priority: 1, Namespaces: []string{"team-a"}})
	pool("gold", "203.0.113.8/30", &model.ServiceAllocation{Priority: 2, ServiceSelector: map[string]string{"tier": "gold"}})
	n := 0
	svc := func(ns, name string, labels map[string]string, ask ...string) {
		n++
		s := &model.Service{Meta: model.Meta{Namespace: ns, Name: name, Labels: labels}, Type: model.LoadBalancer,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(n)})}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: int32(30000 + n)}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		for _, a := range ask {
			s.RequestedLoadBalancerIPs = append(s.RequestedLoadBalancerIPs, netip.MustParseAddr(a))
		}
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	svc("team-a", "web", nil)
	svc("team-b", "web", nil)
	svc("team-b", "shiny", map[string]string{"tier": "gold"})
	svc("team-a", "shiny", map[string]string{"tier": "gold"})
	svc("team-b", "sneaky", nil, "203.0.113.2")
	got := map[string]string{}
	for _, w := range New(reg, nil, nil).Plan() {
		got[w.Service.Key()] = w.Reason
		for _, ip := range w.IPs {
			got[w.Service.Key()] += ip.String()
		}
	}
	for key, want := range map[string]string{
		"team-a/web":    "203.0.113.0",  // its namespace's pool before the open one
		"team-b/web":    "198.51.100.0", // no scoped pool allows it
		"team-b/shiny":  "203.0.113.8",  // the labelled pool
		"team-a/shiny":  "203.0.113.1",  // both allow it: priority 1 first
		"team-b/sneaky": ReasonNotAllowed,
	} {
		if got[key] != want {
			t.Errorf("%s: %q, want %q", key, got[key], want)
		}
	}
}

// The allocator is woken by what an allocation follows (a service's own
// object, a pool), never by endpoints: an endpoint slice's change, the
// most frequent write, costs it no round over every LoadBalancer service.
func TestOnlyServicesAndPoolsWakeTheAllocator(t *testing.T) {
	reg := registrytest.Open(t)
	a := New(reg, nil, nil)
	woken := func() bool {
		select {
		case <-a.wake:
			return true
		default:
			return false
		}
	}
	svc := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "web"}, Type: model.LoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	for _, step := range []struct {
		what  string
		write func() error
		wake  bool
	}{
		{"a service is created", func() error { _, err := reg.Services.Create(svc); return err }, true},
		{"its endpoints are created", func() error {
			_, err := reg.EndpointSlices.Create(&model.EndpointSlice{Meta: model.Meta{Namespace: "shop", Name: "web-1"}, ServiceName: "web",
				Endpoints: []model.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}}, Ports: []model.EndpointPort{{Protocol: model.TCP, Port: 8080}}})
			return err
		}, false},
		{"its endpoints change", func() error {
			_, err := reg.EndpointSlices.Update(&model.EndpointSlice{Meta: model.Meta{Namespace: "shop", Name: "web-1"}, ServiceName: "web",
				Endpoints: []model.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.2")}}}, Ports: []model.EndpointPort{{Protocol: model.TCP, Port: 8080}}})
			return err
		}, false},
		{"a pool is created", func() error {
			r, err := model.ParseAddressRange("198.51.100.0/30")
			if err != nil {
				return err
			}
			_, err = reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "open"}, Ranges: []model.AddressRange{r}})
			return err
		}, true},
	} {
		woken() // what came before
		if err := step.write(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if got := woken(); got != step.wake {
			t.Errorf("%s: the allocator woken %v, want %v", step.what, got, step.wake)
		}
	}
}
