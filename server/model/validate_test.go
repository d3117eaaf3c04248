package model

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func okService() *Service {
	return &Service{Meta: Meta{Namespace: "shop", Name: "web"}, Type: ClusterIP,
		ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:                 []ServicePort{{Name: "http", Protocol: TCP, Port: 80}},
		ExternalTrafficPolicy: PolicyCluster, InternalTrafficPolicy: PolicyCluster}
}

// Sizes as Kubernetes sets them, refused naming the field.
func TestSizesAreBoundedAsKubernetesBoundsThem(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	manyPorts := func(n int) []ServicePort {
		var ps []ServicePort
		for i := range n {
			ps = append(ps, ServicePort{Name: fmt.Sprintf("p%d", i), Protocol: TCP, Port: int32(1000 + i)})
		}
		return ps
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Service)
		field string
	}{
		{"a 64-character label value", func(s *Service) { s.Labels = map[string]string{"app": strings.Repeat("a", 64)} }, "metadata.labels"},
		{"a label key with a space", func(s *Service) { s.Labels = map[string]string{"my app": "web"} }, "metadata.labels"},
		{"a label key prefix that is no subdomain", func(s *Service) { s.Labels = map[string]string{"Example.COM/app": "web"} }, "metadata.labels"},
		{"an empty label key", func(s *Service) { s.Labels = map[string]string{"": "web"} }, "metadata.labels"},
		{"a megabyte label", func(s *Service) { s.Labels = map[string]string{"app": strings.Repeat("a", 1<<20)} }, "metadata.labels"},
		{"65 labels", func(s *Service) { s.Labels = many(65) }, "metadata.labels"},
		{"101 ports", func(s *Service) { s.Ports = manyPorts(101) }, "spec.ports"},
	} {
		s := okService()
		tc.edit(s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v; want an error naming %s", tc.name, err, tc.field)
		}
	}
	good := okService()
	good.Labels = map[string]string{"app.kubernetes.io/name": "web", "tier": "", "Example_1.x": "A-b_c.9"}
	good.Ports = manyPorts(100)
	if err := good.Validate(); err != nil {
		t.Errorf("Kubernetes-valid labels and 100 ports: %v", err)
	}

	slice := func(name string, endpoints, addresses int) *EndpointSlice {
		s := &EndpointSlice{Meta: Meta{Namespace: "shop", Name: name}, ServiceName: "web"}
		for i := range endpoints {
			e := Endpoint{}
			for j := range addresses {
				e.Addresses = append(e.Addresses, netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i + j)}))
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		return s
	}
	for name, s := range map[string]*EndpointSlice{
		"a..b name":                 slice("a..b", 1, 1),
		"a 254-character name":      slice(strings.Repeat("a", 254), 1, 1),
		"1001 endpoints":            slice("web-1", 1001, 1),
		"101 addresses of one":      slice("web-1", 1, 101),
		"a name ending with a dot.": slice("web.", 1, 1),
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("slice with %s: accepted", name)
		}
	}
	for name, s := range map[string]*EndpointSlice{"1000 endpoints": slice("web-1.x", 1000, 1), "a 253-character name": slice(strings.Repeat("a", 253), 1, 1)} {
		if err := s.Validate(); err != nil {
			t.Errorf("slice with %s: %v", name, err)
		}
	}
}

func TestPoolsHoldOnlyAssignableAddresses(t *testing.T) {
	pool := func(ranges ...string) *AddressPool {
		p := &AddressPool{Meta: Meta{Name: "p"}}
		for _, r := range ranges {
			pfx := netip.MustParsePrefix(r)
			p.Ranges = append(p.Ranges, AddressRange{First: pfx.Addr(), Last: lastOf(pfx)})
		}
		return p
	}
	for _, bad := range []string{"::/0", "224.0.0.0/24", "ff02::/120", "0.0.0.0/0", "127.0.0.0/30", "169.254.1.0/24", "198.51.100.0/24,239.1.1.0/28"} {
		if err := pool(strings.Split(bad, ",")...).Validate(); err == nil || !strings.Contains(err.Error(), "addresses[") {
			t.Errorf("pool %s: %v; want refused naming the range", bad, err)
		}
	}
	for _, good := range []string{"203.0.113.0/24", "2001:db8::/64", "10.0.0.0/8"} {
		if err := pool(good).Validate(); err != nil {
			t.Errorf("pool %s: %v", good, err)
		}
	}
}

// An L2 pool is answered on interfaces named as Linux names them, and
// announced over BGP too only by several advertisements, never by the
// one a BGP pool has by default.
func TestL2Advertisements(t *testing.T) {
	r := AddressRange{First: netip.MustParseAddr("192.0.2.10"), Last: netip.MustParseAddr("192.0.2.20")}
	for _, c := range []struct {
		what  string
		edit  func(*AddressPool)
		field string
	}{
		{"BGP attributes as well", func(p *AddressPool) { p.BGP.LocalPref = 100 }, "bgp_advertisement"},
		{"an interface name of 16 bytes", func(p *AddressPool) { p.L2.Interfaces = []string{"eth0123456789abc"} }, "l2_advertisement.interfaces[0]"},
		{"an interface name with a slash", func(p *AddressPool) { p.L2.Interfaces = []string{"eth0", "a/b"} }, "l2_advertisement.interfaces[1]"},
		{"an interface given twice", func(p *AddressPool) { p.L2.Interfaces = []string{"eth0", "eth0"} }, "l2_advertisement.interfaces[1]"},
		{"a selector label that is no label", func(p *AddressPool) { p.L2.NodeSelector = map[string]string{"rack/": "a"} }, "l2_advertisement.node_selector"},
	} {
		p := &AddressPool{Meta: Meta{Name: "p"}, Ranges: []AddressRange{r}, L2: &L2Advertisement{}}
		c.edit(p)
		var fe *FieldError
		if err := p.Validate(); !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, c.field) {
			t.Errorf("%s: %v; want refused naming %s", c.what, err, c.field)
		}
	}
	good := &AddressPool{Meta: Meta{Name: "p"}, Ranges: []AddressRange{r},
		L2: &L2Advertisement{Interfaces: []string{"eth0", "bond0.100"}, NodeSelector: map[string]string{"topology.kubernetes.io/zone": "a"}}}
	if err := good.Validate(); err != nil {
		t.Errorf("a good L2 pool: %v", err)
	}
	both := &AddressPool{Meta: Meta{Name: "p"}, Ranges: []AddressRange{r}, L2: &L2Advertisement{NodeSelector: map[string]string{"rack": "a"}},
		BGPAdvertisements: []BGPAdvertisement{{NodeSelector: map[string]string{"rack": "b"}, Peers: []string{"tor"}}}}
	if err := both.Validate(); err != nil {
		t.Errorf("an L2 pool announced over BGP too: %v", err)
	}
}
