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
		if len(c) != 1 || c[0].Field != "spec.external_ips[0]" || !strings.Contains(c[0].Message, "cluster IP of service shop/db") {
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
		{"0.0.0.0/0", "wider than /8"},
		{"::/0", "wider than /64"},
		{"10.0.0.0/7", "wider than /8"},
		{"fe80::/64", "special-purpose"},
		{"16.0.0.0/4", "wider than /8"},
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
