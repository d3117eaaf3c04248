package datapath

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// TableName is the nftables table Weir owns in each family. Nothing else
// writes to it; it coexists with other tables by base-chain priority.
const TableName = "weir"

// DefaultMasqueradeMark is the packet-mark bit that flags a connection Weir
// has DNAT'ed. It differs from kube-proxy's 0x4000 so that a kube-proxy
// running beside Weir never masquerades Weir's connections.
const DefaultMasqueradeMark = 0x2000

// The table's sets. Every lookup a packet makes is a hash lookup keyed by
// what the packet carries, so the per-packet cost does not grow with the
// number of services, and a change is a handful of element updates rather
// than rule or chain rewrites (which the kernel charges for per chain in
// the table).
const (
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
	// clusterCIDRsSet: sources inside the cluster, which need no masquerade
	// and are never "external" for externalTrafficPolicy.
	clusterCIDRsSet = "cluster_cidrs"
	// firewallFrontendsSet: load-balancer IP . proto . port with source ranges.
	firewallFrontendsSet = "firewall_frontends"
	// firewallAllowSet: load-balancer IP . proto . port . allowed source range.
	firewallAllowSet = "firewall_allow"
	// firewallAllowLocalSet: frontends whose ranges include this node, so
	// every local source is allowed.
	firewallAllowLocalSet = "firewall_allow_local"
)

// frontendKind is one way a packet's destination names a service port. Each
// kind has its own frontend verdict map, and per protocol a backends map
// and pick chains.
//
// Backends are split by protocol because of nft 1.0.6: a map whose value is
// "address . port" must name the port type through a protocol ("tcp
// dport"), which makes nft add that protocol as a match to every rule using
// the map; the protocol-neutral "th dport" cannot be read back from the
// kernel (nft list fails on it).
type frontendKind struct {
	name      string // prefix of its maps and chains
	nodePort  bool   // keyed by proto . port on a node-port address
	external  bool   // consulted only for sources outside the cluster
	frontends string // frontend -> goto <name><proto>_pick_N | drop
}

var (
	// ipKind: cluster, external and load-balancer IPs, for every source
	// (but external sources to an externalTrafficPolicy Local frontend).
	ipKind = frontendKind{name: "", frontends: "frontends"}
	// nodePortKind: node ports.
	nodePortKind = frontendKind{name: "nodeport_", nodePort: true, frontends: "nodeport_frontends"}
	// externalIPKind: external and load-balancer IPs of Local services, for
	// external sources: local endpoints only.
	externalIPKind = frontendKind{name: "external_", external: true, frontends: "external_frontends"}
	// externalNodePortKind: node ports of Local services, for external sources.
	externalNodePortKind = frontendKind{name: "external_nodeport_", nodePort: true, external: true, frontends: "external_nodeport_frontends"}

	frontendKinds = []*frontendKind{&ipKind, &nodePortKind, &externalIPKind, &externalNodePortKind}
	protocols     = []Protocol{TCP, UDP, SCTP}
)

// backends is the map from frontend . slot to endpoint address . port for
// one protocol.
func (k *frontendKind) backends(p Protocol) string { return k.name + p.String() + "_backends" }

// pickChain is the chain that DNATs to one of n endpoints of this kind,
// uniformly at random. Chains are shared by every service port with n
// endpoints, so the table holds as many chains as there are distinct
// endpoint counts.
func (k *frontendKind) pickChain(p Protocol, n int) string {
	return k.name + p.String() + "_pick_" + strconv.Itoa(n)
}

// kindOfChain finds what a pick chain stands for.
func kindOfChain(chain string) (*frontendKind, Protocol, int, bool) {
	for _, k := range frontendKinds {
		for _, p := range protocols {
			rest, ok := strings.CutPrefix(chain, k.name+p.String()+"_pick_")
			if !ok {
				continue
			}
			if n, err := strconv.Atoi(rest); err == nil && n > 0 {
				return k, p, n, true
			}
		}
	}
	return nil, 0, 0, false
}

// key is the nftables expression of the packet's frontend for this kind.
func (k *frontendKind) key(f family) string {
	if k.nodePort {
		return "meta l4proto . th dport"
	}
	return f.ip + " daddr . meta l4proto . th dport"
}

func (k *frontendKind) pickChainObjects(f family, mark uint32, p Protocol, n int) []knftables.Object {
	name := k.pickChain(p, n)
	return []knftables.Object{
		&knftables.Chain{Name: name},
		&knftables.Rule{Chain: name, Rule: knftables.Concat(
			"meta mark set meta mark |", fmt.Sprintf("%#x", mark),
			"dnat", f.ip, "to", k.key(f), ". numgen random mod", n, "map", "@"+k.backends(p),
		)},
	}
}

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

