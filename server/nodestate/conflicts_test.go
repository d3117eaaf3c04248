package nodestate

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

func svc(ns, name, clusterIP string, edit func(*model.Service)) *model.Service {
	s := &model.Service{Meta: model.Meta{Namespace: ns, Name: name}, Type: model.LoadBalancer,
		ClusterIPs:            []netip.Addr{netip.MustParseAddr(clusterIP)},
		Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	if edit != nil {
		edit(s)
	}
	return s
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// The native API refuses what Kubernetes' apiserver refuses, naming the
// field; nothing is stored.
func TestNativeWritesFollowTheAllocationRules(t *testing.T) {
	reg := registrytest.Open(t)
	rules := registry.DefaultServiceRules()
	rules.ExternalIPCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("10.96.0.0/16")}
	// A service range that overlaps the external IPs, to reach the clash
	// between a cluster IP and an external IP.
	rules.ServiceRanges = append(rules.ServiceRanges, netip.MustParsePrefix("198.51.100.0/24"))
	reg.SetServiceRules(rules)
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "lb"},
		Ranges: []model.AddressRange{{First: netip.MustParseAddr("203.0.113.0"), Last: netip.MustParseAddr("203.0.113.255")}}}); err != nil {
		t.Fatal(err)
	}
	web := svc("shop", "web", "10.96.0.10", func(s *model.Service) {
		s.Ports[0].NodePort = 30080
		s.ExternalTrafficPolicy, s.HealthCheckNodePort = model.PolicyLocal, 31000
		s.ExternalIPs = addrs("198.51.100.10")
		s.LoadBalancerIPs = addrs("203.0.113.10")
	})
	if _, err := reg.Services.Create(web); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*model.Service)
		field string
		inUse bool
	}{
		{"node port outside the range", func(s *model.Service) { s.Ports[0].NodePort = 22 }, "spec.ports[0].node_port", false},
		{"health-check port outside the range", func(s *model.Service) {
			s.ExternalTrafficPolicy, s.HealthCheckNodePort = model.PolicyLocal, 8080
		}, "spec.health_check_node_port", false},
		{"external IP outside the allowed CIDRs", func(s *model.Service) { s.ExternalIPs = addrs("192.0.2.50") }, "spec.external_ips[0]", false},
		{"cluster IP outside the service ranges", func(s *model.Service) { s.ClusterIPs = addrs("192.0.2.77") }, "spec.cluster_ips[0]", false},
		{"cluster IP of the metadata server", func(s *model.Service) { s.ClusterIPs = addrs("169.254.169.254") }, "spec.cluster_ips[0]", false},
		{"cluster IP of broadcast", func(s *model.Service) { s.ClusterIPs = addrs("255.255.255.255") }, "spec.cluster_ips[0]", false},
		{"cluster IP not in canonical form", func(s *model.Service) { s.ClusterIPs = addrs("::ffff:10.96.0.10") }, "spec.cluster_ips[0]", false},
		{"external IP of the metadata server", func(s *model.Service) { s.ExternalIPs = addrs("169.254.169.254") }, "spec.external_ips[0]", false},
		{"Local on a ClusterIP service", func(s *model.Service) { s.Type, s.ExternalTrafficPolicy = model.ClusterIP, model.PolicyLocal }, "spec.external_traffic_policy", false},
		{"health-check port is its own node port", func(s *model.Service) {
			s.Ports[0].NodePort, s.ExternalTrafficPolicy, s.HealthCheckNodePort = 30090, model.PolicyLocal, 30090
		}, "spec.health_check_node_port", false},
		{"node port taken, other protocol", func(s *model.Service) { s.Ports[0].NodePort, s.Ports[0].Protocol = 30080, model.UDP }, "spec.ports[0].node_port", true},
		{"node port is another's health-check port", func(s *model.Service) { s.Ports[0].NodePort = 31000 }, "spec.ports[0].node_port", true},
		{"health-check port taken", func(s *model.Service) {
			s.ExternalTrafficPolicy, s.HealthCheckNodePort = model.PolicyLocal, 31000
		}, "spec.health_check_node_port", true},
		{"external IP is another's cluster IP", func(s *model.Service) { s.ExternalIPs = addrs("10.96.0.10") }, "spec.external_ips[0]", true},
		{"cluster IP is another's external IP", func(s *model.Service) { s.ClusterIPs = addrs("198.51.100.10") }, "spec.cluster_ips[0]", true},
		{"same load-balancer IP and port", func(s *model.Service) { s.LoadBalancerIPs = addrs("203.0.113.10") }, "status.load_balancer_ips[0]", true},
		{"external IP and port another's load-balancer IP", func(s *model.Service) { s.ExternalIPs = addrs("198.51.100.10") }, "spec.external_ips[0]", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reg.Services.Create(svc("other", "x", "10.96.0.20", tc.edit))
			var fe *model.FieldError
			switch {
			case err == nil:
				t.Fatal("accepted")
			case tc.inUse && !errors.Is(err, registry.ErrInUse):
				t.Errorf("%v; want ErrInUse", err)
			case !tc.inUse && !errors.As(err, &fe):
				t.Errorf("%v; want a field error", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%v does not name %s", err, tc.field)
			}
			if _, err := reg.Services.Get("other/x"); !errors.Is(err, registry.ErrNotFound) {
				t.Errorf("the refused service was stored (%v)", err)
			}
		})
	}
	// What does not clash: the same load-balancer IP on another port, the
	// same node port number for UDP and TCP within one service.
	ok := svc("other", "ok", "10.96.0.21", func(s *model.Service) {
		s.LoadBalancerIPs = addrs("203.0.113.10")
		s.Ports = []model.ServicePort{{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30053}, {Name: "dns-tcp", Protocol: model.TCP, Port: 53, NodePort: 30053}}
	})
	if _, err := reg.Services.Create(ok); err != nil {
		t.Errorf("a service sharing nothing was refused: %v", err)
	}
	// Reserved ports hold whatever the range is.
	rules.NodePorts = registry.PortRange{First: 1, Last: 65535}
	reg.SetServiceRules(rules)
	if _, err := reg.Services.Create(svc("other", "healthz", "10.96.0.22", func(s *model.Service) { s.Ports[0].NodePort = 10256 })); err == nil ||
		!strings.Contains(err.Error(), "weir-agent's /healthz") {
		t.Errorf("node port 10256: %v; want it refused as the agents' health port", err)
	}
}

