package nodestate

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/server/announcers"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// TestAnnouncersFollowThePoolsLimit: a pool limited to three announcing
// nodes: each Cluster service's address gets three, chosen only among the
// nodes that peer with the pool's router and are neither deleting nor
// drained; addresses in one aggregate share their announcers; a Local
// service and an unlimited pool's service have no limit; a drained node
// gives its place to another and the rest stay.
func TestAnnouncersFollowThePoolsLimit(t *testing.T) {
	reg := registrytest.Open(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 {
		n := &model.Node{Meta: model.Meta{Name: fmt.Sprintf("node%d", i), Labels: map[string]string{"rack": "r1"}},
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})}}
		switch i {
		case 6:
			n.Labels["rack"] = "r2" // peers with nobody who hears the pool
		case 7:
			n.Deleting = true
		}
		must(reg.Nodes.Create(n))
	}
	must(reg.Peers.Create(&model.BGPPeer{Meta: model.Meta{Name: "tor-r1"}, Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64501,
		NodeSelector: map[string]string{"rack": "r1"}}))
	must(reg.Peers.Create(&model.BGPPeer{Meta: model.Meta{Name: "tor-r2"}, Address: netip.MustParseAddr("192.0.2.2"), ASN: 64500, MyASN: 64501,
		NodeSelector: map[string]string{"rack": "r2"}}))
	pool := func(name, cidr string, limit, agg int, peers ...string) *model.AddressPool {
		r, err := model.ParseAddressRange(cidr)
		if err != nil {
			t.Fatal(err)
		}
		return &model.AddressPool{Meta: model.Meta{Name: name}, Ranges: []model.AddressRange{r},
			BGP: model.BGPAdvertisement{MaxAnnouncingNodes: limit, AggregationLength: agg, Peers: peers}}
	}
	must(reg.Pools.Create(pool("limited", "203.0.113.0/24", 3, 0, "tor-r1")))
	must(reg.Pools.Create(pool("aggregated", "198.51.100.0/24", 3, 28)))
	must(reg.Pools.Create(pool("open", "192.0.2.128/25", 0, 0)))
	svc := func(name string, policy model.TrafficPolicy, ips ...string) *model.Service {
		s := &model.Service{Meta: model.Meta{Namespace: "default", Name: name}, Type: model.LoadBalancer,
			ClusterIPs:            []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.96.0.%d", 10+len(name)))},
			Ports:                 []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: int32(30000 + len(name))}},
			ExternalTrafficPolicy: policy, InternalTrafficPolicy: model.PolicyCluster}
		for _, ip := range ips {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.MustParseAddr(ip))
		}
		return s
	}
	for _, s := range []*model.Service{
		svc("a", model.PolicyCluster, "203.0.113.7"),
		svc("bb", model.PolicyCluster, "198.51.100.17"),
		svc("ccc", model.PolicyCluster, "198.51.100.18"),
		svc("dddd", model.PolicyLocal, "203.0.113.8"),
		svc("eeeee", model.PolicyCluster, "192.0.2.130"),
	} {
		must(reg.Services.Create(s))
	}
	chosen := func(key string) map[netip.Addr][]string {
		var out map[netip.Addr][]string
		reg.Read(func(v registry.View) { out = Service(v, key, nil).Announcers })
		return out
	}

	a := chosen("default/a")[netip.MustParseAddr("203.0.113.7")]
	if len(a) != 3 {
		t.Fatalf("203.0.113.7: announcers %v, want 3", a)
	}
	for _, n := range a {
		if n == "node6" || n == "node7" {
			t.Errorf("203.0.113.7: announced by %s, which does not peer with tor-r1 or is being deleted", n)
		}
	}
	// Exactly the choice over node0-node5, whatever the hash picks.
	want := announcers.Choose("203.0.113.7/32", []string{"node0", "node1", "node2", "node3", "node4", "node5"}, 3)
	if slices.Sort(want); !slices.Equal(a, want) {
		t.Errorf("203.0.113.7: announcers %v, want %v (the choice among the nodes that may announce)", a, want)
	}
	// One /28 aggregate holds both addresses: one set announces it.
	b, c := chosen("default/bb")[netip.MustParseAddr("198.51.100.17")], chosen("default/ccc")[netip.MustParseAddr("198.51.100.18")]
	if len(b) != 3 || !slices.Equal(b, c) {
		t.Errorf("one aggregate, two sets of announcers: %v and %v", b, c)
	}
	if got := chosen("default/dddd"); got != nil {
		t.Errorf("Local service: announcers %v, want none chosen", got)
	}
	if got := chosen("default/eeeee"); got != nil {
		t.Errorf("unlimited pool: announcers %v, want none chosen", got)
	}

	if _, _, err := reg.Drain(a[0], time.Time{}); err != nil {
		t.Fatal(err)
	}
	now := chosen("default/a")[netip.MustParseAddr("203.0.113.7")]
	if len(now) != 3 || slices.Contains(now, a[0]) || !slices.Contains(now, a[1]) || !slices.Contains(now, a[2]) {
		t.Errorf("after draining %s: announcers %v, want %s and %s kept and one more", a[0], now, a[1], a[2])
	}
	// A node labelled out of external load balancers is left out as a
	// drained one is, and told so.
	n, err := reg.Nodes.Get(a[1])
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{model.LabelExcludeFromLoadBalancers: ""}
	if _, err := reg.Nodes.Update(n); err != nil {
		t.Fatal(err)
	}
	if now := chosen("default/a")[netip.MustParseAddr("203.0.113.7")]; len(now) != 3 || slices.Contains(now, a[1]) || !slices.Contains(now, a[2]) {
		t.Errorf("after excluding %s: announcers %v, want %s kept and two more", a[1], now, a[2])
	}
	var info datapath.NodeInfo
	reg.Read(func(v registry.View) { info = Node(v, a[1]) })
	if !info.Excluded || info.Drained {
		t.Errorf("the excluded node is told excluded %v, drained %v; want excluded alone", info.Excluded, info.Drained)
	}
}

