package registry

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
)

// The services with load-balancer IPs are kept with every write: a
// service that gains or loses its addresses, a batch refused or only
// checked, a deletion, another replica's write read back, a restart. At
// every step the index lists what a look at every service finds.
func TestLoadBalancerServicesFollowEveryWrite(t *testing.T) {
	st, r := openTestRegistry(t)
	service := func(name string, clusterIP string, lbIPs ...string) *model.Service {
		s := &model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.LoadBalancer,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		for _, a := range lbIPs {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.MustParseAddr(a))
		}
		return s
	}
	check := func(what string, want ...string) {
		t.Helper()
		var scanned []string // every service looked at, as the index spares its readers
		for key, s := range r.Services.items {
			if len(s.LoadBalancerIPs) > 0 {
				scanned = append(scanned, key)
			}
		}
		slices.Sort(scanned)
		var keys, listed []string
		r.Read(func(v View) {
			keys = v.LoadBalancerServiceKeys()
			for _, s := range v.LoadBalancerServices() {
				listed = append(listed, s.Key())
			}
		})
		slices.Sort(keys)
		if diff := cmp.Diff(want, scanned, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: the services hold other load balancers than the test expects (-want +got):\n%s", what, diff)
		}
		if diff := cmp.Diff(scanned, keys, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: LoadBalancerServiceKeys (-every service +index):\n%s", what, diff)
		}
		if diff := cmp.Diff(scanned, listed, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: LoadBalancerServices, by key (-every service +index):\n%s", what, diff)
		}
	}

	// The addresses come from a pool, as a native service's must.
	pool := &model.AddressPool{Meta: model.Meta{Name: "lb"}, Ranges: []model.AddressRange{{First: netip.MustParseAddr("192.0.2.0"), Last: netip.MustParseAddr("192.0.2.255")}}}
	if _, err := r.Pools.Create(pool); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Services.Create(service("a", "10.96.0.10", "192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	b := service("b", "10.96.0.11")
	b.Type = model.ClusterIP
	if _, err := r.Services.Create(b); err != nil {
		t.Fatal(err)
	}
	check("a created with an address, b without", "shop/a")

	if _, err := r.Services.Update(service("a", "10.96.0.10")); err != nil {
		t.Fatal(err)
	}
	check("a's address taken away", nil...)

	if _, _, err := r.Apply([]model.Object{service("a", "10.96.0.10", "192.0.2.1"), service("b", "10.96.0.11", "192.0.2.2")}, false); err != nil {
		t.Fatal(err)
	}
	check("a batch giving a and b addresses", "shop/a", "shop/b")

	// c is staged before d, whose cluster IP is a's, refuses the batch.
	refused := []model.Object{service("c", "10.96.0.12", "192.0.2.3"), service("d", "10.96.0.10", "192.0.2.4")}
	if _, _, err := r.Apply(refused, false); !errors.Is(err, ErrInUse) {
		t.Fatalf("a batch taking a's cluster IP: %v; want ErrInUse", err)
	}
	check("a refused batch", "shop/a", "shop/b")
	if _, _, err := r.Apply([]model.Object{service("c", "10.96.0.12", "192.0.2.3")}, true); err != nil {
		t.Fatal(err)
	}
	check("a batch only checked", "shop/a", "shop/b")

	if _, err := r.Services.Delete("shop/b", 0, ""); err != nil {
		t.Fatal(err)
	}
	check("b deleted", "shop/a")

	again, err := Open(st)
	if err != nil {
		t.Fatal(err)
	}
	r = again
	check("the registry opened again", "shop/a")

	// Writes another replica made, read back from the store.
	value, err := json.Marshal(service("e", "10.96.0.14", "192.0.2.5"))
	if err != nil {
		t.Fatal(err)
	}
	rev := r.Revision()
	if err := r.putStored(rev+1, []store.Op{{Kind: "services", Key: "shop/e", Value: value}}); err != nil {
		t.Fatal(err)
	}
	check("e read back", "shop/a", "shop/e")
	if err := r.putStored(rev+2, []store.Op{{Kind: "services", Key: "shop/a"}}); err != nil {
		t.Fatal(err)
	}
	check("a's deletion read back", "shop/e")
}