// A Kubernetes service is never refused for a conflict (the cluster has
// it): the older claim wins, a cluster IP wins over any other use of its
// address, the loser's claim is left out of what nodes program and shown
// in its status, and it comes back when the winner goes.
func TestKubernetesConflictsAreResolvedTheSameEverywhere(t *testing.T) {
	reg := registrytest.Open(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	k8s := func(ns, name, clusterIP string, created time.Time, edit func(*model.Service)) *model.Service {
		s := svc(ns, name, clusterIP, edit)
		s.Source, s.CreateTime = model.SourceKubernetes, created
		return s
	}
	victim := k8s("shop", "db", "10.96.0.10", t0.Add(time.Hour), func(s *model.Service) { s.Ports[0].NodePort = 30080 })
	// Older, yet its external IP is the victim's cluster IP: the cluster IP wins.
	attacker := k8s("evil", "grab", "10.96.0.66", t0, func(s *model.Service) {
		s.ExternalIPs = addrs("10.96.0.10", "198.51.100.66")
	})
	// Younger, with the victim's node port: the older keeps it.
	younger := k8s("shop", "late", "10.96.0.11", t0.Add(2*time.Hour), func(s *model.Service) { s.Ports[0].NodePort = 30080 })
	var changes []registry.Change
	reg.OnChange(func(c registry.Change) { changes = append(changes, c) })
	for _, s := range []*model.Service{victim, attacker, younger} {
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatalf("%s refused: %v", s.Key(), err)
		}
	}
	if last := changes[len(changes)-1]; !slices.Contains(last.Services, "shop/db") {
		t.Errorf("creating shop/late changed %v; shop/db shares its node port and must be recomputed", last.Services)
	}
	rules := registry.DefaultServiceRules()
	rules.ExternalIPCIDRs = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	reg.SetServiceRules(rules)

	reg.Read(func(v registry.View) {
		if got := Service(v, "shop/db", nil); got == nil || got.Ports[0].NodePort != 30080 || len(got.ClusterIPs) != 1 {
			t.Errorf("the victim lost something: %+v", got)
		}
		if got := Service(v, "evil/grab", nil); got == nil || !slices.Equal(got.ExternalIPs, addrs("198.51.100.66")) {
			t.Errorf("the attacker's external IPs as programmed: %+v; want only 198.51.100.66", got)
		}
		if got := Service(v, "shop/late", nil); got == nil || got.Ports[0].NodePort != 0 {
			t.Errorf("the younger service's node port as programmed: %+v; want none", got)
		}
		c := v.ServiceConflicts(attacker)
		if len(c) != 1 || c[0].Field() != "spec.external_ips[0]" || !strings.Contains(c[0].Message(), "cluster IP of service shop/db") {
			t.Errorf("the attacker's status conflicts: %+v", c)
		}
		if c := v.ServiceConflicts(victim); len(c) != 0 {
			t.Errorf("the victim shows conflicts: %+v", c)
		}
	})
	if _, err := reg.Services.Delete("shop/db", 0, model.SourceKubernetes); err != nil {
		t.Fatal(err)
	}
	reg.Read(func(v registry.View) {
		if got := Service(v, "shop/late", nil); got == nil || got.Ports[0].NodePort != 30080 {
			t.Errorf("after the older service went, the younger's node port: %+v; want 30080", got)
		}
	})
	if last := changes[len(changes)-1]; !slices.Contains(last.Services, "shop/late") || !slices.Contains(last.Services, "evil/grab") {
		t.Errorf("deleting shop/db changed %v; want its neighbours recomputed", last.Services)
	}
	// An external IP the rules do not allow is not programmed.
	rules.ExternalIPCIDRs = nil
	reg.SetServiceRules(rules)
	reg.Read(func(v registry.View) {
		if got := Service(v, "evil/grab", nil); got == nil || len(got.ExternalIPs) != 0 {
			t.Errorf("with no external IPs allowed, the attacker's are programmed: %+v", got)
		}
	})
}

