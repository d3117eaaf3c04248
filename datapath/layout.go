package datapath

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/weirlb/weir/datapath/internal/nfwire"
	"sigs.k8s.io/knftables"
)

// TableName is the nftables table Weir owns in each family. Nothing else
// writes to it; it coexists with other tables by base-chain priority.
const TableName = "weir"

// DefaultMasqueradeMark is the packet-mark bit that flags a connection Weir
// has DNAT'ed. It differs from kube-proxy's 0x4000 so that a kube-proxy
// running beside Weir never masquerades Weir's connections.
const DefaultMasqueradeMark = 0x2000

// DefaultControlMark is the packet-mark bit of the agent's connections to
// its server, which the table never touches. It is none of kube-proxy's
// (0x4000, 0x8000), Calico's (0xffff0000), Cilium's (0x0f00) or
// Weir's masquerade bits.
const DefaultControlMark = 0x40

// DefaultFlowMark is the packet-mark bit that routes a moved connection's
// packet on to the next node of the ring (see FlowRedirect). None of
// kube-proxy's, Calico's, Cilium's or Weir's other bits.
const DefaultFlowMark = 0x80

// DefaultFlowPort is the UDP port of the nodes' VXLAN devices that carry
// moved connections: not 4789 (CNI plugins' VXLAN) nor 8472 (flannel's).
const DefaultFlowPort = 7449

// FlowTTL is the TTL (IPv6: hop limit) a node gives a moved connection's
// packet when it first sends it on: each node it passes lowers it by one,
// so a node tells from it how far the packet has gone.
const FlowTTL = 255

// minFlowTTL is the lowest TTL a moved packet is sent on with: what is left
// takes it from the owner to an endpoint behind any routers.
const minFlowTTL = 16

// maxEntryTTL is the highest TTL a packet from outside the ring gets
// FlowTTL with. Clients send with 64 or 128, less the routers they cross;
// a moved packet arriving with more most likely left the ring on a node
// with no rules (flushed, or being wiped) and came back through the
// router: given FlowTTL again it would go round for ever, and served here
// it would reset a connection whose node is alive. It is dropped, and the
// client's retransmission walks the ring afresh. The cost: the moved
// packets of clients that send with 255 (some network devices) are
// dropped too, and those connections stall while the router moves them.
const maxEntryTTL = 191

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
	// serviceCIDRsSet: the ranges cluster IPs come from.
	serviceCIDRsSet = "service_cidrs"
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
	// masqueradeFrontendsSet, masqueradeNodePortsSet: external and
	// load-balancer IPs, and node ports, of externalTrafficPolicy Cluster
	// services, masqueraded from every source (kube-proxy's policy).
	masqueradeFrontendsSet = "masquerade_frontends"
	masqueradeNodePortsSet = "masquerade_nodeports"
	// localFrontendsSet, localNodePortsSet: the same of Local services,
	// masqueraded when the node itself is the source.
	localFrontendsSet = "local_frontends"
	localNodePortsSet = "local_nodeports"
	// flowTTLsSet: the TTLs (IPv6: hop limits) with which a moved
	// connection's packet may still be sent on to the next node.
	flowTTLsSet = "flow_ttls"
	// flowSendersSet: the addresses of the nodes that pass moved
	// connections to this one, the only sources its tunnel takes.
	flowSendersSet = "flow_senders"
)

// frontendKind is one way a packet's destination names a service port. Each
// kind has per protocol a backends map, picks (see pick) and one chain that
// holds their rules, and a verdict map for frontends with session affinity.
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
	frontends string // frontend -> goto its session-affinity chain
	// frontendsSet and backendsSet, by protocol, are the setIDs of
	// frontends and backends(p).
	frontendsSet setID
	backendsSet  [3]setID
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

// pickChain is the chain of the kind's picks in generation g, one rule
// each. It belongs to the generation: its rules bind the generation's
// backends maps, and binding a map to a chain makes the kernel walk every
// element of it (nf_tables_bind_set), so a full sync writes the chain
// while the maps are still empty, never after they are loaded.
func (k *frontendKind) pickChain(g generation) string { return g.of(k.name + "pick") }

// keyType is the type of the kind's frontends.
func (k *frontendKind) keyType(f family) []field {
	if k.nodePort {
		return []field{inetProto, inetService}
	}
	return []field{addrType(f), inetProto, inetService}
}