// staticObjects is the fixed part of the table: sets, maps, chains and
// their rules, in the order a transaction must create them.
func staticObjects(f family, mark uint32) []knftables.Object {
	addr := f.addrType
	ip := f.ip
	frontendType := addr + " . inet_proto . inet_service"
	mk := fmt.Sprintf("%#x", mark)
	interval := []knftables.SetFlag{knftables.IntervalFlag}
	var objs []knftables.Object
	for _, k := range frontendKinds {
		keyType, keyOf := frontendType, ip+" daddr . meta l4proto . th dport"
		if k.nodePort {
			keyType, keyOf = "inet_proto . inet_service", "meta l4proto . th dport"
		}
		objs = append(objs, &knftables.Map{Name: k.frontends, Type: keyType + " : verdict"})
		for _, p := range protocols {
			objs = append(objs, &knftables.Map{Name: k.backends(p),
				TypeOf: keyOf + " . numgen random mod 1 : " + ip + " daddr . " + p.String() + " dport"})
		}
	}
	nodePortMatch := "fib daddr type local " + ip + " daddr @" + nodePortAddressesSet + " meta l4proto . th dport"
	objs = append(objs,
		&knftables.Set{Name: noEndpointFrontendsSet, Type: frontendType},
		&knftables.Set{Name: noEndpointNodePortsSet, Type: "inet_proto . inet_service"},
		&knftables.Set{Name: clusterIPsSet, Type: addr},
		&knftables.Set{Name: nodePortAddressesSet, Type: addr, Flags: interval},
		&knftables.Set{Name: localEndpointsSet, Type: addr},
		&knftables.Set{Name: hairpinSet, Type: addr + " . " + addr},
		&knftables.Set{Name: clusterCIDRsSet, Type: addr, Flags: interval},
		&knftables.Set{Name: firewallFrontendsSet, Type: frontendType},
		&knftables.Set{Name: firewallAllowSet, Type: frontendType + " . " + addr, Flags: interval},
		&knftables.Set{Name: firewallAllowLocalSet, Type: frontendType},

		// DNAT. Sources inside the cluster (pods, this host) always use
		// the frontends maps; external sources first try the maps of
		// externalTrafficPolicy Local frontends, which hold only this
		// node's endpoints (or drop) so the client address survives.
		&knftables.Chain{Name: "services"},
		&knftables.Rule{Chain: "services", Rule: ip + " daddr . meta l4proto . th dport vmap @" + ipKind.frontends},
		&knftables.Rule{Chain: "services", Rule: nodePortMatch + " vmap @" + nodePortKind.frontends},
		&knftables.Chain{Name: "external_services"},
		&knftables.Rule{Chain: "external_services", Rule: ip + " daddr . meta l4proto . th dport vmap @" + externalIPKind.frontends},
		&knftables.Rule{Chain: "external_services", Rule: nodePortMatch + " vmap @" + externalNodePortKind.frontends},
		&knftables.Rule{Chain: "external_services", Rule: "goto services"},
		&knftables.Chain{Name: "dispatch"},
		&knftables.Rule{Chain: "dispatch", Rule: ip + " saddr @" + clusterCIDRsSet + " goto services"},
		&knftables.Rule{Chain: "dispatch", Rule: "fib saddr type local goto services"},
		&knftables.Rule{Chain: "dispatch", Rule: "goto external_services"},
		baseChain("nat_prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority),
		&knftables.Rule{Chain: "nat_prerouting", Rule: "jump dispatch"},
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

		// loadBalancerSourceRanges: a load-balancer frontend with ranges
		// drops sources outside them, at priority -110, before DNAT (-100).
		&knftables.Chain{Name: "firewall"},
		&knftables.Rule{Chain: "firewall", Rule: ip + " daddr . meta l4proto . th dport . " + ip + " saddr @" + firewallAllowSet + " return"},
		&knftables.Rule{Chain: "firewall", Rule: "fib saddr type local " + ip + " daddr . meta l4proto . th dport @" + firewallAllowLocalSet + " return"},
		&knftables.Rule{Chain: "firewall", Rule: ip + " daddr . meta l4proto . th dport @" + firewallFrontendsSet + " drop"},
		baseChain("filter_prerouting", knftables.FilterType, knftables.PreroutingHook, "-110"),
		&knftables.Rule{Chain: "filter_prerouting", Rule: "ct state new jump firewall"},
		baseChain("filter_output_firewall", knftables.FilterType, knftables.OutputHook, "-110"),
		&knftables.Rule{Chain: "filter_output_firewall", Rule: "ct state new jump firewall"},

		// Reject (not drop) connections that no endpoint can serve, so
		// clients fail fast instead of timing out.
		&knftables.Chain{Name: "reject_unserved"},
		&knftables.Rule{Chain: "reject_unserved", Rule: ip + " daddr . meta l4proto . th dport @" + noEndpointFrontendsSet + " reject"},
		&knftables.Rule{Chain: "reject_unserved", Rule: "fib daddr type local " + ip + " daddr @" + nodePortAddressesSet +
			" meta l4proto . th dport @" + noEndpointNodePortsSet + " reject"},
		&knftables.Rule{Chain: "reject_unserved", Rule: ip + " daddr @" + clusterIPsSet + " reject"},
	)
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
