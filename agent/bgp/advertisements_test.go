package bgp

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/datapath"
)

// A pool with several advertisements: each service's address carries the
// communities of the advertisements that select it and that this node
// was given (node selectors); two that announce one prefix combine.
func TestSeveralAdvertisementsGiveEachServiceItsAttributes(t *testing.T) {
	addr := netip.MustParseAddr
	pool := []datapath.AddressRange{{First: addr("203.0.113.0"), Last: addr("203.0.113.255")}}
	svc := func(name, vip string, advs ...string) *datapath.Service {
		return &datapath.Service{Key: datapath.ServiceKey{Namespace: "default", Name: name}, LoadBalancerIPs: []netip.Addr{addr(vip)},
			ExternalTrafficPolicy: datapath.Cluster, Advertisements: map[netip.Addr][]string{addr(vip): advs}}
	}
	// The node has public#0 and public#2 (its labels select them) and not
	// public#1 (another rack's).
	node := datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{addr("192.0.2.11")}, Advertisements: []datapath.BGPAdvertisement{
		{Name: "public#0", Ranges: pool, Communities: []uint32{65000<<16 | 100}, LocalPref: 100, Peers: []string{"tor"}},
		{Name: "public#2", Ranges: pool, Communities: []uint32{65000<<16 | 300, 65000<<16 | 100}, LocalPref: 300, Peers: []string{"collector"}},
		{Name: "public#3", Ranges: pool, AggregationLength: 24, Communities: []uint32{65000<<16 | 24}},
	}}
	st := datapath.NodeState{Node: node, Services: map[datapath.ServiceKey]*datapath.Service{}}
	for _, s := range []*datapath.Service{
		svc("prod", "203.0.113.1", "public#0"),
		svc("both", "203.0.113.2", "public#0", "public#2"),
		svc("other-rack", "203.0.113.3", "public#1"),
		svc("none", "203.0.113.4"),
		svc("aggregated", "203.0.113.5", "public#0", "public#3"),
	} {
		st.Services[s.Key] = s
	}
	got := map[string]string{}
	for p, a := range Wanted(st, true) {
		got[p.String()] = fmt.Sprintf("communities %v local-pref %d", a.Communities, a.LocalPref)
	}
	want := map[string]string{
		"203.0.113.1/32": "communities [4259840100] local-pref 100",
		// Union of the communities, the highest local preference.
		"203.0.113.2/32": "communities [4259840100 4259840300] local-pref 300",
		"203.0.113.5/32": "communities [4259840100] local-pref 100",
		"203.0.113.0/24": "communities [4259840024] local-pref 0",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("announcements (-want +got):\n%s", diff)
	}
	// Each prefix goes to the peers of its own advertisements: the
	// service of public#0 to tor alone, the one of both to both, the
	// aggregate of public#3 (no peers named) to every peer. The rules
	// hold each prefix alone: the /24 holds the /32s.
	node.BGPPeers = []datapath.BGPPeer{{Name: "tor", Address: addr("192.0.2.1")}, {Name: "collector", Address: addr("192.0.2.2")}}
	w := newWants()
	for key, s := range st.Services {
		w.set(key, s, node)
	}
	rules, perService := ExportRules(node, w.audiences)
	if got, want := fmt.Sprint(rules), "[{[203.0.113.2/32] [192.0.2.1 192.0.2.2] [] true} {[203.0.113.1/32 203.0.113.5/32] [192.0.2.1] [] true}]"; got != want || !perService {
		t.Errorf("rules %s (per service %v), want %s", got, perService, want)
	}
	// Advertisements that all name the same peers: one rule over the
	// pool's ranges, whatever the services.
	node.Advertisements[1].Peers = []string{"tor"}
	node.Advertisements = node.Advertisements[:2]
	rules, perService = ExportRules(node, w.audiences)
	if got, want := fmt.Sprint(rules), "[{[203.0.113.0/24] [192.0.2.1] [] false}]"; got != want || perService {
		t.Errorf("rules %s (per service %v), want %s", got, perService, want)
	}
}
