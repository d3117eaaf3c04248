package nodewire

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/internal/bgpcommunity"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func TestServiceRoundTrip(t *testing.T) {
	in := &datapath.Service{
		Key:                      datapath.ServiceKey{Namespace: "shop", Name: "cart"},
		ClusterIPs:               []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		ExternalIPs:              []netip.Addr{netip.MustParseAddr("198.51.100.50")},
		LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")},
		SessionAffinityTimeout:   3 * time.Hour,
		ExternalTrafficPolicy:    datapath.Local,
		InternalTrafficPolicy:    datapath.Local,
		HealthCheckNodePort:      31000,
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		PreferClose:              true,
		OtherController:          true,
		Announcers:               map[netip.Addr][]string{netip.MustParseAddr("203.0.113.10"): {"node1", "node7"}},
		// A second address that no advertisement selects keeps its empty list.
		Advertisements: map[netip.Addr][]string{netip.MustParseAddr("203.0.113.10"): {"public#0", "public#2"}, netip.MustParseAddr("203.0.113.11"): nil},
		Ports: []datapath.ServicePort{{Name: "dns", Protocol: datapath.UDP, Port: 53, NodePort: 30053, Endpoints: []datapath.Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.11"), Port: 5353, NodeName: "node1", Local: true, Zone: "a", Hints: &datapath.Hints{Zones: []string{"a"}}, Ready: true, Serving: true},
			{Addr: netip.MustParseAddr("10.244.2.11"), Port: 5353, NodeName: "node2", Zone: "b", Serving: true, Terminating: true},
		}}},
	}
	out, err := DecodeService(EncodeService(in), "node1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("round trip changed the service (-in +out):\n%s", diff)
	}
}

// TestDecodeRejectsWhatTheDatapathCannotProgram: each error names the
// field, down to the endpoint.
func TestDecodeRejectsWhatTheDatapathCannotProgram(t *testing.T) {
	tcp80 := func(eps ...*weirv1.NodeEndpoint) []*weirv1.NodeServicePort {
		return []*weirv1.NodeServicePort{{Protocol: weirv1.Protocol_PROTOCOL_TCP, Port: 80, Endpoints: eps}}
	}
	good := &weirv1.NodeEndpoint{Address: "10.244.0.1", Port: 80}
	for want, s := range map[string]*weirv1.NodeService{
		"cluster_ips[0]":                              {Namespace: "a", Name: "b", ClusterIps: []string{"10.96.0.300"}},
		"ports[0].port: 0 is not a port":              {Namespace: "a", Name: "b", Ports: []*weirv1.NodeServicePort{{Protocol: weirv1.Protocol_PROTOCOL_TCP}}},
		"ports[0].protocol":                           {Namespace: "a", Name: "b", Ports: []*weirv1.NodeServicePort{{Port: 80}}},
		"ports[0].endpoints[1].address":               {Namespace: "a", Name: "b", Ports: tcp80(good, &weirv1.NodeEndpoint{Address: "pod-1", Port: 80})},
		"ports[0].endpoints[1].port: 0 is not a port": {Namespace: "a", Name: "b", Ports: tcp80(good, &weirv1.NodeEndpoint{Address: "10.244.0.2"})},
		"announcers[0].address":                       {Namespace: "a", Name: "b", Announcers: []*weirv1.AddressAnnouncers{{Address: "vip", Nodes: []string{"node1"}}}},
	} {
		_, err := DecodeService(s, "node1")
		if err == nil || !strings.Contains(err.Error(), "service a/b: "+want) {
			t.Errorf("%s: error %v", want, err)
		}
	}
}

func TestNodeRoundTripKeepsTheServiceCIDRs(t *testing.T) {
	in := datapath.NodeInfo{Name: "node1", Registered: true, Drained: true, Excluded: true,
		DrainDeadline: time.Date(2026, 5, 1, 10, 0, 8, 0, time.UTC),
		Addresses:     []netip.Addr{netip.MustParseAddr("192.0.2.11")},
		PodCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		ServiceCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/108")},
		FlowRing:      3,
		FlowPeers: []datapath.FlowPeer{{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}},
			{Name: "node3", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.13")}}},
		FlowSenders: []datapath.FlowPeer{{Name: "node3", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.13")}},
			{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}},
	}
	out, err := DecodeNode(EncodeNode(in))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("round trip changed the node (-in +out):\n%s", diff)
	}
	if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", ServiceCidrs: []string{"10.96.0.0/33"}}); err == nil {
		t.Error("a bad service CIDR decoded without error")
	}
	if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", FlowRingSize: 2, FlowPeers: []*weirv1.FlowPeer{{Name: "a"}, {Name: "b"}}}); err == nil {
		t.Error("a ring smaller than its peers decoded without error")
	}
	if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", FlowRingSize: 2, FlowSenders: []*weirv1.FlowPeer{{Name: "a"}, {Name: "b"}}}); err == nil {
		t.Error("a ring smaller than its senders decoded without error")
	}
	if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", FlowRingSize: 2, FlowSenders: []*weirv1.FlowPeer{{Name: "a", Addresses: []string{"node2"}}}}); err == nil || !strings.Contains(err.Error(), "node.flow_senders[0].addresses") {
		t.Errorf("a sender's bad address: %v; want an error naming node.flow_senders[0].addresses", err)
	}
}

