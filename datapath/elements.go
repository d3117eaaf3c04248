package datapath

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/weirlb/weir/internal/iprange"
)

// element is one set or map element of one family's table. Key and value
// are nftables syntax ("10.96.0.1 . tcp . 80").
type element struct {
	family *family
	set    string
	key    string
	value  string // empty for set elements
	// pick, for a frontend without session affinity, is the pick whose set
	// holds it (set is then its kind's frontends, value empty).
	pick pick
}

// elemID identifies an element regardless of its value.
type elemID struct {
	family *family
	set    string
	key    string
}

func (e element) id() elemID { return elemID{e.family, e.set, e.key} }

func concat(parts ...string) string { return strings.Join(parts, " . ") }

func port(p uint16) string { return strconv.Itoa(int(p)) }

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
	for _, f := range []*family{&ipv4, &ipv6} {
		c.addService(f, svc, node, mark)
	}
	return c
}

func (c *contribution) addService(f *family, svc *Service, node NodeInfo, mark uint32) {
	clusterIPs := addrsOfFamily(svc.ClusterIPs, f.is6)
	externalIPs := slices.Concat(addrsOfFamily(svc.ExternalIPs, f.is6), addrsOfFamily(svc.LoadBalancerIPs, f.is6))
	if len(clusterIPs)+len(externalIPs) == 0 {
		// A service without an address of this family has nothing to
		// forward in it, not even its node ports (as in kube-proxy).
		return
	}
	add := func(set, key, value string) {
		c.elems = append(c.elems, element{family: f, set: set, key: key, value: value})
	}
	var aff *affinity
	// pickFor points a frontend of kind k at the endpoints eps (the set
	// called setName): DNAT to one of them, or drop when a traffic policy
	// leaves none on this node.
	pickFor := func(k *frontendKind, p Protocol, fk string, eps []Endpoint, setName string) {
		if aff != nil && len(eps) > 0 {
			add(k.frontends, fk, "goto "+aff.chainFor(setName, eps))
			return
		}
		c.elems = append(c.elems, element{family: f, set: k.frontends, key: fk, pick: k.pick(p, len(eps))})
		for i, ep := range eps {
			add(k.backends(p), concat(fk, strconv.Itoa(i)), concat(ep.Addr.String(), port(ep.Port)))
		}
	}
	for _, ip := range clusterIPs {
		add(clusterIPsSet, ip.String(), "")
	}
	for _, sp := range svc.Ports {
		proto := sp.Protocol.String()
		aff = nil
		if svc.SessionAffinityTimeout > 0 {
			aff = newAffinity(f, svc, sp, mark)
		}
		all := usableEndpoints(sp.Endpoints, f.is6, nil)
		// Connections that may go anywhere use the cluster-wide set, made
		// close when topology asks; Local policies use this node's own
		// usable endpoints, with their own terminating fallback.
		cluster := topology(all, node.Name, node.Zone)
		local := usableEndpoints(sp.Endpoints, f.is6, func(e Endpoint) bool { return e.Local })
		internal, internalName := cluster, "cluster"
		if svc.InternalTrafficPolicy == Local {
			internal, internalName = local, "local"
		}
		externalLocal := svc.ExternalTrafficPolicy == Local
		for _, ip := range slices.Concat(clusterIPs, externalIPs) {
			fk := concat(ip.String(), proto, port(sp.Port))
			if len(all) == 0 {
				add(noEndpointFrontendsSet, fk, "")
				continue
			}
			if slices.Contains(clusterIPs, ip) {
				pickFor(&ipKind, sp.Protocol, fk, internal, internalName)
				continue
			}
			// External and load-balancer IPs: sources in the cluster are
			// short-circuited to every endpoint, external ones follow the
			// external policy.
			pickFor(&ipKind, sp.Protocol, fk, cluster, "cluster")
			if externalLocal {
				pickFor(&externalIPKind, sp.Protocol, fk, local, "local")
				add(localFrontendsSet, fk, "")
			} else {
				add(masqueradeFrontendsSet, fk, "")
			}
		}
		if sp.NodePort != 0 {
			nk := concat(proto, port(sp.NodePort))
			switch {
			case len(all) == 0:
				add(noEndpointNodePortsSet, nk, "")
			default:
				pickFor(&nodePortKind, sp.Protocol, nk, cluster, "cluster")
				if externalLocal {
					pickFor(&externalNodePortKind, sp.Protocol, nk, local, "local")
					add(localNodePortsSet, nk, "")
				} else {
					add(masqueradeNodePortsSet, nk, "")
				}
			}
		}
		if len(svc.LoadBalancerSourceRanges) > 0 {
			allowLocal := slices.ContainsFunc(svc.LoadBalancerSourceRanges, func(p netip.Prefix) bool {
				return slices.ContainsFunc(node.Addresses, p.Contains)
			})
			for _, ip := range addrsOfFamily(svc.LoadBalancerIPs, f.is6) {
				fk := concat(ip.String(), proto, port(sp.Port))
				add(firewallFrontendsSet, fk, "")
				for _, r := range svc.LoadBalancerSourceRanges {
					if r.Addr().Is6() == f.is6 {
						add(firewallAllowSet, concat(fk, prefixString(r)), "")
					}
				}
				if allowLocal {
					add(firewallAllowLocalSet, fk, "")
				}
			}
		}
		for _, ep := range sp.Endpoints {
			if ep.Local && ep.Addr.Is6() == f.is6 {
				a := ep.Addr.String()
				add(localEndpointsSet, a, "")
				add(hairpinSet, concat(a, a), "")
			}
		}
		if aff != nil {
			c.owned = append(c.owned, aff.objects()...)
		}
	}
}

// nodeElements is what the node itself contributes: where node ports are
// served and which sources are inside the cluster.
func nodeElements(node NodeInfo, cfg Config) []element {
	var out []element
	for _, f := range []*family{&ipv4, &ipv6} {
		if len(cfg.NodePortAddresses) > 0 {
			for _, p := range cfg.NodePortAddresses {
				if p.Addr().Is6() == f.is6 {
					out = append(out, element{family: f, set: nodePortAddressesSet, key: prefixString(p)})
				}
			}
		} else {
			for _, a := range addrsOfFamily(node.Addresses, f.is6) {
				if !a.IsLoopback() {
					out = append(out, element{family: f, set: nodePortAddressesSet, key: a.String()})
				}
			}
		}
		usable := slices.DeleteFunc(slices.Concat(cfg.ServiceCIDRs, node.ServiceCIDRs), func(p netip.Prefix) bool { return !serviceRangeUsable(p, node) })
		for _, p := range outermostPrefixes(usable) {
			if p.Addr().Is6() == f.is6 {
				out = append(out, element{family: f, set: serviceCIDRsSet, key: prefixString(p)})
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
				out = append(out, element{family: f, set: clusterCIDRsSet, key: prefixString(p)})
			}
		}
		if cfg.Flows != nil && node.FlowRing >= 2 && slices.ContainsFunc(node.FlowPeers, func(p FlowPeer) bool {
			return slices.ContainsFunc(p.Addresses, func(a netip.Addr) bool { return a.Is6() == f.is6 })
		}) {
			// A packet first sent on has FlowTTL, one that passed k nodes
			// FlowTTL-k: it may go on while it has not met every node.
			low := max(FlowTTL+2-node.FlowRing, minFlowTTL)
			key := strconv.Itoa(low) + "-" + strconv.Itoa(FlowTTL)
			if low == FlowTTL {
				key = strconv.Itoa(FlowTTL)
			}
			out = append(out, element{family: f, set: flowTTLsSet, key: key})
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
