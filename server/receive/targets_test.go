package receive

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/server/announcers"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/observed"
)

func TestTargets(t *testing.T) {
	vip, localVIP := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("203.0.113.6")
	pool := &model.AddressPool{Meta: model.Meta{Name: "public"},
		Ranges: []model.AddressRange{{First: netip.MustParseAddr("203.0.113.0"), Last: netip.MustParseAddr("203.0.113.15")}},
		BGP: model.BGPAdvertisement{MaxAnnouncingNodes: 1, Communities: []uint32{64500<<16 | 1},
			LargeCommunities: []bgpcommunity.Large{{Global: 4200000001, Local1: 1, Local2: 2}}}}
	cluster := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "web"}, LoadBalancerIPs: []netip.Addr{vip}}
	local := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "cart"}, LoadBalancerIPs: []netip.Addr{localVIP},
		ExternalTrafficPolicy: model.PolicyLocal, HealthCheckNodePort: 32000}
	var nodes []*model.Node
	var seen []observed.Node
	for i, name := range []string{"node1", "node2", "node3", "node4"} {
		nodes = append(nodes, &model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)})}})
		n := healthyNode(nil)
		n.Node = name
		n.Services = map[string]observed.Service{"shop/cart": {LocalReady: i, HealthCheckCode: 503}}
		if i > 0 {
			n.Services["shop/cart"] = observed.Service{LocalReady: i, HealthCheckCode: 200}
		}
		seen = append(seen, n)
	}
	seen[3].Connected = false
	// Another controller's service is none of the tier's business, even
	// with an address in a Weir pool.
	other := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "theirs"}, LoadBalancerIPs: []netip.Addr{pool.Ranges[0].Last}, OtherController: true}
	got := Targets(Cluster{Nodes: nodes, Pools: []*model.AddressPool{pool}, Services: []*model.Service{local, cluster, other},
		Observed: seen, Aside: func(n string) model.Aside { return model.Aside{Drained: n == "node2"} }})
	if len(got) != 2 || got[0].Address != vip || got[1].Address != localVIP {
		t.Fatalf("targets for %v; want %v and %v in order", got, vip, localVIP)
	}
	// Cluster: node2 is drained and node4 disconnected; of the two left,
	// the pool's limit of one keeps the one the speakers choose.
	want := announcers.Choose(nodestate.AnnouncedPrefix(pool, vip).String(), []string{"node1", "node3"}, 1)
	var names []string
	for _, tg := range got[0].Targets {
		names = append(names, tg.Node)
		if tg.HealthCheckPort != NodeHealthPort || tg.HealthCheckPath != "/healthz" || tg.Weight != 0 {
			t.Errorf("%s probed at %d%s with weight %d; want kube-proxy's /healthz on %d, unweighted", tg.Node, tg.HealthCheckPort, tg.HealthCheckPath, tg.Weight, NodeHealthPort)
		}
	}
	slices.Sort(want)
	if !slices.Equal(names, want) || !slices.Equal(got[0].Communities, pool.BGP.Communities) || !slices.Equal(got[0].LargeCommunities, pool.BGP.LargeCommunities) {
		t.Errorf("%s goes to %v with communities %v %v; want %v with %v %v", vip, names, got[0].Communities, got[0].LargeCommunities, want,
			pool.BGP.Communities, pool.BGP.LargeCommunities)
	}
	// Local: node1 has no ready endpoint; the others are weighted by
	// theirs and probed on the service's health-check node port.
	if l := got[1].Targets; len(l) != 1 || l[0].Node != "node3" || l[0].Weight != 2 || l[0].HealthCheckPort != 32000 || l[0].HealthCheckPath != "/" ||
		l[0].Address != netip.MustParseAddr("192.0.2.13") {
		t.Errorf("%s goes to %+v; want node3 (192.0.2.13) alone, weight 2, probed at :32000/", localVIP, l)
	}
}

// A pool with several advertisements: a load-balancer-tier speaker sends
// each service's traffic only to the nodes an advertisement that selects
// the service selects, and announces it with those advertisements'
// attributes.
func TestTargetsFollowSeveralAdvertisements(t *testing.T) {
	prodVIP, devVIP := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("203.0.113.6")
	pool := &model.AddressPool{Meta: model.Meta{Name: "public"},
		Ranges: []model.AddressRange{{First: netip.MustParseAddr("203.0.113.0"), Last: netip.MustParseAddr("203.0.113.15")}},
		BGPAdvertisements: []model.BGPAdvertisement{
			{ServiceSelector: map[string]string{"env": "prod"}, Communities: []uint32{64500<<16 | 1}, LocalPref: 100},
			{ServiceSelector: map[string]string{"env": "dev"}, NodeSelector: map[string]string{"rack": "r2"}, Communities: []uint32{64500<<16 | 2}},
		}}
	prod := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "prod", Labels: map[string]string{"env": "prod"}}, LoadBalancerIPs: []netip.Addr{prodVIP}}
	dev := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "dev", Labels: map[string]string{"env": "dev"}}, LoadBalancerIPs: []netip.Addr{devVIP}}
	var nodes []*model.Node
	var seen []observed.Node
	for i, name := range []string{"node1", "node2"} {
		nodes = append(nodes, &model.Node{Meta: model.Meta{Name: name, Labels: map[string]string{"rack": fmt.Sprintf("r%d", i+1)}},
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)})}})
		n := healthyNode(nil)
		n.Node = name
		seen = append(seen, n)
	}
	got := map[string]string{}
	for _, v := range Targets(Cluster{Nodes: nodes, Pools: []*model.AddressPool{pool}, Services: []*model.Service{prod, dev}, Observed: seen}) {
		var names []string
		for _, tg := range v.Targets {
			names = append(names, tg.Node)
		}
		got[v.Service] = fmt.Sprintf("%v communities %v local-pref %d", names, v.Communities, v.LocalPreference)
	}
	want := map[string]string{
		"shop/prod": fmt.Sprintf("[node1 node2] communities [%d] local-pref 100", 64500<<16|1),
		"shop/dev":  fmt.Sprintf("[node2] communities [%d] local-pref 0", 64500<<16|2),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
}
