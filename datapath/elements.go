package datapath

import (
	"net/netip"
	"slices"

	"github.com/weirlb/weir/internal/iprange"
)

// contribution is what one service adds to a node's tables: elements of
// the shared sets and maps, and the few chains and sets it owns alone
// (session affinity).
type contribution struct {
	elems []element
	owned []ownedObject
}

// serviceContribution is what one service contributes to both families'
// tables on a node.
func serviceContribution(svc *Service, node NodeInfo, mark uint32) contribution {
	var c contribution
	c.addServiceFamilies(svc, node, mark)
	return c
}

// addServiceFamilies adds what svc contributes to both families' tables.
func (c *contribution) addServiceFamilies(svc *Service, node NodeInfo, mark uint32) {
	for _, f := range families {
		c.addService(f, svc, node, mark)
	}
}

// addService adds what svc contributes to f's table: its cluster IPs, then
// per port its frontends, node port, source ranges and local endpoints.
func (c *contribution) addService(f *family, svc *Service, node NodeInfo, mark uint32) {
	clusterIPs := addrsOfFamily(svc.ClusterIPs, f.is6)
	externalIPs := slices.Concat(addrsOfFamily(svc.ExternalIPs, f.is6), addrsOfFamily(svc.LoadBalancerIPs, f.is6))
	if len(clusterIPs)+len(externalIPs) == 0 {
		// A service without an address of this family has nothing to
		// forward in it, not even its node ports (as in kube-proxy).
		return
	}
	for _, ip := range clusterIPs {
		c.add(f, sets.clusterIPs, *new(fields).addr(ip))
	}
	for _, sp := range svc.Ports {
		p := c.servicePort(f, svc, sp, node, mark)
		p.addFrontends(clusterIPs, externalIPs)
		p.addNodePort()
		p.addSourceRanges(node)
		p.addLocalEndpoints()
		if p.aff != nil {
			c.owned = append(c.owned, p.aff.objects()...)
		}
	}
}

func (c *contribution) add(f *family, set setID, key fields) {
	c.elems = append(c.elems, element{elemID: elemID{fam: f.index, set: set, key: key}})
}

// portContribution is what one service port adds to f's table, with the
// endpoints its frontends lead to.
type portContribution struct {
	c   *contribution
	f   *family
	svc *Service
	sp  ServicePort
	aff *affinity // nil without session affinity
	// all are the usable endpoints; cluster those connections that may go
	// anywhere use (close ones, when topology asks); local this node's
	// own, with their own terminating fallback.
	all, cluster, local []Endpoint
	// internal are the endpoints of cluster IPs (internalLocal: local
	// ones, by the internal traffic policy).
	internal      []Endpoint
	internalLocal bool
	externalLocal bool // the external traffic policy is Local
	// table is the flow table of the endpoints tableOf, indexing them in
	// address order, tableSorted (flowTable).
	tableOf, tableSorted []Endpoint
	table                []int32
}

func (c *contribution) servicePort(f *family, svc *Service, sp ServicePort, node NodeInfo, mark uint32) portContribution {
	p := portContribution{c: c, f: f, svc: svc, sp: sp, externalLocal: svc.ExternalTrafficPolicy == Local}
	if svc.SessionAffinityTimeout > 0 {
		p.aff = newAffinity(f, svc, sp, mark)
	}
	p.all = usableEndpoints(sp.Endpoints, f.is6, nil)
	p.cluster = topology(p.all, node.Name, node.Zone)
	p.local = usableEndpoints(sp.Endpoints, f.is6, func(e Endpoint) bool { return e.Local })
	p.internal = p.cluster
	if svc.InternalTrafficPolicy == Local {
		p.internal, p.internalLocal = p.local, true
	}
	return p
}

func (p *portContribution) add(set setID, key fields) { p.c.add(p.f, set, key) }