// A peer's session options cross the stream as they are; a TTL no packet
// can carry is refused.
func TestNodeRoundTripKeepsThePeersSessionOptions(t *testing.T) {
	in := datapath.NodeInfo{Name: "node1", Registered: true, BGPPeers: []datapath.BGPPeer{
		{Name: "rr-1", Address: netip.MustParseAddr("192.0.2.1"), ASN: 4200000100, MyASN: 4200000001, HoldTime: 30 * time.Second,
			EBGPMultihopTTL: 2, SourceAddress: netip.MustParseAddr("198.51.100.7"), Keepalive: 10 * time.Second, ConnectRetry: 5 * time.Second,
			BFD: &bfd.Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 150 * time.Millisecond, DetectMultiplier: 4, Passive: true, MinimumTTL: 253}},
		{Name: "tor", Address: netip.MustParseAddr("2001:db8::1"), ASN: 64500, MyASN: 64512, BFD: &bfd.Profile{}},
	}}
	out, err := DecodeNode(EncodeNode(in))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, out, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("round trip changed the node (-in +out):\n%s", diff)
	}
	for _, bad := range []*weirv1.NodePeer{
		{Address: "192.0.2.1", Asn: 64500, MyAsn: 64512, EbgpMultihopTtl: 256},
		{Address: "192.0.2.1", Asn: 64500, MyAsn: 64512, SourceAddress: "lo"},
		{Address: "192.0.2.1", Asn: 64500, MyAsn: 64512, Bfd: &weirv1.BfdProfile{DetectMultiplier: 256}},
		{Address: "192.0.2.1", Asn: 64500, MyAsn: 64512, Bfd: &weirv1.BfdProfile{MinimumTtl: 300}},
	} {
		if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", BgpPeers: []*weirv1.NodePeer{bad}}); err == nil || !strings.Contains(err.Error(), "node.bgp_peers[0]") {
			t.Errorf("peer %v: %v; want an error naming node.bgp_peers[0]", bad, err)
		}
	}
}

// A drain's deadline crosses the stream as it is; a drain without one
// stays without one, and a deadline that is no time is refused.
func TestNodeDrainDeadline(t *testing.T) {
	for _, deadline := range []time.Time{{}, time.Date(2026, 5, 1, 10, 0, 8, 0, time.UTC)} {
		out, err := DecodeNode(EncodeNode(datapath.NodeInfo{Name: "node1", Drained: true, DrainDeadline: deadline}))
		if err != nil || !out.DrainDeadline.Equal(deadline) || out.DrainDeadline.IsZero() != deadline.IsZero() {
			t.Errorf("deadline %v came back as %v, %v", deadline, out.DrainDeadline, err)
		}
	}
	if _, err := DecodeNode(&weirv1.NodeInfo{Name: "node1", DrainDeadline: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}); err == nil {
		t.Error("a deadline that is no time decoded without error")
	}
}

// A pool's attributes reach the node as the server has them: 32-bit local
// preference, standard and large communities, each in its own list.
func TestNodeAdvertisementsKeepEveryCommunity(t *testing.T) {
	in := datapath.NodeInfo{Name: "node1", Advertisements: []datapath.BGPAdvertisement{{
		Ranges:      []datapath.AddressRange{{First: netip.MustParseAddr("203.0.113.0"), Last: netip.MustParseAddr("203.0.113.15")}},
		Communities: []uint32{64512<<16 | 100, 0xFFFFFF01}, LocalPref: 4000000000,
		LargeCommunities: []bgpcommunity.Large{{Global: 4200000001, Local1: 1, Local2: 4294967295}, {Global: 64512, Local1: 0, Local2: 2}},
		Name:             "public#1",
	}}}
	out, err := DecodeNode(EncodeNode(in))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in.Advertisements, out.Advertisements); diff != "" {
		t.Errorf("advertisements (-sent +received):\n%s", diff)
	}
}
