package datapath

import (
	"net/netip"
	"slices"
)

// usableEndpoints returns the endpoints of one family that new connections
// may use, following kube-proxy: the ready ones or, when none is ready, those
// that are still serving while terminating (so a rolling update drains
// instead of failing).
func usableEndpoints(eps []Endpoint, is6 bool, keep func(Endpoint) bool) []Endpoint {
	// The common case, every endpoint ready and of this family, needs no copy.
	if keep == nil && !slices.ContainsFunc(eps, func(e Endpoint) bool { return !e.Ready || e.Addr.Is6() != is6 }) {
		return eps
	}
	var ready, terminating []Endpoint
	for _, ep := range eps {
		if ep.Addr.Is6() != is6 || (keep != nil && !keep(ep)) {
			continue
		}
		switch {
		case ep.Ready:
			ready = append(ready, ep)
		case ep.Serving && ep.Terminating:
			terminating = append(terminating, ep)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}

// addrsOfFamily keeps the addresses of one family.
func addrsOfFamily(addrs []netip.Addr, is6 bool) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.Is6() == is6 {
			out = append(out, a)
		}
	}
	return out
}

// topology narrows eps to the endpoints meant for this node, as
// kube-proxy reads the EndpointSlice controller's hints (whatever the
// service's trafficDistribution says: the hints carry it): when every
// ready endpoint has node hints and one names this node, the endpoints
// hinted for the node (PreferSameNode); else when every ready endpoint has
// zone hints and one names the node's zone, those (PreferClose,
// PreferSameZone); else all. Without a ready endpoint (the terminating
// fallback) there is no topology either.
func topology(eps []Endpoint, node, zone string) []Endpoint {
	allNodeHints, forNode := true, false
	allZoneHints, forZone := true, false
	ready := 0
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		ready++
		allNodeHints = allNodeHints && len(e.HintNodes()) > 0
		forNode = forNode || slices.Contains(e.HintNodes(), node)
		allZoneHints = allZoneHints && len(e.HintZones()) > 0
		forZone = forZone || (zone != "" && slices.Contains(e.HintZones(), zone))
	}
	var keep func(Endpoint) bool
	switch {
	case ready == 0:
		return eps
	case allNodeHints && forNode:
		keep = func(e Endpoint) bool { return slices.Contains(e.HintNodes(), node) }
	case allZoneHints && forZone:
		keep = func(e Endpoint) bool { return slices.Contains(e.HintZones(), zone) }
	default:
		return eps
	}
	var out []Endpoint
	for _, e := range eps {
		if e.Ready && keep(e) {
			out = append(out, e)
		}
	}
	return out
}
