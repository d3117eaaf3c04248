package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A pool split by service and node selectors: which advertisements
// announce a service's addresses, and through which nodes.
func TestSeveralAdvertisementsSelectByServiceAndNode(t *testing.T) {
	pool := &AddressPool{Meta: Meta{Name: "public"}, BGPAdvertisements: []BGPAdvertisement{
		{ServiceSelector: map[string]string{"env": "prod"}, Communities: []uint32{65000<<16 | 1}},
		{ServiceSelector: map[string]string{"env": "dev"}, NodeSelector: map[string]string{"rack": "r1"}, Communities: []uint32{65000<<16 | 2}},
		{NodeSelector: map[string]string{"edge": "true"}},
	}}
	prod := &Service{Meta: Meta{Name: "shop", Labels: map[string]string{"env": "prod"}}}
	dev := &Service{Meta: Meta{Name: "test", Labels: map[string]string{"env": "dev"}}}
	other := &Service{Meta: Meta{Name: "misc"}}
	r1, r2, edge := map[string]string{"rack": "r1"}, map[string]string{"rack": "r2"}, map[string]string{"rack": "r2", "edge": "true"}
	for _, tc := range []struct {
		name string
		svc  *Service
		node map[string]string
		want []int // the advertisements that apply
	}{
		{"prod on any node", prod, r2, []int{0}},
		{"dev on its rack", dev, r1, []int{1}},
		{"dev on another rack", dev, r2, nil},
		{"an edge node announces every service", other, edge, []int{2}},
		{"an unselected service on a plain node: nothing", other, r1, nil},
		{"prod on an edge node: both", prod, edge, []int{0, 2}},
	} {
		var got []int
		for i := range pool.BGPAdvertisements {
			if pool.Advertises(i, tc.svc, tc.node) {
				got = append(got, i)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: advertisements (-want +got):\n%s", tc.name, diff)
		}
	}
	if diff := cmp.Diff([]string{"public#1", "public#2"}, pool.AdvertisementsFor(dev)); diff != "" {
		t.Errorf("names for dev (-want +got):\n%s", diff)
	}
	if got := pool.AdvertisementsFor(&Service{Meta: Meta{Labels: map[string]string{"env": "qa"}}}); got != nil && len(got) != 1 {
		t.Errorf("names for an unselected service: %v", got)
	}
	single := &AddressPool{Meta: Meta{Name: "old"}, BGP: BGPAdvertisement{LocalPref: 100}}
	if single.Selective() || single.AdvertisementsFor(prod) != nil {
		t.Errorf("a pool with one advertisement is not selective")
	}
}

func TestAvoidBuggyIPsIsIPv4EndingIn0Or255(t *testing.T) {
	p := &AddressPool{AvoidBuggyIPs: true}
	for addr, want := range map[string]bool{
		"203.0.113.0": true, "203.0.113.255": true, "203.0.113.1": false, "203.0.113.254": false,
		"2001:db8::": false, "2001:db8::ff": false,
	} {
		if got := p.Avoids(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Avoids(%s) = %v, want %v", addr, got, want)
		}
	}
	if (&AddressPool{}).Avoids(netip.MustParseAddr("203.0.113.0")) {
		t.Errorf("a pool without avoid_buggy_ips gives out .0")
	}
}

func TestNamespaceSelectorScopesAPool(t *testing.T) {
	p := &AddressPool{Allocation: &ServiceAllocation{NamespaceSelector: map[string]string{"tenant": "a"}}}
	in := &Service{Meta: Meta{Namespace: "shop"}, NamespaceLabels: map[string]string{"tenant": "a"}}
	out := &Service{Meta: Meta{Namespace: "other"}, NamespaceLabels: map[string]string{"tenant": "b"}}
	if !p.Allows(in) || p.Allows(out) || p.Allows(&Service{}) {
		t.Errorf("namespace selector: in %v, out %v, unlabelled %v", p.Allows(in), p.Allows(out), p.Allows(&Service{}))
	}
	if got := p.Allocation.Scope(); got != "namespaces labelled tenant=a" {
		t.Errorf("scope %q", got)
	}
}

// Each refused naming the field, as the API edge reports it.
func TestAdvertisementsAreValidatedByField(t *testing.T) {
	ok := func() *AddressPool {
		return &AddressPool{Meta: Meta{Name: "p"}, Ranges: []AddressRange{{netip.MustParseAddr("203.0.113.0"), netip.MustParseAddr("203.0.113.255")}},
			BGPAdvertisements: []BGPAdvertisement{{ServiceSelector: map[string]string{"env": "prod"}}, {NodeSelector: map[string]string{"rack": "r1"}, AggregationLength: 24}}}
	}
	if err := ok().Validate(); err != nil {
		t.Fatalf("a valid pool: %v", err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*AddressPool)
		field string
	}{
		{"both forms", func(p *AddressPool) { p.BGP.LocalPref = 100 }, "bgp_advertisements:"},
		{"with L2 and bgp_advertisement", func(p *AddressPool) {
			p.L2 = &L2Advertisement{}
			p.BGP.LocalPref = 100
		}, "bgp_advertisement:"},
		{"a bad node selector", func(p *AddressPool) { p.BGPAdvertisements[1].NodeSelector = map[string]string{"bad key": "x"} }, "bgp_advertisements[1].node_selector"},
		{"a bad service selector", func(p *AddressPool) { p.BGPAdvertisements[0].ServiceSelector = map[string]string{"k": "bad value"} }, "bgp_advertisements[0].service_selector"},
		{"service selector with aggregation", func(p *AddressPool) { p.BGPAdvertisements[0].AggregationLength = 24 }, "bgp_advertisements[0].service_selector"},
		{"aggregation outside the pool", func(p *AddressPool) { p.BGPAdvertisements[1].AggregationLength = 16 }, "bgp_advertisements[1].aggregation_length"},
		{"a bad peer", func(p *AddressPool) { p.BGPAdvertisements[1].Peers = []string{"Bad_Peer"} }, "bgp_advertisements[1].peers[0]"},
		{"max announcing nodes", func(p *AddressPool) { p.BGPAdvertisements[1].MaxAnnouncingNodes = 2 }, "bgp_advertisements[1].max_announcing_nodes"},
		{"a selector on the one advertisement", func(p *AddressPool) {
			p.BGPAdvertisements = nil
			p.BGP.NodeSelector = map[string]string{"rack": "r1"}
		}, "bgp_advertisement:"},
		{"a bad namespace selector", func(p *AddressPool) {
			p.Allocation = &ServiceAllocation{NamespaceSelector: map[string]string{"bad key": "x"}}
		}, "service_allocation.namespace_selector"},
		{"a bad L2 service selector", func(p *AddressPool) {
			p.BGPAdvertisements = nil
			p.L2 = &L2Advertisement{ServiceSelector: map[string]string{"bad key": "x"}}
		}, "l2_advertisement.service_selector"},
	} {
		p := ok()
		tc.edit(p)
		if err := p.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.field) {
			t.Errorf("%s: %v; want an error starting %q", tc.name, err, tc.field)
		}
	}
}