// pick is the frontends of one kind and protocol that have n endpoints on
// this node (after traffic policies and topology): a set holding them, and
// one rule in the kind's pick chain that DNATs a packet to one of the n,
// uniformly at random, or drops it when n is 0. The table holds as many
// picks as there are distinct endpoint counts.
//
// Frontends are data in sets, never verdicts in a map: a transaction that
// adds a jump or goto element makes nf_tables validate the ruleset,
// walking every element of every verdict map, so a verdict map keyed by
// frontend made adding one service cost in proportion to all of them.
//
// The zero pick is none. Eight bytes: every frontend element carries one.
type pick struct {
	kind  uint8 // 1 + the index of its kind in frontendKinds; 0: none
	proto Protocol
	// hashed: the n slots are a flow table's (flowtable.go), chosen by
	// the flow's hash, not at random among n endpoints.
	hashed bool
	n      uint32
}

func (k *frontendKind) pick(p Protocol, n int) pick {
	return pick{kind: uint8(1 + slices.Index(frontendKinds, k)), proto: p, n: uint32(n)}
}

// hashedPick is the pick of frontends whose flow tables have n slots.
func (k *frontendKind) hashedPick(p Protocol, n int) pick {
	hp := k.pick(p, n)
	hp.hashed = true
	return hp
}

func (p pick) exists() bool { return p.kind != 0 }

// drops: the frontends of this pick have no endpoint here.
func (p pick) drops() bool { return p.exists() && p.n == 0 }

func (p pick) frontendKind() *frontendKind { return frontendKinds[p.kind-1] }

// set names the set of the pick's frontends.
func (p pick) set() string {
	if p.hashed {
		return p.frontendKind().name + p.proto.String() + "_table_" + strconv.Itoa(int(p.n))
	}
	return p.frontendKind().name + p.proto.String() + "_endpoints_" + strconv.Itoa(int(p.n))
}

// decl declares the pick's set.
func (p pick) decl(f family) setDecl {
	return setDecl{name: p.set(), key: p.frontendKind().keyType(f)}
}

// object is the pick's set in table generation g.
func (p pick) object(f family, g generation) knftables.Object {
	d := p.decl(f)
	return d.object(g)
}

// rule is the pick's rule, reading generation g.
func (p pick) rule(f family, mark uint32, g generation) string {
	k := p.frontendKind()
	match := k.key(f) + " " + g.ref(p.set())
	if p.n == 0 {
		return match + " drop"
	}
	return knftables.Concat(match,
		"meta mark set meta mark |", fmt.Sprintf("%#x", mark),
		"dnat", f.ip, "to", k.key(f), ".", p.choice(f), "map", g.ref(k.backends(p.proto)),
	)
}

// FlowHashSeed seeds the hash that chooses a UDP flow's endpoint: the same
// on every node and in every release, so that every node chooses alike.
const FlowHashSeed = 0x77656972

// choice is how the pick chooses a new connection's slot of the backends
// map. At random among n endpoints, as kube-proxy does: a TCP connection
// that a router moves to another node is passed back along the ring of
// moved connections (agent/flows). Hashed: a UDP flow to a frontend a
// router may move (not a cluster IP) by the hash of the client's address
// and port into its flow table, the same on every node, so that a flow a
// router moves to another node, which that node cannot tell from a new
// one, is sent to the endpoint it had (as long as the endpoints are the
// same there). Flows spread as evenly as clients' addresses and ports
// differ.
func (p pick) choice(f family) string {
	if p.hashed {
		return fmt.Sprintf("jhash %s saddr . th sport mod %d seed %#x", f.ip, p.n, FlowHashSeed)
	}
	return fmt.Sprintf("numgen random mod %d", p.n)
}

// comparePicks orders picks as their rules go in a pick chain: by
// protocol, random before hashed, then endpoint count.
func comparePicks(a, b pick) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.proto, b.proto), compareBools(a.hashed, b.hashed), cmp.Compare(a.n, b.n))
}