// A service range is dropped by every node where no service holds an
// address: none may hold a node's address, a pod CIDR, the server's
// address or a special-purpose range, and no native node may come to sit
// in one. Nothing refused is stored.
func TestServiceRangesStayClearOfTheControlPlane(t *testing.T) {
	reg := registrytest.Open(t)
	rules := registry.DefaultServiceRules()
	rules.ServerAddrs = addrs("192.0.2.100")
	reg.SetServiceRules(rules)
	node := &model.Node{Meta: model.Meta{Name: "n1"}, Addresses: addrs("192.0.2.11"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	if _, err := reg.Nodes.Create(node); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ cidr, says string }{
		{"0.0.0.0/0", "wider than /12"},
		{"::/0", "wider than /64"},
		{"10.0.0.0/7", "wider than /12"},
		{"10.0.0.0/8", "wider than /12"},
		{"fe80::/64", "special-purpose"},
		{"16.0.0.0/4", "wider than /12"},
		{"169.254.0.0/16", "special-purpose"},
		{"::ffff:10.0.0.0/104", "canonical"},
		{"192.0.2.96/28", "weir-server"},
		{"192.0.2.0/28", "node n1"},
		{"10.244.0.0/16", "pod CIDR of node n1"},
	} {
		_, err := reg.ServiceCIDRs.Create(&model.ServiceCIDR{Meta: model.Meta{Name: "wide"}, CIDRs: []netip.Prefix{netip.MustParsePrefix(tc.cidr)}})
		var fe *model.FieldError
		if !errors.As(err, &fe) || fe.Field != "cidrs[0]" || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("service range %s: %v; want a field error on cidrs[0] saying %q", tc.cidr, err, tc.says)
		}
		if _, err := reg.ServiceCIDRs.Get("wide"); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("service range %s was stored (%v)", tc.cidr, err)
		}
	}
	if _, err := reg.ServiceCIDRs.Create(&model.ServiceCIDR{Meta: model.Meta{Name: "more"}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16")}}); err != nil {
		t.Fatalf("a range clear of everything: %v", err)
	}
	// Its cluster IPs are now allowed; a node inside it is not.
	if _, err := reg.Services.Create(svc("default", "more", "10.100.0.10", nil)); err != nil {
		t.Errorf("a cluster IP of a ServiceCidr resource: %v", err)
	}
	for _, n := range []*model.Node{
		{Meta: model.Meta{Name: "n2"}, Addresses: addrs("10.100.0.5")},
		{Meta: model.Meta{Name: "n2"}, Addresses: addrs("192.0.2.12"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}},
	} {
		_, err := reg.Nodes.Create(n)
		var fe *model.FieldError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "service range") {
			t.Errorf("node %v %v: %v; want a field error naming the service range", n.Addresses, n.PodCIDRs, err)
		}
	}
}

