package datapath

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// element is one set or map element of one family's table. Key and value
// are nftables syntax ("10.96.0.1 . tcp . 80").
type element struct {
	family *family
	set    string
	key    string
	value  string // empty for set elements
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

// serviceElements is what one service contributes to both families' tables.
func serviceElements(svc *Service) []element {
	var out []element
	for _, f := range []*family{&ipv4, &ipv6} {
		out = appendServiceElements(out, f, svc)
	}
	return out
}

func appendServiceElements(out []element, f *family, svc *Service) []element {
	clusterIPs := addrsOfFamily(svc.ClusterIPs, f.is6)
	frontends := slices.Concat(clusterIPs, addrsOfFamily(svc.ExternalIPs, f.is6), addrsOfFamily(svc.LoadBalancerIPs, f.is6))
	if len(frontends) == 0 {
		// A service without an address of this family has nothing to
		// forward in it, not even its node ports (as in kube-proxy).
		return out
	}
	for _, ip := range clusterIPs {
		out = append(out, element{family: f, set: clusterIPsSet, key: ip.String()})
	}
	for _, sp := range svc.Ports {
		proto := sp.Protocol.String()
		eps := usableEndpoints(sp.Endpoints, f.is6, nil)
		for _, ip := range frontends {
			fk := concat(ip.String(), proto, port(sp.Port))
			if len(eps) == 0 {
				out = append(out, element{family: f, set: noEndpointFrontendsSet, key: fk})
				continue
			}
			out = append(out, element{family: f, set: frontendsMap, key: fk, value: "goto " + pickChain(false, len(eps))})
			for i, ep := range eps {
				out = append(out, element{family: f, set: backendsMap, key: concat(fk, strconv.Itoa(i)), value: concat(ep.Addr.String(), port(ep.Port))})
			}
		}
		if sp.NodePort != 0 {
			nk := concat(proto, port(sp.NodePort))
			if len(eps) == 0 {
				out = append(out, element{family: f, set: noEndpointNodePortsSet, key: nk})
			} else {
				out = append(out, element{family: f, set: nodePortFrontendsMap, key: nk, value: "goto " + pickChain(true, len(eps))})
				for i, ep := range eps {
					out = append(out, element{family: f, set: nodePortBackendsMap, key: concat(nk, strconv.Itoa(i)), value: concat(ep.Addr.String(), port(ep.Port))})
				}
			}
		}
		for _, ep := range sp.Endpoints {
			if ep.Local && ep.Addr.Is6() == f.is6 {
				a := ep.Addr.String()
				out = append(out,
					element{family: f, set: localEndpointsSet, key: a},
					element{family: f, set: hairpinSet, key: concat(a, a)})
			}
		}
	}
	return out
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
		for _, p := range outermostPrefixes(slices.Concat(cfg.ClusterCIDRs, node.PodCIDRs)) {
			if p.Addr().Is6() == f.is6 {
				out = append(out, element{family: f, set: clusterCIDRsSet, key: prefixString(p)})
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