func compareBools(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// pickChains are the kinds' pick chains, in the order of frontendKinds,
// with the rules of picks, reading generation g. A packet walks its kind's rules until one holds its
// frontend: the walk grows with the distinct endpoint counts, never with
// the services, and only a connection's first packet makes it.
func pickChains(f family, mark uint32, g generation, picks map[pick]int) []chainSpec {
	byKind := make([][]string, len(frontendKinds))
	for _, p := range slices.SortedFunc(maps.Keys(picks), comparePicks) {
		byKind[p.kind-1] = append(byKind[p.kind-1], p.rule(f, mark, g))
	}
	out := make([]chainSpec, len(frontendKinds))
	for i, k := range frontendKinds {
		out[i] = regularChain(k.pickChain(g), byKind[i]...)
	}
	return out
}

// key is the nftables expression of the packet's frontend for this kind.
func (k *frontendKind) key(f family) string { return fieldsText(k.keyExprs(f)) }

// keyExprs are the fields of the packet's frontend for this kind, as a
// rule reads them.
func (k *frontendKind) keyExprs(f family) []field {
	if k.nodePort {
		return []field{l4proto, thDport}
	}
	return []field{daddr(f), l4proto, thDport}
}

// family holds what differs between the IPv4 and IPv6 tables.
type family struct {
	index    uint8 // in families
	nft      knftables.Family
	wire     nfwire.Family
	is6      bool
	addrType string // nftables address type
	ip       string // nftables address-match prefix
	ttl      string // the TTL's (hop limit's) expression
	icmpID   string // the ICMP echo identifier's expression
}

var (
	ipv4 = family{nft: knftables.IPv4Family, wire: nfwire.IPv4, addrType: "ipv4_addr", ip: "ip", ttl: "ip ttl", icmpID: "icmp id"}
	ipv6 = family{index: 1, nft: knftables.IPv6Family, wire: nfwire.IPv6, is6: true, addrType: "ipv6_addr", ip: "ip6", ttl: "ip6 hoplimit", icmpID: "icmpv6 id"}

	families = []*family{&ipv4, &ipv6}
)

func (f family) String() string { return string(f.nft) }

// generation names one copy of the table's sets and maps. A full sync
// fills a fresh generation while the current one keeps forwarding, in as
// many transactions as memory and cores suit, then switches the chains over
// in one small transaction: atomic for packets, and nft never has to parse
// the whole table at once.
type generation string

const (
	genA generation = "a"
	genB generation = "b"
)

func (g generation) other() generation {
	if g == genA {
		return genB
	}
	return genA
}

// of names a set or map of this generation.
func (g generation) of(set string) string { return set + "_" + string(g) }

// comment marks the rules that read this generation, for people reading
// the ruleset.
func (g generation) comment() string { return "weir generation " + string(g) }

// marker names an empty chain that exists while this generation forwards:
// the switching transaction replaces one marker with the other, so the
// names of the table's chains (listed over netlink in milliseconds, where
// reading rules through nft takes seconds on a large table) tell which
// generation is live.
func (g generation) marker() string { return "generation_" + string(g) }

// ref is a rule's reference to a set or map of this generation.
func (g generation) ref(set string) string { return "@" + g.of(set) }

// tableSets is every set and map of one generation, named with its suffix,
// for nft.
func tableSets(f family, g generation) []knftables.Object {
	var objs []knftables.Object
	for _, d := range declared[f.index] {
		objs = append(objs, d.object(g))
	}
	return objs
}

// declared are the families' sets and maps, as tableDecls declares them.
var declared = [2][]setDecl{tableDecls(ipv4), tableDecls(ipv6)}

// tableDecls declares every set and map of f's table, in the order of
// their setIDs.
func tableDecls(f family) []setDecl {
	addr := addrType(f)
	frontend := ipKind.keyType(f)
	nodePort := []field{inetProto, inetService}
	var decls []setDecl
	for _, k := range frontendKinds {
		decls = append(decls, setDecl{name: k.frontends, key: k.keyType(f), verdict: true})
		for _, p := range protocols {
			decls = append(decls, setDecl{name: k.backends(p),
				key: append(k.keyExprs(f), numgenSlot), value: []field{daddr(f), protocolDport(p)}})
		}
	}
	return append(decls,
		setDecl{name: noEndpointFrontendsSet, key: frontend},
		setDecl{name: noEndpointNodePortsSet, key: nodePort},
		setDecl{name: clusterIPsSet, key: []field{addr}},
		setDecl{name: nodePortAddressesSet, key: []field{addr}, interval: true},
		setDecl{name: localEndpointsSet, key: []field{addr}},
		setDecl{name: hairpinSet, key: []field{addr, addr}},
		setDecl{name: clusterCIDRsSet, key: []field{addr}, interval: true},
		setDecl{name: serviceCIDRsSet, key: []field{addr}, interval: true},
		setDecl{name: firewallFrontendsSet, key: frontend},
		setDecl{name: firewallAllowSet, key: append(slices.Clip(frontend), addr), interval: true},
		setDecl{name: firewallAllowLocalSet, key: frontend},
		setDecl{name: masqueradeFrontendsSet, key: frontend},
		setDecl{name: masqueradeNodePortsSet, key: nodePort},
		setDecl{name: localFrontendsSet, key: frontend},
		setDecl{name: localNodePortsSet, key: nodePort},
		setDecl{name: flowTTLsSet, key: []field{ttl(f)}, interval: true},
		setDecl{name: flowSendersSet, key: []field{addr}},
	)
}

// chainSpec is a chain with its rules.
type chainSpec struct {
	chain *knftables.Chain
	rules []string
}

func (c chainSpec) base() bool { return c.chain.Hook != nil }

func regularChain(name string, rules ...string) chainSpec {
	return chainSpec{chain: &knftables.Chain{Name: name}, rules: rules}
}

// tableChains is the fixed chains of the table with rules that refer to
// generation g, with the pick chains of picks; base chains only jump to
// fixed chains, so they never change.
func tableChains(f family, cfg Config, g generation, picks map[pick]int) []chainSpec {
	ip := f.ip
	mk := fmt.Sprintf("%#x", cfg.MasqueradeMark)
	masq := fmt.Sprintf("%#x", cfg.MasqueradeMark>>1)
	markMasq := "meta mark set meta mark | " + masq
	frontend := ip + " daddr . meta l4proto . th dport"
	// A node port's packet: to an address node ports are served on, that
	// is local. The FIB lookup costs more than a set's, so in every rule
	// it comes after the sets that usually miss, and a chain's node-port
	// rules share one (the node_ports chains).
	nodePortAddress := ip + " daddr " + g.ref(nodePortAddressesSet)
	const local = "fib daddr type local"
	// A set of node ports: its hash lookup comes before the addresses'
	// interval lookup, the port being the likelier to miss.
	nodePortIn := func(set string) string {
		return "meta l4proto . th dport " + g.ref(set) + " " + nodePortAddress + " " + local
	}
	// fromPods and notFromPods match a source that is (is not) a pod of
	// the cluster; "" when nothing can tell (the rules using them go).
	fromPods, notFromPods := ip+" saddr "+g.ref(clusterCIDRsSet), ip+" saddr != "+g.ref(clusterCIDRsSet)
	switch cfg.LocalDetection.Mode {
	case DetectBridgeInterface:
		fromPods, notFromPods = "iifname "+strconv.Quote(cfg.LocalDetection.Interface), "iifname != "+strconv.Quote(cfg.LocalDetection.Interface)
	case DetectInterfaceNamePrefix:
		fromPods, notFromPods = "iifname "+strconv.Quote(cfg.LocalDetection.Interface+"*"), "iifname != "+strconv.Quote(cfg.LocalDetection.Interface+"*")
	case DetectNone:
		fromPods, notFromPods = "", ""
	}
	// What no state may take or refuse: the agent's own connections to
	// its server (by their mark), and the agent's ports on the node's own
	// addresses. First in every chain a hook enters.
	exempt := []string{"meta mark & " + fmt.Sprintf("%#x", cfg.ControlMark) + " != 0 return"}
	for _, p := range cfg.ProtectedPorts {
		exempt = append(exempt, fmt.Sprintf("tcp dport %d "+local+" return", p))
	}
	// A moved connection's packet passed on to the next node is neither
	// DNAT'ed nor refused here.
	var passOn, orphans, invalidOrphans []string
	if cfg.Flows != nil {
		passOn = []string{"meta mark & " + fmt.Sprintf("%#x", cfg.Flows.Mark) + " != 0 return"}
		// A moved TCP packet that went round the ring without finding
		// its connection's node, on a node that passed that connection
		// on before: its entry has no DNAT, so no endpoint gets it, and
		// routed to its load-balancer IP it would go back to the router
		// and round the ring again, for ever. It is refused instead.
		orphans = []string{
			"meta l4proto tcp " + frontend + " " + g.ref(masqueradeFrontendsSet) + " goto reject_connection",
			"meta l4proto tcp " + frontend + " " + g.ref(localFrontendsSet) + " goto reject_connection",
		}
		// The same for a packet conntrack found out of its
		// connection's window (no entry, so no DNAT either): dropped,
		// as kube-proxy drops invalid packets it forwards, rather than
		// refused (a stray retransmission of a live connection must not
		// end it). One passed on to the next node carries the mark.
		notPassed := "ct state invalid meta mark & " + fmt.Sprintf("%#x", cfg.Flows.Mark) + " == 0 meta l4proto tcp "
		invalidOrphans = []string{
			notPassed + frontend + " " + g.ref(masqueradeFrontendsSet) + " drop",
			notPassed + frontend + " " + g.ref(localFrontendsSet) + " drop",
		}
	}
	only := func(match, rule string) []string {
		if match == "" {
			return nil
		}
		return []string{match + " " + rule}
	}

	// Which connections leave with the node's address, decided where the
	// destination is still the frontend: marked here, masqueraded in
	// postrouting. kube-proxy's policy (see MasqueradeKubeProxy).
	var clusterIPMasq, nodePorts, hostServices, masquerading []string
	var externalMasq string
	switch {
	case cfg.Masquerade == MasqueradePreserveLocal:
		// SNAT only where the reply would otherwise not come back
		// through this node: a pod reaching itself (hairpin), and a
		// source outside the cluster sent to an endpoint on another node.
		masquerading = slices.Concat(
			[]string{ip + " daddr " + g.ref(localEndpointsSet) + " return"},
			only(fromPods, "return"),
			[]string{"masquerade fully-random"})
	default:
		// Cluster IPs from outside the cluster; with no way to tell,
		// none (as kube-proxy without a local-traffic detector).
		clusterIPMasq = only(notFromPods, markMasq)
		if cfg.MasqueradeAll {
			clusterIPMasq = []string{markMasq}
		}
		// External and load-balancer IPs of Cluster services.
		externalMasq = " " + markMasq
		// Marked where the packet is known to be a node port's: a
		// frontend the maps above took goes by its own policy.
		nodePorts = []string{"meta l4proto . th dport " + g.ref(masqueradeNodePortsSet) + " " + markMasq}
		// The node itself reaching a Local service's external address is
		// sent anywhere in the cluster: the reply must come back here.
		hostServices = []string{
			frontend + " " + g.ref(localFrontendsSet) + " " + markMasq,
			nodePortIn(localNodePortsSet) + " " + markMasq,
		}
		// One rule: a marked connection's first packet meets it alone.
		masquerading = []string{
			"meta mark & " + masq + " != 0 meta mark set meta mark ^ " + masq + " masquerade fully-random",
		}
	}
	return append([]chainSpec{
		// DNAT. Sources inside the cluster (pods, this host) always use
		// the frontends maps; external sources first try the maps of
		// externalTrafficPolicy Local frontends, which hold only this
		// node's endpoints (or drop) so the client address survives.
		//
		// A kind's frontends are looked up (its affinity map, then its
		// picks: as many rules as there are endpoint counts) only for a
		// packet known to be sent to one, by a set of their addresses or
		// keys that the table holds anyway: the cluster IPs, and the
		// external frontends, which are all either a Cluster service's
		// (masqueraded) or a Local one's. Every other packet, a node
		// port's above all, passes each kind with one lookup. Entered by
		// jump: a frontend none of them serves goes on as before.
		regularChain("services",
			ip+" daddr "+g.ref(clusterIPsSet)+" jump cluster_ip_frontends",
			frontend+" "+g.ref(masqueradeFrontendsSet)+externalMasq+" jump ip_frontends",
			frontend+" "+g.ref(localFrontendsSet)+" jump ip_frontends",
			nodePortAddress+" "+local+" goto node_ports"),
		regularChain("cluster_ip_frontends", append(clusterIPMasq,
			frontend+" vmap "+g.ref(ipKind.frontends),
			"jump "+ipKind.pickChain(g))...),
		regularChain("ip_frontends",
			frontend+" vmap "+g.ref(ipKind.frontends),
			"jump "+ipKind.pickChain(g)),
		regularChain("node_ports", append(nodePorts,
			"meta l4proto . th dport vmap "+g.ref(nodePortKind.frontends),
			"jump "+nodePortKind.pickChain(g))...),
		regularChain("host_services", slices.Concat(exempt, hostServices, []string{"goto services"})...),
		//
		// A source outside the cluster. Only a Local service's frontend
		// tells the node's own addresses (host_services) from the
		// others, so the FIB is asked whose the source is there alone.
		regularChain("external_services",
			frontend+" "+g.ref(localFrontendsSet)+" goto external_ip_frontends",
			nodePortIn(localNodePortsSet)+" goto external_node_ports",
			"goto services"),
		// Entered by goto, and ending as the rules that send here would
		// have gone on: what no map or pick takes goes to services.
		regularChain("external_ip_frontends",
			"fib saddr type local goto host_services",
			frontend+" vmap "+g.ref(externalIPKind.frontends),
			"jump "+externalIPKind.pickChain(g),
			"goto services"),
		regularChain("external_node_ports",
			"fib saddr type local goto host_services",
			"meta l4proto . th dport vmap "+g.ref(externalNodePortKind.frontends),
			"jump "+externalNodePortKind.pickChain(g),
			"goto services"),
		regularChain("dispatch", slices.Concat(
			exempt, passOn,
			only(fromPods, "goto services"),
			[]string{"goto external_services"})...),
		{baseChain("nat_prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority), []string{"jump dispatch"}},
		{baseChain("nat_output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority), []string{"jump host_services"}},

		// SNAT: a pod reaching itself always (the reply would not go
		// through the DNAT), then what the policy above decided. The
		// marks are cleared so that nothing else acts on them.
		regularChain("masquerading", append([]string{
			"meta mark & " + mk + " == 0 return",
			"meta mark set meta mark ^ " + mk,
			ip + " saddr . " + ip + " daddr " + g.ref(hairpinSet) + " meta mark set meta mark & " + fmt.Sprintf("%#x", ^(cfg.MasqueradeMark>>1)) + " masquerade fully-random",
		}, masquerading...)...),
		{baseChain("nat_postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority), []string{"jump masquerading"}},

		// loadBalancerSourceRanges: a load-balancer frontend with ranges
		// drops sources outside them, at priority -110, before DNAT (-100).
		// Every new connection enters it, and almost none is to such a
		// frontend: one lookup sends the others back, before the ranges'
		// (the costliest set of the table: an interval of a concatenation).
		regularChain("firewall", slices.Concat(exempt, []string{
			frontend + " != " + g.ref(firewallFrontendsSet) + " return",
			frontend + " . " + ip + " saddr " + g.ref(firewallAllowSet) + " return",
			frontend + " " + g.ref(firewallAllowLocalSet) + " fib saddr type local return",
			"drop"})...),
		{baseChain("filter_prerouting", knftables.FilterType, knftables.PreroutingHook, "-110"), []string{"ct state new jump firewall"}},
		{baseChain("filter_output_firewall", knftables.FilterType, knftables.OutputHook, "-110"), []string{"ct state new jump firewall"}},

		// Reject (not drop) connections that no endpoint can serve, so
		// clients fail fast instead of timing out.
		regularChain("reject_unserved", slices.Concat(exempt, passOn, []string{
			// A connection DNAT'ed to an endpoint went where a service
			// said: the rules below are about original destinations.
			// First, as it is the most common new connection here and
			// costs one test of its conntrack entry.
			"ct status dnat return",
			frontend + " " + g.ref(noEndpointFrontendsSet) + " goto reject_connection",
			nodePortIn(noEndpointNodePortsSet) + " goto reject_connection",
			// The node's own addresses are never a cluster IP's or a
			// service range's, whatever the state says: refusing them
			// would cut the node off its host services and its server.
			local + " return",
		}, orphans, []string{
			ip + " daddr " + g.ref(clusterIPsSet) + " goto reject_connection",
			// An address of the service ranges no service holds: dropped,
			// not sent out by the default route.
			ip + " daddr " + g.ref(serviceCIDRsSet) + " drop"})...),
		// A TCP reset refuses at once; ICMP errors are rate-limited by the
		// kernel (IPv6: one a second per peer), so a client retrying would
		// wait for its SYN to time out.
		regularChain("reject_connection",
			"meta l4proto tcp reject with tcp reset",
			"reject"),
		{baseChain("filter_input", knftables.FilterType, knftables.InputHook, "filter - 10"), []string{"ct state new jump reject_unserved"}},
		{baseChain("filter_forward", knftables.FilterType, knftables.ForwardHook, "filter - 10"), slices.Concat([]string{"ct state new jump reject_unserved"}, invalidOrphans)},
		{baseChain("filter_output", knftables.FilterType, knftables.OutputHook, "filter - 10"), []string{"ct state new jump reject_unserved"}},
	}, slices.Concat(pickChains(f, cfg.MasqueradeMark, g, picks), flowChains(f, cfg, g, frontend, exempt))...)
}

func echoRequest(f family) string {
	if f.is6 {
		return "icmpv6 type echo-request"
	}
	return "icmp type echo-request"
}

// flowChains pass on the packets of established connections that a router
// moved to this node (a change of the nodes behind its ECMP route): a TCP
// packet that does not open a connection, to a load-balancer or external
// IP, that this node holds no DNAT entry for (none at all, or one a loose
// pickup or a reused 5-tuple left), goes unchanged to the next node of the
// ring through FlowRedirect.Interface, until the node that DNAT'ed the
// connection takes it. The TTL counts the nodes it has passed; a packet
// that went round the ring is DNAT'ed where it is, as without
// redirection, so that its endpoint refuses it and the client learns at
// once. Connections this node DNAT'ed return at the first rules. Only the
// nodes that pass packets here (NodeInfo.FlowSenders) may send to the
// interface's UDP port, and only what a peer passes on comes out of it.
func flowChains(f family, cfg Config, g generation, frontend string, exempt []string) []chainSpec {
	fl := cfg.Flows
	if fl == nil {
		return nil
	}
	dev := "iifname " + strconv.Quote(fl.Interface)
	return []chainSpec{
		// Packets a peer passed here that this node holds the
		// connection of, counted by how many nodes they crossed: a
		// peer sets the TTL to FlowTTL and each crossing lowers it.
		regularChain("moved_taken",
			f.ttl+" "+strconv.Itoa(FlowTTL-1)+" "+countStatement(counterTaken1)+" return",
			f.ttl+" "+strconv.Itoa(FlowTTL-2)+" "+countStatement(counterTaken2)+" return",
			f.ttl+" "+strconv.Itoa(FlowTTL-3)+" "+countStatement(counterTaken3)+" return",
			countStatement(counterTakenMore)),
		regularChain("moved_flows",
			frontend+" "+g.ref(masqueradeFrontendsSet)+" goto pass_flow",
			frontend+" "+g.ref(localFrontendsSet)+" goto pass_flow"),
		regularChain("pass_flow", slices.Concat(
			// Replies to the node's own connections are never a
			// client's, whatever address a service holds.
			[]string{"ct direction reply return"},
			exempt,
			[]string{
				// A packet that comes back from the router with the
				// TTL a ring gave it is dropped (see maxEntryTTL):
				// its client sends it again, to a fresh walk.
				"iifname != " + strconv.Quote(fl.Interface) + " " + f.ttl + " > " + strconv.Itoa(maxEntryTTL) + " " + countStatement(counterUnowned) + " drop",
				"iifname != " + strconv.Quote(fl.Interface) + " " + f.ttl + " set " + strconv.Itoa(FlowTTL),
				// The first packet of an entry: one more connection
				// passed on.
				"ct status ! confirmed " + f.ttl + " " + g.ref(flowTTLsSet) + " " + countStatement(counterPassedConnections),
				f.ttl + " " + g.ref(flowTTLsSet) + " meta mark set meta mark | " + fmt.Sprintf("%#x", fl.Mark) + " " + countStatement(counterPassedPackets) + " accept",
				// Round the ring, or no ring: served here, and
				// refused by the endpoint.
				countStatement(counterUnowned) + " accept",
			})...),
		// What peers send through the interface: TCP packets to the
		// frontends whose moved connections the rules below pass on
		// (SYNs too: see the last of them), and the probes that tell
		// peers this node takes what they pass on. Nothing else is
		// taken, and this is checked first: an entry, DNAT'ed or not,
		// never makes a datagram or a packet to another address one
		// that a peer passes on. A SYN opens a connection here, so
		// the firewall chain holds it to the service's source ranges
		// as it holds one from the router; a packet of a connection
		// this node holds met them at that connection's first packet.
		regularChain("from_flow_peer",
			echoRequest(f)+" fib daddr type local return",
			"meta l4proto tcp "+frontend+" "+g.ref(masqueradeFrontendsSet)+" return",
			"meta l4proto tcp "+frontend+" "+g.ref(localFrontendsSet)+" return",
			countStatement(counterRefusedNotPassedOn)+" drop"),
		{baseChain("flows_prerouting", knftables.FilterType, knftables.PreroutingHook, "-120"), []string{
			// Most packets: a connection this node DNAT'ed, not
			// through the interface. One rule.
			"ct status dnat iifname != " + strconv.Quote(fl.Interface) + " return",
			dev + " jump from_flow_peer",
			"ct status dnat goto moved_taken",
			"tcp flags & syn == 0 jump moved_flows",
			// A SYN that an entry of a connection this node passed on
			// took (a client reusing its port before the entry ended):
			// conntrack ignores it there, so it goes on too, to a node
			// with no entry, which serves it.
			"tcp flags & syn == syn ct status confirmed jump moved_flows",
		}},
		// The tunnel's outer packets: only the nodes that pass packets
		// to this one may send to its port, and the kernel's VXLAN
		// socket, past the input hook, never sees another's. Nothing
		// else is filtered here, so no state can cut the node off its
		// server or its other services.
		regularChain("from_flow_sender",
			f.ip+" saddr "+g.ref(flowSendersSet)+" return",
			countStatement(counterRefusedNotAPeer)+" drop"),
		{baseChain("flows_input", knftables.FilterType, knftables.InputHook, "-120"), []string{
			"udp dport " + strconv.Itoa(int(fl.Port)) + " jump from_flow_sender",
		}},
		// A peer's probe (agent/flows) is answered by the kernel as any
		// echo request is; this rule marks the answer as the table's, so
		// that a node whose rules are gone (flushed while its agent was
		// away) is passed over although its kernel still answers. Before
		// conntrack (raw priority), so that the answer matches the
		// request it tracked.
		{baseChain("flows_probe", knftables.FilterType, knftables.PreroutingHook, "raw"), []string{
			dev + " " + echoRequest(f) + " " + f.icmpID + " " + strconv.Itoa(FlowProbeID) + " " + f.icmpID + " set " + strconv.Itoa(FlowProbeAnsweredID),
		}},
	}
}

// The ICMP echo identifiers of the probes of moved connections' ring: a
// peer sends FlowProbeID, and a node's table rewrites it to
// FlowProbeAnsweredID on the way in, so that the echo reply says the
// table is there.
const (
	FlowProbeID         = 0x7448
	FlowProbeAnsweredID = 0x7449
)

// The named counters of moved connections (see FlowCounts): not of a
// generation, so that a full sync keeps what they counted.
const (
	counterPassedPackets     = "moved_passed_packets"
	counterPassedConnections = "moved_passed_connections"
	counterTaken1            = "moved_taken_packets_1_hop"
	counterTaken2            = "moved_taken_packets_2_hops"
	counterTaken3            = "moved_taken_packets_3_hops"
	counterTakenMore         = "moved_taken_packets_more_hops"
	counterUnowned           = "moved_unowned_packets"
	// Dropped before the rules above: see from_flow_sender and
	// from_flow_peer.
	counterRefusedNotAPeer    = "moved_refused_not_a_peer"
	counterRefusedNotPassedOn = "moved_refused_not_passed_on"
)

// flowCounters are the counters the rules of moved connections use.
func flowCounters(cfg Config) []*knftables.Counter {
	if cfg.Flows == nil {
		return nil
	}
	var out []*knftables.Counter
	for _, name := range []string{counterPassedPackets, counterPassedConnections, counterTaken1, counterTaken2, counterTaken3, counterTakenMore, counterUnowned,
		counterRefusedNotAPeer, counterRefusedNotPassedOn} {
		out = append(out, &knftables.Counter{Name: name})
	}
	return out
}

func countStatement(name string) string { return "counter name " + strconv.Quote(name) }

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