// pickFor points a frontend of kind k at the endpoints eps (the local
// ones or all): DNAT to one of them, or drop when a traffic policy leaves
// none on this node. routed: a router may move the frontend's flows
// between nodes (every frontend but a cluster IP), so a UDP one chooses
// by its flow table (flowtable.go).
func (p *portContribution) pickFor(k *frontendKind, fk fields, eps []Endpoint, local, routed bool) {
	c, f := p.c, p.f
	id := elemID{fam: f.index, set: k.frontendsSet, key: fk}
	if p.aff != nil && len(eps) > 0 {
		c.elems = append(c.elems, element{elemID: id, value: p.aff.chainFor(local, eps).asValue()})
		return
	}
	backends := k.backendsSet[p.sp.Protocol-1]
	slot := func(i int, ep Endpoint) {
		key := fk
		var value fields
		value.addr(ep.Addr).port(ep.Port)
		c.elems = append(c.elems, element{elemID: elemID{fam: f.index, set: backends, key: *key.slot(i)}, value: value.asValue()})
	}
	if routed && p.sp.Protocol == UDP && len(eps) > 0 {
		eps, table := p.flowTable(eps)
		c.elems = append(c.elems, element{elemID: id, pick: k.hashedPick(p.sp.Protocol, len(table))})
		for i, e := range table {
			slot(i, eps[e])
		}
		return
	}
	c.elems = append(c.elems, element{elemID: id, pick: k.pick(p.sp.Protocol, len(eps))})
	for i, ep := range eps {
		slot(i, ep)
	}
}

// flowTable is the flow table of eps and the endpoints its slots index:
// eps in address order, so that the same endpoints in whatever order
// make the same table. Built once per list, as load-balancer IPs and
// node ports share one.
func (p *portContribution) flowTable(eps []Endpoint) ([]Endpoint, []int32) {
	sameAddrs := func(a, b Endpoint) bool { return a.AddrPort() == b.AddrPort() }
	if p.tableOf != nil && slices.EqualFunc(p.tableOf, eps, sameAddrs) {
		return p.tableSorted, p.table
	}
	sorted := eps
	if !slices.IsSortedFunc(eps, compareEndpoints) {
		sorted = slices.SortedFunc(slices.Values(eps), compareEndpoints)
	}
	addrs := make([]netip.AddrPort, len(sorted))
	for i, e := range sorted {
		addrs[i] = e.AddrPort()
	}
	p.tableOf, p.tableSorted, p.table = eps, sorted, flowTable(addrs, flowTableSize(len(sorted)))
	return sorted, p.table
}

// compareEndpoints orders endpoints by address and port.
func compareEndpoints(a, b Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) }

// addFrontends adds the port on the service's cluster, external and
// load-balancer IPs.
func (p *portContribution) addFrontends(clusterIPs, externalIPs []netip.Addr) {
	sp := p.sp
	for _, ip := range slices.Concat(clusterIPs, externalIPs) {
		fk := *new(fields).addr(ip).proto(sp.Protocol).port(sp.Port)
		if len(p.all) == 0 {
			p.add(sets.noEndpointFrontends, fk)
			continue
		}
		if slices.Contains(clusterIPs, ip) {
			p.pickFor(&ipKind, fk, p.internal, p.internalLocal, false)
			continue
		}
		// External and load-balancer IPs: sources in the cluster are
		// short-circuited to every endpoint, external ones follow the
		// external policy.
		p.pickFor(&ipKind, fk, p.cluster, false, true)
		if p.externalLocal {
			p.pickFor(&externalIPKind, fk, p.local, true, true)
			p.add(sets.localFrontends, fk)
		} else {
			p.add(sets.masqueradeFrontends, fk)
		}
	}
}

// addNodePort adds the port's node port, if it has one.
func (p *portContribution) addNodePort() {
	if p.sp.NodePort == 0 {
		return
	}
	nk := *new(fields).proto(p.sp.Protocol).port(p.sp.NodePort)
	switch {
	case len(p.all) == 0:
		p.add(sets.noEndpointNodePorts, nk)
	default:
		p.pickFor(&nodePortKind, nk, p.cluster, false, true)
		if p.externalLocal {
			p.pickFor(&externalNodePortKind, nk, p.local, true, true)
			p.add(sets.localNodePorts, nk)
		} else {
			p.add(sets.masqueradeNodePorts, nk)
		}
	}
}

// addSourceRanges adds the port's load-balancer IPs with the source
// ranges allowed to reach them.
func (p *portContribution) addSourceRanges(node NodeInfo) {
	svc, sp, f := p.svc, p.sp, p.f
	if len(svc.LoadBalancerSourceRanges) == 0 {
		return
	}
	allowLocal := slices.ContainsFunc(svc.LoadBalancerSourceRanges, func(p netip.Prefix) bool {
		return slices.ContainsFunc(node.Addresses, p.Contains)
	})
	for _, ip := range addrsOfFamily(svc.LoadBalancerIPs, f.is6) {
		fk := *new(fields).addr(ip).proto(sp.Protocol).port(sp.Port)
		p.add(sets.firewallFrontends, fk)
		for _, r := range svc.LoadBalancerSourceRanges {
			if r.Addr().Is6() == f.is6 {
				key := fk
				p.add(sets.firewallAllow, *key.prefix(r))
			}
		}
		if allowLocal {
			p.add(sets.firewallAllowLocal, fk)
		}
	}
}

