package model

import (
	"net/netip"
	"testing"
	"time"
)

// fault is one thing wrong with a resource and the error Validate gives
// for it: the field, and the reason a user reads.
type fault[T any] struct {
	edit func(T)
	want string
}

// checkFaults asserts each fault's error alone and, for every pair, that
// the fault listed first is the one reported: Validate reports the first
// problem in a fixed order, so a user fixing one field at a time meets
// them in the order of the spec.
func checkFaults[T interface{ Validate() error }](t *testing.T, base func() T, faults []fault[T]) {
	t.Helper()
	if err := base().Validate(); err != nil {
		t.Fatalf("the base resource: %v", err)
	}
	for i, f := range faults {
		r := base()
		f.edit(r)
		if err := r.Validate(); err == nil || err.Error() != f.want {
			t.Errorf("fault %d alone: %v; want %s", i, err, f.want)
		}
		for j := i + 1; j < len(faults); j++ {
			r := base()
			faults[j].edit(r)
			f.edit(r)
			if err := r.Validate(); err == nil || err.Error() != f.want {
				t.Errorf("faults %d and %d: %v; want the first, %s", i, j, err, f.want)
			}
		}
	}
}

func addrs(ss ...string) []netip.Addr {
	var as []netip.Addr
	for _, s := range ss {
		as = append(as, netip.MustParseAddr(s))
	}
	return as
}

// A LoadBalancer service's faults, in the order they are reported.
func TestServiceFaultsAreReportedInOrder(t *testing.T) {
	base := func() *Service {
		return &Service{Meta: Meta{Namespace: "shop", Name: "web"}, Type: LoadBalancer,
			ClusterIPs: addrs("10.96.0.10"),
			Ports: []ServicePort{
				{Name: "http", Protocol: TCP, Port: 80, TargetPort: 8080, NodePort: 30080},
				{Name: "dns", Protocol: UDP, Port: 53, NodePort: 30053},
			},
			ExternalTrafficPolicy: PolicyLocal, InternalTrafficPolicy: PolicyCluster,
			HealthCheckNodePort: 30999}
	}
	checkFaults(t, base, []fault[*Service]{
		{func(s *Service) { s.Namespace = "Shop" }, `metadata.namespace: "Shop" is not a DNS-1123 label (lowercase letters, digits and '-', at most 63)`},
		{func(s *Service) { s.Name = "web_1" }, `metadata.name: "web_1" is not a valid name (lowercase letters, digits and '-'; dots between labels where allowed; at most 63 or 253)`},
		{func(s *Service) { s.Labels = map[string]string{"my app": "x"} }, `metadata.labels["my app"]: the key's name "my app": at most 63 of letters, digits, '-', '_' and '.', starting and ending with a letter or digit`},
		{func(s *Service) { s.Type = "Bogus" }, `spec.type: unknown service type "Bogus"`},
		{func(s *Service) { s.ClusterIPs = addrs("10.96.0.10", "10.96.0.11") }, `spec.cluster_ips: at most one address per family`},
		{func(s *Service) { s.ClusterIPs = addrs("127.0.0.1") }, `spec.cluster_ips[0]: "127.0.0.1" is not a usable unicast address`},
		{func(s *Service) { s.ExternalIPs = addrs("192.0.2.1", "::ffff:192.0.2.2") }, `spec.external_ips[1]: "::ffff:192.0.2.2" is not in canonical form: write 192.0.2.2`},
		{func(s *Service) { s.LoadBalancerIPs = addrs("0.1.2.3") }, `status.load_balancer_ips[0]: 0.1.2.3 is in the special-purpose range 0.0.0.0/8: no service may take it`},
		{func(s *Service) { s.Ports[0].Name = "" }, `spec.ports[0].name: required when the service has more than one port`},
		{func(s *Service) { s.Ports[0].Name = "HTTP" }, `spec.ports[0].name: "HTTP" is not a DNS-1123 label`},
		{func(s *Service) { s.Ports[1].Name = "http" }, `spec.ports[1].name: duplicate of spec.ports[0].name "http"`},
		{func(s *Service) { s.Ports[1].Protocol = "ICMP" }, `spec.ports[1].protocol: unknown protocol "ICMP"`},
		{func(s *Service) { s.Ports[1].Port = 0 }, `spec.ports[1].port: 0 is not a port (1-65535)`},
		{func(s *Service) { s.Ports[1].Protocol, s.Ports[1].Port = TCP, 80 }, `spec.ports[1].port: duplicate of spec.ports[0]: TCP/80`},
		{func(s *Service) { s.Ports[1].TargetPort = 70000 }, `spec.ports[1].target_port: 70000 is not a port (1-65535)`},
		{func(s *Service) { s.Ports[1].NodePort = -1 }, `spec.ports[1].node_port: -1 is not a port (1-65535)`},
		{func(s *Service) {
			s.Ports = append(s.Ports, ServicePort{Name: "alt", Protocol: TCP, Port: 81, NodePort: 30080})
		}, `spec.ports[2].node_port: duplicate of spec.ports[0].node_port`},
		{func(s *Service) { s.SessionAffinityTimeout = 86401 * time.Second }, `spec.session_affinity_timeout_seconds: must be between 1 and 86400`},
		{func(s *Service) { s.ExternalTrafficPolicy = "Nearby" }, `spec.external_traffic_policy: unknown traffic policy "Nearby"`},
		{func(s *Service) { s.InternalTrafficPolicy = "" }, `spec.internal_traffic_policy: unknown traffic policy ""`},
		{func(s *Service) { s.HealthCheckNodePort = 65536 }, `spec.health_check_node_port: 65536 is not a port (1-65535)`},
		{func(s *Service) { s.RequestedLoadBalancerIPs = addrs("224.0.0.1") }, `spec.load_balancer_ips[0]: "224.0.0.1" is not a usable unicast address`},
	})
}