// A Kubernetes service's load-balancer status is written by whichever
// controller the cluster lets: the nodes program it, as kube-proxy does,
// unless it is the server's or a node's own address or lies in a service
// range, which no node ever captures; the status says why. A node or a
// service range that comes later takes the address back from the
// service, and its write recomputes the service. A native node or range
// is refused instead.
func TestKubernetesLoadBalancerIPsNeverTakeAHostsAddress(t *testing.T) {
	reg := registrytest.Open(t)
	rules := registry.DefaultServiceRules()
	rules.ServerAddrs = addrs("192.0.2.100")
	reg.SetServiceRules(rules)
	var changes []registry.Change
	reg.OnChange(func(c registry.Change) { changes = append(changes, c) })
	if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n1", Source: model.SourceKubernetes}, Addresses: addrs("192.0.2.11")}); err != nil {
		t.Fatal(err)
	}
	k8s := func(name, clusterIP, lbIP string) *model.Service {
		s := svc("shop", name, clusterIP, func(s *model.Service) { s.LoadBalancerIPs = addrs(lbIP) })
		s.Source = model.SourceKubernetes
		return s
	}
	for _, tc := range []struct {
		name, clusterIP, lbIP, says string // says: "" when programmed
	}{
		{"outside", "10.96.1.1", "198.51.100.7", ""},
		{"server", "10.96.1.2", "192.0.2.100", "an address of weir-server"},
		{"node", "10.96.1.3", "192.0.2.11", "an address of node n1"},
		{"range", "10.96.1.4", "10.96.0.200", "service range 10.96.0.0/12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := k8s(tc.name, tc.clusterIP, tc.lbIP)
			if _, err := reg.Services.Create(s); err != nil {
				t.Fatalf("a Kubernetes service was refused: %v", err)
			}
			reg.Read(func(v registry.View) {
				got := Service(v, s.Key(), nil)
				programmed := got != nil && slices.Equal(got.LoadBalancerIPs, s.LoadBalancerIPs)
				if programmed != (tc.says == "") {
					t.Errorf("load-balancer IP %s programmed: %v (%+v)", tc.lbIP, programmed, got)
				}
				cs := v.ServiceConflicts(s)
				if tc.says == "" && len(cs) != 0 || tc.says != "" && (len(cs) != 1 || cs[0].Field() != "status.load_balancer_ips[0]" || !strings.Contains(cs[0].Message(), tc.says)) {
					t.Errorf("status conflicts %+v; want one on status.load_balancer_ips[0] saying %q", cs, tc.says)
				}
			})
		})
	}

	// The outside address becomes a node's: the service loses it.
	if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n2", Source: model.SourceKubernetes}, Addresses: addrs("198.51.100.7")}); err != nil {
		t.Fatal(err)
	}
	if last := changes[len(changes)-1]; !slices.Contains(last.Services, "shop/outside") {
		t.Errorf("node n2's write changed services %v; want shop/outside recomputed", last.Services)
	}
	reg.Read(func(v registry.View) {
		if got := Service(v, "shop/outside", nil); got == nil || len(got.LoadBalancerIPs) != 0 {
			t.Errorf("on node n2's address, the load-balancer IP is programmed: %+v", got)
		}
	})
	// A native node on a service's load-balancer IP is refused.
	_, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n3"}, Addresses: addrs("192.0.2.12", "198.51.100.7")})
	var fe *model.FieldError
	if !errors.As(err, &fe) || fe.Field != "addresses[1]" || !strings.Contains(fe.Reason, "service shop/outside") {
		t.Errorf("a native node on a load-balancer IP: %v; want a field error on addresses[1] naming the service", err)
	}

	// A service range: a native one holding a load-balancer IP is refused,
	// a Kubernetes one stands and the service loses the address.
	if _, err := reg.Services.Create(k8s("later", "10.96.1.50", "10.100.0.7")); err != nil {
		t.Fatal(err)
	}
	cidr := &model.ServiceCIDR{Meta: model.Meta{Name: "more"}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16")}}
	if _, err := reg.ServiceCIDRs.Create(cidr); !errors.As(err, &fe) || fe.Field != "cidrs[0]" || !strings.Contains(fe.Reason, "service shop/later") {
		t.Errorf("a native range holding a load-balancer IP: %v; want a field error on cidrs[0] naming the service", err)
	}
	cidr.Source = model.SourceKubernetes
	if _, err := reg.ServiceCIDRs.Create(cidr); err != nil {
		t.Fatalf("a Kubernetes range: %v", err)
	}
	if last := changes[len(changes)-1]; !slices.Contains(last.Services, "shop/later") {
		t.Errorf("the range's write changed services %v; want shop/later recomputed", last.Services)
	}
	reg.Read(func(v registry.View) {
		if got := Service(v, "shop/later", nil); got == nil || len(got.LoadBalancerIPs) != 0 {
			t.Errorf("in the Kubernetes range, the load-balancer IP is programmed: %+v", got)
		}
	})
}
