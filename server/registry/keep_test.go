package registry_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

func lbService(ns, name, clusterIP string) *model.Service {
	return &model.Service{Meta: model.Meta{Namespace: ns, Name: name}, Type: model.LoadBalancer,
		ClusterIPs:            []netip.Addr{netip.MustParseAddr(clusterIP)},
		Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
}

// A spec update keeps what Weir wrote of status as stored when the write
// is made; an update that sets the addresses keeps only the reason; the
// request is left as it came, so a write decided again starts from it.
func TestUpdatesKeepWhatTheirRuleSaysOfTheStoredObject(t *testing.T) {
	reg := registrytest.Open(t)
	pool := &model.AddressPool{Meta: model.Meta{Name: "pool"},
		Ranges: []model.AddressRange{{First: netip.MustParseAddr("198.51.100.0"), Last: netip.MustParseAddr("198.51.100.255")}}}
	if _, err := reg.Pools.Create(pool); err != nil {
		t.Fatal(err)
	}
	svc := lbService("shop", "web", "10.96.0.10")
	if _, err := reg.Services.Create(svc); err != nil {
		t.Fatal(err)
	}
	assigned := []netip.Addr{netip.MustParseAddr("198.51.100.10")}
	status := *svc
	status.LoadBalancerIPs, status.AddressReason, status.AddressMessage = assigned, "Shared", "shares an address"
	if _, err := reg.Services.Update(&status); err != nil {
		t.Fatal(err)
	}

	spec := lbService("shop", "web", "10.96.0.10")
	spec.Labels = map[string]string{"team": "shop"}
	got, err := reg.Services.UpdateSpec(spec, false)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := reg.Services.Get(spec.Key())
	if stored != got || !slices.Equal(got.LoadBalancerIPs, assigned) || got.AddressReason != "Shared" || got.Labels["team"] != "shop" {
		t.Errorf("after a spec update: %+v (returned %p, stored %p); want the addresses and reason kept, the label written", stored, got, stored)
	}
	if len(spec.LoadBalancerIPs) != 0 || spec.AddressReason != "" {
		t.Errorf("the request was changed: %+v", spec)
	}

	none := lbService("shop", "web", "10.96.0.10")
	got, err = reg.Services.UpdateKeeping(none, registry.KeepAddressReason, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.LoadBalancerIPs) != 0 || got.AddressReason != "Shared" {
		t.Errorf("after an update that sets no addresses: %+v; want none, and the reason kept", got)
	}

	peer := &model.BGPPeer{Meta: model.Meta{Name: "tor"}, Address: netip.MustParseAddr("192.0.2.1"), ASN: 64512, MyASN: 64513, Password: "s3cret",
		HoldTime: 90 * time.Second}
	if _, err := reg.Peers.Create(peer); err != nil {
		t.Fatal(err)
	}
	again := *peer
	again.Password, again.ResourceVersion, again.ASN = "", 0, 64514
	if got, err := reg.Peers.UpdateSpec(&again, false); err != nil || got.Password != "s3cret" || got.ASN != 64514 {
		t.Errorf("a peer's spec update without a password: %+v, %v; want the password kept", got, err)
	}
}

// A conflict is the claim a service lost, typed, and who holds it (or the
// rule that refuses it); its text is what a service's status shows.
func TestServiceConflictsAreTypedClaims(t *testing.T) {
	reg := registrytest.Open(t)
	rules := registry.DefaultServiceRules()
	rules.ExternalIPCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	reg.SetServiceRules(rules)
	mk := func(ns, name, clusterIP string, age time.Duration, externalIP string) *model.Service {
		s := lbService(ns, name, clusterIP)
		s.Type, s.Source, s.CreateTime = model.NodePort, model.SourceKubernetes, time.Now().Add(-age)
		s.Ports[0].NodePort = 0
		s.ExternalIPs = []netip.Addr{netip.MustParseAddr(externalIP)}
		return s
	}
	older, younger := mk("a", "old", "10.96.0.10", time.Hour, "198.51.100.7"), mk("b", "new", "10.96.0.11", time.Minute, "198.51.100.7")
	for _, s := range []*model.Service{older, younger} {
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	var got []registry.Conflict
	reg.Read(func(v registry.View) {
		if cs := v.ServiceConflicts(older); len(cs) != 0 {
			t.Errorf("the older service lost %v", cs)
		}
		got = v.ServiceConflicts(younger)
	})
	claim := registry.Claim{Field: registry.ExternalIPs, Index: 0, Addr: netip.MustParseAddr("198.51.100.7"), Protocol: model.TCP, Port: 80}
	want := []registry.Conflict{{Claim: claim, Holder: "a/old", Held: claim}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("the younger service's conflicts (-want +got):\n%s", diff)
	}
	if len(got) == 1 && got[0].String() != "spec.external_ips[0]: 198.51.100.7 TCP/80 is a frontend (spec.external_ips) of service a/old" {
		t.Errorf("rendered: %q", got[0].String())
	}
}
