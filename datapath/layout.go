package datapath

import (
	"fmt"
	"net/netip"
	"strconv"

	"sigs.k8s.io/knftables"
)

// TableName is the nftables table Weir owns in each family. Nothing else
// writes to it; it coexists with other tables by base-chain priority.
const TableName = "weir"

// The table's maps and sets. Every lookup a packet makes is one hash lookup
// keyed by what the packet carries, so the per-packet cost does not grow with
// the number of services, and every change is a handful of element updates
// rather than rule or chain rewrites (which the kernel charges for per chain
// in the table).
const (
	// frontendsMap: cluster, external and load-balancer IP . proto . port -> goto pick_N.
	frontendsMap = "frontends"
	// nodePortFrontendsMap: proto . node port -> goto nodeport_pick_N.
	nodePortFrontendsMap = "nodeport_frontends"
	// backendsMap: IP . proto . port . slot -> endpoint address . port.
	backendsMap = "backends"
	// nodePortBackendsMap: proto . node port . slot -> endpoint address . port.
	nodePortBackendsMap = "nodeport_backends"
	// noEndpointFrontendsSet: frontends of service ports with no usable endpoint (rejected).
	noEndpointFrontendsSet = "no_endpoint_frontends"
	// noEndpointNodePortsSet: node ports with no usable endpoint (rejected).
	noEndpointNodePortsSet = "no_endpoint_nodeports"
	// clusterIPsSet: every cluster IP; a port it does not serve is rejected.
	clusterIPsSet = "cluster_ips"
	// nodePortAddressesSet: the local addresses node ports are served on.
	nodePortAddressesSet = "nodeport_addresses"
	// localEndpointsSet: endpoints on this node; replies from them come back here.
	localEndpointsSet = "local_endpoints"
	// hairpinSet: endpoint . endpoint for local endpoints, to catch a pod reaching itself.
	hairpinSet = "hairpin"
	// clusterCIDRsSet: sources inside the cluster, which need no masquerade.
	clusterCIDRsSet = "cluster_cidrs"
)

// DefaultMasqueradeMark is the packet-mark bit that flags a connection Weir
// has DNAT'ed. It differs from kube-proxy's 0x4000 so that a kube-proxy
// running beside Weir never masquerades Weir's connections.
const DefaultMasqueradeMark = 0x2000

// family holds what differs between the IPv4 and IPv6 tables.
type family struct {
	nft      knftables.Family
	is6      bool
	addrType string // nftables address type
	ip       string // nftables address-match prefix
}

var (
	ipv4 = family{nft: knftables.IPv4Family, addrType: "ipv4_addr", ip: "ip"}
	ipv6 = family{nft: knftables.IPv6Family, is6: true, addrType: "ipv6_addr", ip: "ip6"}
)

func (f family) String() string { return string(f.nft) }

// pickChain is the chain that DNATs to one of n endpoints, uniformly at
// random. Chains are shared by every service with n endpoints, so the table
// holds as many chains as there are distinct endpoint counts.
func pickChain(nodePort bool, n int) string {
	if nodePort {
		return "nodeport_pick_" + strconv.Itoa(n)
	}
	return "pick_" + strconv.Itoa(n)
}

func pickChainObjects(f family, mark uint32, nodePort bool, n int) []knftables.Object {
	key, backends := f.ip+" daddr . meta l4proto . th dport", backendsMap
	if nodePort {
		key, backends = "meta l4proto . th dport", nodePortBackendsMap
	}
	name := pickChain(nodePort, n)
	return []knftables.Object{
		&knftables.Chain{Name: name},
		&knftables.Rule{Chain: name, Rule: knftables.Concat(
			"meta mark set meta mark |", fmt.Sprintf("%#x", mark),
			"dnat", f.ip, "to", key, ". numgen random mod", n, "map", "@"+backends,
		)},
	}
}

