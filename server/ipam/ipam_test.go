package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
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
		case <-a.wake.C():
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

// An address no load-balancer IP may be (a node's, the server's, one in a
// service range) is never assigned, whatever pool holds it: the next free
// one is; asked for, it is refused with the reason. One assigned before a
// node came to hold it is replaced, and that node's write wakes the
// allocator.
func TestReservedAddressesAreNeverAssigned(t *testing.T) {
	reg := registrytest.Open(t)
	rules := registry.DefaultServiceRules()
	rules.ServerAddrs = []netip.Addr{netip.MustParseAddr("203.0.113.1")}
	rules.ServiceRanges = append(rules.ServiceRanges, netip.MustParsePrefix("203.0.113.2/31"))
	reg.SetServiceRules(rules)
	r, err := model.ParseAddressRange("203.0.113.0/29")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: []model.AddressRange{r}}); err != nil {
		t.Fatal(err)
	}
	node := func(name, addr string) error {
		_, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: name, Source: model.SourceKubernetes}, Addresses: []netip.Addr{netip.MustParseAddr(addr)}})
		return err
	}
	if err := node("n1", "203.0.113.0"); err != nil {
		t.Fatal(err)
	}
	for i, ask := range []string{"", "203.0.113.0"} {
		s := &model.Service{Meta: model.Meta{Namespace: "shop", Name: fmt.Sprintf("s%d", i)}, Type: model.LoadBalancer,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		if ask != "" {
			s.RequestedLoadBalancerIPs = []netip.Addr{netip.MustParseAddr(ask)}
		}
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	a := New(reg, map[string]Writer{model.SourceNative: RegistryWriter{Registry: reg}}, nil)
	round := func() map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, w := range a.Plan() {
			got[w.Service.Key()] = fmt.Sprint(w.IPs, " ", w.Reason, " ", w.Message)
			if err := a.writers[w.Service.Source].WriteStatus(context.Background(), w.Service, w.IPs, w.Reason, w.Message); err != nil {
				t.Fatalf("writing %s: %v", w.Service.Key(), err)
			}
		}
		return got
	}
	got := round()
	if want := "[203.0.113.4]  "; got["shop/s0"] != want {
		t.Errorf("shop/s0 was given %q; want %q (.0 is node n1's, .1 the server's, .2 and .3 a service range's)", got["shop/s0"], want)
	}
	if want := "[] " + ReasonNotAllowed + " 203.0.113.0 is an address of node n1"; !strings.HasPrefix(got["shop/s1"], want) {
		t.Errorf("shop/s1, asking for node n1's address: %q; want %q...", got["shop/s1"], want)
	}
	select {
	case <-a.wake.C():
	default:
	}
	if err := node("n2", "203.0.113.4"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.wake.C():
	default:
		t.Error("a node on an assigned address did not wake the allocator")
	}
	if got := round(); got["shop/s0"] != "[203.0.113.5]  " {
		t.Errorf("once node n2 holds its address, shop/s0 was given %q; want [203.0.113.5]", got["shop/s0"])
	}
}
