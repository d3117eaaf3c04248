package nodestate

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

func ptr[T any](v T) *T { return &v }

func TestServiceResolvesEndpoints(t *testing.T) {
	reg := registrytest.Open(t)
	mustCreate := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(reg.Services.Create(&model.Service{
		Meta: model.Meta{Namespace: "default", Name: "web"}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080},
			{Name: "metrics", Protocol: model.TCP, Port: 9090},
		},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyLocal,
	}))
	ep := func(ip, node string) model.Endpoint {
		return model.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(ip)}, NodeName: node}
	}
	terminating := ep("10.244.2.12", "node2")
	terminating.Ready, terminating.Terminating = ptr(false), ptr(true)
	// Slice a names its ports; slice b lists none, so the target port applies.
	mustCreate(reg.EndpointSlices.Create(&model.EndpointSlice{
		Meta: model.Meta{Namespace: "default", Name: "web-a"}, ServiceName: "web",
		Endpoints: []model.Endpoint{ep("10.244.1.11", "node1"), terminating},
		Ports:     []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8081}},
	}))
	mustCreate(reg.EndpointSlices.Create(&model.EndpointSlice{
		Meta: model.Meta{Namespace: "default", Name: "web-b"}, ServiceName: "web",
		Endpoints: []model.Endpoint{ep("10.244.2.11", "node2"), ep("10.244.1.11", "node1")},
	}))
	mustCreate(reg.Services.Create(&model.Service{
		Meta: model.Meta{Namespace: "default", Name: "other-proxy", Labels: map[string]string{ProxyNameLabel: "someone-else"}}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster,
	}))

	var got *datapath.Service
	var skipped *datapath.Service
	reg.Read(func(v registry.View) {
		got = Service(v, "default/web", nil)
		skipped = Service(v, "default/other-proxy", nil)
	})
	if skipped != nil {
		t.Errorf("a service labelled for another proxy was forwarded: %+v", skipped)
	}
	a := netip.MustParseAddr
	want := []datapath.ServicePort{
		{Name: "http", Protocol: datapath.TCP, Port: 80, Endpoints: []datapath.Endpoint{
			{Addr: a("10.244.1.11"), Port: 8080, NodeName: "node1", Ready: true, Serving: true}, // from web-b, target port
			{Addr: a("10.244.1.11"), Port: 8081, NodeName: "node1", Ready: true, Serving: true}, // from web-a, named port
			{Addr: a("10.244.2.11"), Port: 8080, NodeName: "node2", Ready: true, Serving: true},
			{Addr: a("10.244.2.12"), Port: 8081, NodeName: "node2", Serving: true, Terminating: true},
		}},
		{Name: "metrics", Protocol: datapath.TCP, Port: 9090, Endpoints: []datapath.Endpoint{
			// web-a names only "http", so it serves no metrics; web-b serves all on the target port.
			{Addr: a("10.244.1.11"), Port: 9090, NodeName: "node1", Ready: true, Serving: true},
			{Addr: a("10.244.2.11"), Port: 9090, NodeName: "node2", Ready: true, Serving: true},
		}},
	}
	if diff := cmp.Diff(want, got.Ports, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("ports as node1 forwards them (-want +got):\n%s", diff)
	}
	if got.InternalTrafficPolicy != datapath.Local {
		t.Errorf("internal traffic policy lost")
	}
}