// staticObjects is the fixed part of the table: sets, maps, base chains and
// their rules, in the order a transaction must create them.
func staticObjects(f family, mark uint32) []knftables.Object {
	addr := f.addrType
	ip := f.ip
	frontendKey := addr + " . inet_proto . inet_service"
	mk := fmt.Sprintf("%#x", mark)
	objs := []knftables.Object{
		&knftables.Map{Name: frontendsMap, Type: frontendKey + " : verdict"},
		&knftables.Map{Name: nodePortFrontendsMap, Type: "inet_proto . inet_service : verdict"},
		// The values are address . port whatever the protocol: "tcp dport"
		// only names the port type, because nft 1.0.6 cannot read back a
		// "th dport" value type when a later rule refers to the map.
		&knftables.Map{Name: backendsMap, TypeOf: ip + " daddr . meta l4proto . th dport . numgen random mod 1 : " + ip + " daddr . tcp dport"},
		&knftables.Map{Name: nodePortBackendsMap, TypeOf: "meta l4proto . th dport . numgen random mod 1 : " + ip + " daddr . tcp dport"},
		&knftables.Set{Name: noEndpointFrontendsSet, Type: frontendKey},
		&knftables.Set{Name: noEndpointNodePortsSet, Type: "inet_proto . inet_service"},
		&knftables.Set{Name: clusterIPsSet, Type: addr},
		&knftables.Set{Name: nodePortAddressesSet, Type: addr, Flags: []knftables.SetFlag{knftables.IntervalFlag}},
		&knftables.Set{Name: localEndpointsSet, Type: addr},
		&knftables.Set{Name: hairpinSet, Type: addr + " . " + addr},
		&knftables.Set{Name: clusterCIDRsSet, Type: addr, Flags: []knftables.SetFlag{knftables.IntervalFlag}},

		// DNAT: every new connection to a frontend picks an endpoint.
		&knftables.Chain{Name: "services"},
		&knftables.Rule{Chain: "services", Rule: ip + " daddr . meta l4proto . th dport vmap @" + frontendsMap},
		&knftables.Rule{Chain: "services", Rule: "fib daddr type local " + ip + " daddr @" + nodePortAddressesSet +
			" meta l4proto . th dport vmap @" + nodePortFrontendsMap},
		baseChain("nat_prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority),
		&knftables.Rule{Chain: "nat_prerouting", Rule: "jump services"},
		baseChain("nat_output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority),
		&knftables.Rule{Chain: "nat_output", Rule: "jump services"},

		// SNAT only where the reply would otherwise not come back through
		// this node: a pod reaching itself (hairpin), and a source outside
		// the cluster sent to an endpoint on another node.
		&knftables.Chain{Name: "masquerading"},
		&knftables.Rule{Chain: "masquerading", Rule: "meta mark & " + mk + " == 0 return"},
		&knftables.Rule{Chain: "masquerading", Rule: "meta mark set meta mark ^ " + mk},
		&knftables.Rule{Chain: "masquerading", Rule: ip + " saddr . " + ip + " daddr @" + hairpinSet + " masquerade fully-random"},
		&knftables.Rule{Chain: "masquerading", Rule: ip + " daddr @" + localEndpointsSet + " return"},
		&knftables.Rule{Chain: "masquerading", Rule: ip + " saddr @" + clusterCIDRsSet + " return"},
		&knftables.Rule{Chain: "masquerading", Rule: "masquerade fully-random"},
		baseChain("nat_postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority),
		&knftables.Rule{Chain: "nat_postrouting", Rule: "jump masquerading"},

		// Reject (not drop) connections that no endpoint can serve, so
		// clients fail fast instead of timing out.
		&knftables.Chain{Name: "reject_unserved"},
		&knftables.Rule{Chain: "reject_unserved", Rule: ip + " daddr . meta l4proto . th dport @" + noEndpointFrontendsSet + " reject"},
		&knftables.Rule{Chain: "reject_unserved", Rule: "fib daddr type local " + ip + " daddr @" + nodePortAddressesSet +
			" meta l4proto . th dport @" + noEndpointNodePortsSet + " reject"},
		&knftables.Rule{Chain: "reject_unserved", Rule: ip + " daddr @" + clusterIPsSet + " reject"},
	}
	for _, hook := range []knftables.BaseChainHook{knftables.InputHook, knftables.ForwardHook, knftables.OutputHook} {
		name := "filter_" + string(hook)
		objs = append(objs,
			baseChain(name, knftables.FilterType, hook, "filter - 10"),
			&knftables.Rule{Chain: name, Rule: "ct state new jump reject_unserved"},
		)
	}
	return objs
}

func baseChain(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) *knftables.Chain {
	return &knftables.Chain{Name: name, Type: &typ, Hook: &hook, Priority: &prio}
}

// prefixString renders a prefix for an interval set, as a bare address when
// it is a single host.
func prefixString(p netip.Prefix) string {
	p = p.Masked()
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}
