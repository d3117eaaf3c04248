package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// One round decides every LoadBalancer service, oldest first: what holds
// stays put and is not written again (Weir's valid addresses, another
// controller's), addresses asked for are given
// or refused with the reason, the others come from the pools in order,
// shared under one key on distinct ports, one per family, all or nothing.
func TestPlanDecidesEveryService(t *testing.T) {
	reg := registrytest.Open(t)
	for name, cidrs := range map[string][]string{"a": {"192.0.2.0/30", "2001:db8::/126"}, "manual": {"198.51.100.0/30"}} {
		p := &model.AddressPool{Meta: model.Meta{Name: name}, ManualOnly: name == "manual"}
		for _, c := range cidrs {
			r, err := model.ParseAddressRange(c)
			if err != nil {
				t.Fatal(err)
			}
			p.Ranges = append(p.Ranges, r)
		}
		if _, err := reg.Pools.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	type svc struct {
		name   string
		edit   func(*model.Service)
		status string // the address in status before the round
	}
	n := 0
	for _, s := range []svc{
		{"s01-other", func(s *model.Service) { s.OtherController = true }, "192.0.2.0"},
		{"s02-held", nil, "192.0.2.1"},
		{"s04-shared-a", func(s *model.Service) { s.AllowSharedIP = "k" }, ""},
		{"s05-shared-b", func(s *model.Service) { s.AllowSharedIP, s.Ports[0].Port = "k", 81 }, ""},
		{"s06-shared-c", func(s *model.Service) { s.AllowSharedIP = "k" }, ""},
		{"s07-asks-taken", func(s *model.Service) { s.RequestedLoadBalancerIPs = addrs("192.0.2.0") }, ""},
		{"s08-asks-outside", func(s *model.Service) { s.RequestedLoadBalancerIPs = addrs("203.0.113.9") }, ""},
		{"s09-asks-wrong-pool", func(s *model.Service) { s.RequestedLoadBalancerIPs, s.AddressPool = addrs("198.51.100.1"), "a" }, ""},
		{"s10-asks-manual", func(s *model.Service) { s.RequestedLoadBalancerIPs = addrs("198.51.100.1") }, ""},
		{"s11-exhausted", nil, ""},
		{"s12-dual-exhausted", func(s *model.Service) { s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr("fd00:96::12")) }, ""},
		{"s13-v6", func(s *model.Service) { s.ClusterIPs = addrs("fd00:96::13") }, ""},
		{"s14-named-manual", func(s *model.Service) { s.AddressPool = "manual" }, ""},
		{"s15-no-pool", func(s *model.Service) { s.AddressPool = "nope" }, ""},
		{"s16-dual-v4-pool", func(s *model.Service) {
			s.AddressPool, s.ClusterIPs = "manual", append(s.ClusterIPs, netip.MustParseAddr("fd00:96::16"))
		}, ""},
		{"s17-held-twice", func(s *model.Service) { s.Ports[0].Port = 81 }, "192.0.2.1"},
	} {
		n++
		m := &model.Service{Meta: model.Meta{Namespace: "shop", Name: s.name}, Type: model.LoadBalancer,
			ClusterIPs: addrs(fmt.Sprintf("10.96.0.%d", n)), Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: int32(30000 + n)}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		if s.edit != nil {
			s.edit(m)
		}
		created, err := reg.Services.Create(m)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.status != "" {
			if err := (RegistryWriter{Registry: reg}).WriteStatus(context.Background(), created, addrs(s.status), "", ""); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
	}
	got := map[string]string{}
	for _, w := range New(reg, nil, nil).Plan() {
		got[w.Service.Name] = fmt.Sprint(w.IPs, " ", w.Reason, " ", w.Message)
	}
	want := map[string]string{
		"s04-shared-a":        "[192.0.2.2]  ",
		"s05-shared-b":        "[192.0.2.2]  ",
		"s06-shared-c":        "[192.0.2.3]  ",
		"s07-asks-taken":      "[] AddressTaken 192.0.2.0 is assigned to shop/s01-other",
		"s08-asks-outside":    "[] NotInAnyPool 203.0.113.9 is in no address pool",
		"s09-asks-wrong-pool": "[] NotInAnyPool 198.51.100.1 is not in pool a",
		"s10-asks-manual":     "[198.51.100.1]  ",
		"s11-exhausted":       "[] PoolExhausted every IPv4 address of the pools this service may use is assigned",
		"s12-dual-exhausted":  "[] PoolExhausted every IPv4 address of the pools this service may use is assigned",
		"s13-v6":              "[2001:db8::]  ",
		"s14-named-manual":    "[198.51.100.0]  ",
		"s15-no-pool":         "[] NoPool no address pool has IPv4 addresses for this service",
		"s16-dual-v4-pool":    "[198.51.100.2]  ",
		"s17-held-twice":      "[] PoolExhausted every IPv4 address of the pools this service may use is assigned",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %q; want %q", name, got[name], w)
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s written (%q): what it holds should stay put, unwritten", name, g)
		}
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}