func TestNodeGetsThePeersThatSelectIt(t *testing.T) {
	reg := registrytest.Open(t)
	for _, n := range []*model.Node{
		{Meta: model.Meta{Name: "node1", Labels: map[string]string{"rack": "r1"}}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")}},
		{Meta: model.Meta{Name: "node2", Labels: map[string]string{"rack": "r2"}}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}},
	} {
		if _, err := reg.Nodes.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*model.BGPPeer{
		{Meta: model.Meta{Name: "everyone"}, Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64512},
		{Meta: model.Meta{Name: "r1-only"}, Address: netip.MustParseAddr("192.0.2.254"), ASN: 64501, MyASN: 64512, Port: 1179,
			NodeSelector: map[string]string{"rack": "r1"}, GracefulRestart: true,
			EBGPMultihopTTL: 2, SourceAddress: netip.MustParseAddr("198.51.100.7"), Keepalive: 10 * time.Second, ConnectRetry: 5 * time.Second},
	} {
		if _, err := reg.Peers.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	// A peer without the nodes' AS is refused.
	if _, err := reg.Peers.Create(&model.BGPPeer{Meta: model.Meta{Name: "bad"}, Address: netip.MustParseAddr("192.0.2.2"), ASN: 64500}); err == nil {
		t.Error("a peer without my_asn was accepted")
	}
	var got1, got2 []datapath.BGPPeer
	reg.Read(func(v registry.View) {
		got1, got2 = Node(v, "node1").BGPPeers, Node(v, "node2").BGPPeers
	})
	everyone := datapath.BGPPeer{Name: "everyone", Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64512}
	r1 := datapath.BGPPeer{Name: "r1-only", Address: netip.MustParseAddr("192.0.2.254"), Port: 1179, ASN: 64501, MyASN: 64512, GracefulRestart: true,
		EBGPMultihopTTL: 2, SourceAddress: netip.MustParseAddr("198.51.100.7"), Keepalive: 10 * time.Second, ConnectRetry: 5 * time.Second}
	if diff := cmp.Diff([]datapath.BGPPeer{everyone, r1}, got1, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("node1's peers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]datapath.BGPPeer{everyone}, got2, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("node2's peers (-want +got):\n%s", diff)
	}
}

// TestAnL2PoolAnnouncedOverBGPTooReachesTheNodes: every node is told
// that a pool answered over L2 is announced over BGP as well, and only
// the nodes its advertisements select are given them; an L2 pool
// without advertisements is answered over L2 alone.
func TestAnL2PoolAnnouncedOverBGPTooReachesTheNodes(t *testing.T) {
	reg := registrytest.Open(t)
	for _, n := range []*model.Node{
		{Meta: model.Meta{Name: "node1", Labels: map[string]string{"rack": "r1"}}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")}},
		{Meta: model.Meta{Name: "node2", Labels: map[string]string{"rack": "r2"}}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}},
	} {
		if _, err := reg.Nodes.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	rng := func(first, last string) model.AddressRange {
		return model.AddressRange{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
	}
	for _, p := range []*model.AddressPool{
		{Meta: model.Meta{Name: "both"}, Ranges: []model.AddressRange{rng("203.0.113.0", "203.0.113.7")},
			L2:                &model.L2Advertisement{NodeSelector: map[string]string{"rack": "r1"}},
			BGPAdvertisements: []model.BGPAdvertisement{{NodeSelector: map[string]string{"rack": "r2"}, LocalPref: 200}}},
		{Meta: model.Meta{Name: "l2"}, Ranges: []model.AddressRange{rng("203.0.113.8", "203.0.113.15")}, L2: &model.L2Advertisement{}},
	} {
		if _, err := reg.Pools.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	var node1, node2 datapath.NodeInfo
	reg.Read(func(v registry.View) { node1, node2 = Node(v, "node1"), Node(v, "node2") })
	both := datapath.AddressRange{First: netip.MustParseAddr("203.0.113.0"), Last: netip.MustParseAddr("203.0.113.7")}
	l2 := datapath.AddressRange{First: netip.MustParseAddr("203.0.113.8"), Last: netip.MustParseAddr("203.0.113.15")}
	wantPools := []datapath.L2Pool{{Ranges: []datapath.AddressRange{both}, AnnouncedOverBGP: true}, {Ranges: []datapath.AddressRange{l2}}}
	for _, n := range []datapath.NodeInfo{node1, node2} {
		if diff := cmp.Diff(wantPools, n.L2Pools, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s's L2 pools (-want +got):\n%s", n.Name, diff)
		}
	}
	if len(node1.Advertisements) != 0 {
		t.Errorf("node1, which the pool's advertisement does not select, was given %v", node1.Advertisements)
	}
	want := []datapath.BGPAdvertisement{{Name: "both#0", Ranges: []datapath.AddressRange{both}, LocalPref: 200}}
	if diff := cmp.Diff(want, node2.Advertisements, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("node2's advertisements (-want +got):\n%s", diff)
	}
	if !node2.AnnouncesOverBGP(netip.MustParseAddr("203.0.113.3")) || node2.AnnouncesOverBGP(netip.MustParseAddr("203.0.113.9")) {
		t.Error("the node does not tell the pool announced both ways from the L2 pool alone")
	}
}