// addLocalEndpoints adds the port's endpoints on this node, whose replies
// come back here, and their hairpin.
func (p *portContribution) addLocalEndpoints() {
	for _, ep := range p.sp.Endpoints {
		if ep.Local && ep.Addr.Is6() == p.f.is6 {
			p.add(sets.localEndpoints, *new(fields).addr(ep.Addr))
			p.add(sets.hairpin, *new(fields).addr(ep.Addr).addr(ep.Addr))
		}
	}
}

// nodeElements is what the node itself contributes: where node ports are
// served, which sources are inside the cluster, and how far and from whom
// moved connections come.
func nodeElements(node NodeInfo, cfg Config) []element {
	var out []element
	for _, f := range families {
		add := func(set setID, key fields) {
			out = append(out, element{elemID: elemID{fam: f.index, set: set, key: key}})
		}
		if len(cfg.NodePortAddresses) > 0 {
			for _, p := range outermostPrefixes(cfg.NodePortAddresses) {
				if p.Addr().Is6() == f.is6 {
					add(sets.nodePortAddresses, *new(fields).prefix(p))
				}
			}
		} else {
			for _, a := range addrsOfFamily(node.Addresses, f.is6) {
				if !a.IsLoopback() {
					add(sets.nodePortAddresses, *new(fields).prefix(netip.PrefixFrom(a, a.BitLen())))
				}
			}
		}
		usable := slices.DeleteFunc(slices.Concat(cfg.ServiceCIDRs, node.ServiceCIDRs), func(p netip.Prefix) bool { return !serviceRangeUsable(p, node) })
		for _, p := range outermostPrefixes(usable) {
			if p.Addr().Is6() == f.is6 {
				add(sets.serviceCIDRs, *new(fields).prefix(p))
			}
		}
		var local []netip.Prefix
		switch cfg.LocalDetection.Mode {
		case DetectClusterCIDR, "":
			local = slices.Concat(cfg.ClusterCIDRs, node.PodCIDRs)
		case DetectNodeCIDR:
			local = node.PodCIDRs
		}
		for _, p := range outermostPrefixes(local) {
			if p.Addr().Is6() == f.is6 {
				add(sets.clusterCIDRs, *new(fields).prefix(p))
			}
		}
		if cfg.Flows != nil && node.FlowRing >= 2 && slices.ContainsFunc(node.FlowPeers, func(p FlowPeer) bool {
			return slices.ContainsFunc(p.Addresses, func(a netip.Addr) bool { return a.Is6() == f.is6 })
		}) {
			// A packet first sent on has FlowTTL, one that passed k nodes
			// FlowTTL-k: it may go on while it has not met every node.
			low := max(FlowTTL+2-node.FlowRing, minFlowTTL)
			add(sets.flowTTLs, *new(fields).ttls(uint8(low), FlowTTL))
		}
		if cfg.Flows != nil {
			// Whether or not this node can pass packets on, it takes
			// back what it holds from the nodes that pass to it.
			for _, p := range node.FlowSenders {
				for _, a := range addrsOfFamily(p.Addresses, f.is6) {
					add(sets.flowSenders, *new(fields).addr(a))
				}
			}
		}
	}
	return dedupe(out)
}

// outermostPrefixes drops prefixes that another one contains: an interval
// set refuses overlapping elements.
func outermostPrefixes(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, p := range ps {
		p = p.Masked()
		inside := false
		for j, q := range ps {
			q = q.Masked()
			if i != j && q.Bits() <= p.Bits() && q.Contains(p.Addr()) && (q != p || j < i) {
				inside = true
				break
			}
		}
		if !inside {
			out = append(out, p)
		}
	}
	return out
}

// dedupe drops repeated elements; interval sets refuse overlapping ones in a
// single transaction.
func dedupe(elems []element) []element {
	seen := make(map[element]bool, len(elems))
	out := elems[:0]
	for _, e := range elems {
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	return out
}

// serviceRangeUsable says whether the node may drop the free addresses of
// p: not when p is wider than a service range may be or touches a
// special-purpose range, the node's own addresses or its pods (which
// the server refuses, but a state an older version stored, or a careless
// flag, may still say), as dropping them would cut the node or its pods
// off the network.
func serviceRangeUsable(p netip.Prefix, node NodeInfo) bool {
	if iprange.ValidateServiceRange(p) != nil {
		return false
	}
	return !slices.ContainsFunc(node.Addresses, p.Contains) &&
		!slices.ContainsFunc(node.PodCIDRs, p.Overlaps)
}