// The announcer choice is keyed on the prefix announced for an address;
// the agents work that prefix out from the advertisements the server sends
// them. Both must be the same prefix for every pool and family, or the
// chosen nodes would announce another key's prefix.
func TestTheAnnouncedPrefixIsTheAgentsPrefix(t *testing.T) {
	reg := registrytest.Open(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n1"}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}))
	for _, p := range []struct {
		name, cidr string
		v4, v6     int
	}{{"host", "203.0.113.0/24", 0, 0}, {"agg4", "198.51.100.0/24", 28, 0}, {"host6", "2001:db8:1::/64", 0, 0}, {"agg6", "2001:db8:2::/64", 0, 96}} {
		r, err := model.ParseAddressRange(p.cidr)
		if err != nil {
			t.Fatal(err)
		}
		must(reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: p.name}, Ranges: []model.AddressRange{r},
			BGP: model.BGPAdvertisement{AggregationLength: p.v4, AggregationLengthV6: p.v6, Communities: []uint32{1}}}))
	}
	reg.Read(func(v registry.View) {
		node := Node(v, "n1")
		for _, s := range []string{"203.0.113.7", "198.51.100.77", "2001:db8:1::7", "2001:db8:2::1:7"} {
			ip := netip.MustParseAddr(s)
			server := AnnouncedPrefix(model.PoolOf(v.Pools(), ip), ip)
			var agent netip.Prefix
			for _, adv := range node.Advertisements {
				if slices.ContainsFunc(adv.Ranges, func(r datapath.AddressRange) bool { return r.Contains(ip) }) {
					agent = adv.PrefixOf(ip)
				}
			}
			if server != agent || !server.IsValid() {
				t.Errorf("%s: the server keys its announcers on %s, the agent announces %s", ip, server, agent)
			}
		}
	})
}

// Candidates kept from call to call answer as a fresh computation after
// every kind of write that decides who may announce: a drain, a node's
// labels, a node created or deleted, a peer's selector, the pool's peers.
// Each step below changes the answer, so a kept answer would show.
func TestKeptCandidatesFollowEveryWriteThatDecidesThem(t *testing.T) {
	reg := registrytest.Open(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	node := func(i int, rack string) *model.Node {
		return &model.Node{Meta: model.Meta{Name: fmt.Sprintf("node%d", i), Labels: map[string]string{"rack": rack}},
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})}}
	}
	for i := range 4 {
		must(reg.Nodes.Create(node(i, "r1")))
	}
	peer := &model.BGPPeer{Meta: model.Meta{Name: "tor-r1"}, Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64501,
		NodeSelector: map[string]string{"rack": "r1"}}
	must(reg.Peers.Create(peer))
	r, err := model.ParseAddressRange("203.0.113.0/24")
	if err != nil {
		t.Fatal(err)
	}
	pool := &model.AddressPool{Meta: model.Meta{Name: "limited"}, Ranges: []model.AddressRange{r},
		BGP: model.BGPAdvertisement{MaxAnnouncingNodes: 8, Peers: []string{"tor-r1"}}} // above the nodes: every candidate announces
	must(reg.Pools.Create(pool))
	ip := netip.MustParseAddr("203.0.113.7")
	must(reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "default", Name: "web"}, Type: model.LoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster, LoadBalancerIPs: []netip.Addr{ip}}))
	kept := &Candidates{}
	announcing := func() (withKept, fresh []string) {
		reg.Read(func(v registry.View) {
			withKept = Service(v, "default/web", kept).Announcers[ip]
			fresh = Service(v, "default/web", nil).Announcers[ip]
		})
		return withKept, fresh
	}
	last, _ := announcing()
	for _, step := range []struct {
		what  string
		write func() error
	}{
		{"a node is drained", func() error { _, _, err := reg.Drain("node0", time.Time{}); return err }},
		{"its drain ends", func() error { _, _, err := reg.Uncordon("node0"); return err }},
		{"a node is labelled out of load balancers", func() error {
			n := node(1, "r1")
			n.Labels[model.LabelExcludeFromLoadBalancers] = ""
			_, err := reg.Nodes.Update(n)
			return err
		}},
		{"a node moves to a rack no peer selects", func() error { _, err := reg.Nodes.Update(node(2, "r2")); return err }},
		{"a node is created", func() error { _, err := reg.Nodes.Create(node(4, "r1")); return err }},
		{"a node is deleted", func() error { _, err := reg.Nodes.Delete("node3", 0, ""); return err }},
		{"the peer selects the other rack", func() error {
			p := *peer
			p.NodeSelector = map[string]string{"rack": "r2"}
			_, err := reg.Peers.Update(&p)
			return err
		}},
		{"the pool is heard by no peer of ours", func() error {
			p := *pool
			p.BGP.Peers = []string{"elsewhere"}
			_, err := reg.Pools.Update(&p)
			return err
		}},
	} {
		if err := step.write(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		withKept, fresh := announcing()
		if slices.Equal(fresh, last) {
			t.Fatalf("%s: the announcers stayed %v; the step proves nothing", step.what, fresh)
		}
		if !slices.Equal(withKept, fresh) {
			t.Errorf("%s: kept candidates give %v, a fresh computation %v", step.what, withKept, fresh)
		}
		last = fresh
	}
}