// An L2 pool is announced over BGP as well when it has advertisements,
// each way by its own nodes; without them it is answered over L2 alone,
// and a pool without L2 is announced over BGP as it always was.
func TestAnL2PoolWithAdvertisementsIsAnnouncedBothWays(t *testing.T) {
	svc := &Service{Meta: Meta{Namespace: "shop", Name: "web"}}
	rackB := map[string]string{"rack": "b"}
	for _, c := range []struct {
		name             string
		pool             AddressPool
		l2, bgp, several bool
		advertisements   int
	}{
		{"BGP by default", AddressPool{}, false, true, false, 1},
		{"L2 alone", AddressPool{L2: &L2Advertisement{}}, true, false, false, 0},
		{"L2 and BGP", AddressPool{L2: &L2Advertisement{NodeSelector: map[string]string{"rack": "a"}},
			BGPAdvertisements: []BGPAdvertisement{{NodeSelector: rackB}}}, true, true, true, 1},
	} {
		p := c.pool
		p.Name = "pool"
		if p.AnsweredOverL2() != c.l2 || p.AnnouncedOverBGP() != c.bgp || p.Selective() != c.several || len(p.Advertisements()) != c.advertisements {
			t.Errorf("%s: over L2 %v, over BGP %v, selective %v, %d advertisements; want %v, %v, %v, %d", c.name,
				p.AnsweredOverL2(), p.AnnouncedOverBGP(), p.Selective(), len(p.Advertisements()), c.l2, c.bgp, c.several, c.advertisements)
		}
		if c.several {
			if got := p.AdvertisementsFor(svc); !slices.Equal(got, []string{"pool#0"}) {
				t.Errorf("%s: the service's advertisements are %v; want [pool#0]", c.name, got)
			}
			if p.Advertises(0, svc, map[string]string{"rack": "a"}) || !p.Advertises(0, svc, rackB) {
				t.Errorf("%s: the BGP advertisement's node selector is not the L2 one's", c.name)
			}
		}
	}
}