// A ClusterIP service's faults: what only other types may have.
func TestClusterIPServiceFaultsAreReportedInOrder(t *testing.T) {
	base := func() *Service {
		return &Service{Meta: Meta{Namespace: "shop", Name: "web"}, Type: ClusterIP,
			ClusterIPs:            addrs("10.96.0.10", "fd00::10"),
			Ports:                 []ServicePort{{Protocol: TCP, Port: 80}},
			ExternalTrafficPolicy: PolicyCluster, InternalTrafficPolicy: PolicyLocal}
	}
	checkFaults(t, base, []fault[*Service]{
		{func(s *Service) { s.ClusterIPs = nil }, `spec.cluster_ips: at least one cluster IP is required`},
		{func(s *Service) { s.LoadBalancerIPs = addrs("192.0.2.1") }, `status.load_balancer_ips: only LOAD_BALANCER services have load-balancer addresses`},
		{func(s *Service) { s.Ports = nil }, `spec.ports: at least one port is required`},
		{func(s *Service) { s.Ports[0].NodePort = 30080 }, `spec.ports[0].node_port: only NODE_PORT and LOAD_BALANCER services have node ports`},
		{func(s *Service) { s.SessionAffinityTimeout = -time.Second }, `spec.session_affinity_timeout_seconds: must be between 1 and 86400`},
		{func(s *Service) { s.ExternalTrafficPolicy = PolicyLocal }, `spec.external_traffic_policy: LOCAL applies only to traffic from outside: NODE_PORT and LOAD_BALANCER services, or those with external IPs`},
		{func(s *Service) { s.HealthCheckNodePort = 30999 }, `spec.health_check_node_port: only a LOAD_BALANCER service with external_traffic_policy LOCAL has one`},
		{func(s *Service) { s.AllowSharedIP = "key" }, `spec.load_balancer_ips: only LOAD_BALANCER services get load-balancer addresses`},
		{func(s *Service) { s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")} }, `spec.load_balancer_source_ranges: only LOAD_BALANCER services have them`},
		{func(s *Service) { s.OtherController = true }, `spec.load_balancer_class: only LOAD_BALANCER services have one`},
	})
	for what, edit := range map[string]func(*Service){
		"requested addresses": func(s *Service) { s.RequestedLoadBalancerIPs = addrs("192.0.2.1") },
		"a pool":              func(s *Service) { s.AddressPool = "p" },
		"a class":             func(s *Service) { s.LoadBalancerClass = "weir" },
	} {
		s := base()
		edit(s)
		if err := s.Validate(); err == nil {
			t.Errorf("a ClusterIP service with %s: accepted", what)
		}
	}
}

// An address pool's faults, in the order they are reported.
func TestAddressPoolFaultsAreReportedInOrder(t *testing.T) {
	rng := func(first, last string) AddressRange {
		return AddressRange{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
	}
	base := func() *AddressPool {
		return &AddressPool{Meta: Meta{Name: "pool"},
			Ranges: []AddressRange{rng("192.0.2.0", "192.0.2.255"), rng("2001:db8::", "2001:db8::ff"),
				rng("198.51.100.0", "198.51.100.255"), rng("203.0.113.0", "203.0.113.255")},
			Allocation: &ServiceAllocation{Priority: 1, Namespaces: []string{"shop", "bank"}},
			BGP:        BGPAdvertisement{Peers: []string{"tor-a"}, AggregationLength: 24, AggregationLengthV6: 120}}
	}
	checkFaults(t, base, []fault[*AddressPool]{
		{func(p *AddressPool) { p.Namespace = "shop" }, `metadata.namespace: must be empty: the resource is cluster-scoped`},
		{func(p *AddressPool) { p.Ranges[3] = rng("127.0.0.1", "127.0.0.1") }, `addresses[3]: holds loopback addresses (127.0.0.0/8), which no service can be given`},
		{func(p *AddressPool) { p.Ranges[2] = rng("192.0.2.200", "192.0.3.5") }, `addresses[2]: overlaps addresses[0]`},
		{func(p *AddressPool) { p.L2 = &L2Advertisement{} }, `bgp_advertisement: an L2 pool is announced over BGP too by its bgp_advertisements (one with no field set: every node, no attribute), not by bgp_advertisement: move it there`},
		{func(p *AddressPool) { p.Allocation.Priority = -1 }, `service_allocation.priority: -1 is negative`},
		{func(p *AddressPool) { p.Allocation.Namespaces[1] = "Bank" }, `service_allocation.namespaces[1]: "Bank" is not a namespace name`},
		{func(p *AddressPool) { p.Allocation.Namespaces = append(p.Allocation.Namespaces, "shop") }, `service_allocation.namespaces[2]: "shop" is given twice`},
		{func(p *AddressPool) { p.Allocation.ServiceSelector = map[string]string{"app": "-x"} }, `service_allocation.service_selector["app"]: the value: at most 63 of letters, digits, '-', '_' and '.', starting and ending with a letter or digit`},
		{func(p *AddressPool) { p.BGP.Peers = append(p.BGP.Peers, "Tor_B") }, `bgp_advertisement.peers[1]: "Tor_B" is not a BGP peer's name`},
		{func(p *AddressPool) { p.BGP.AggregationLength = 33 }, `bgp_advertisement.aggregation_length: 33 is not a prefix length (1-32)`},
		{func(p *AddressPool) { p.BGP.AggregationLengthV6 = 100 }, `bgp_advertisement.aggregation_length_v6: 100 would announce addresses outside the pool: addresses[1] holds 2001:db8::/120, longer than /100`},
	})
	p := base()
	p.Ranges = nil
	if err := p.Validate(); err == nil || err.Error() != "addresses: at least one CIDR or range is required" {
		t.Errorf("a pool with no addresses: %v", err)
	}
	p = base()
	p.Allocation.Namespaces = make([]string, maxAllocationNamespaces+1)
	if err := p.Validate(); err == nil || err.Error() != "service_allocation.namespaces: 65 namespaces; at most 64" {
		t.Errorf("a pool for 65 namespaces: %v", err)
	}
}
