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

// preferZone narrows eps to the endpoints meant for zone, following
// Kubernetes topology: endpoints whose hints name the zone when every
// endpoint carries hints, or, for trafficDistribution PreferClose without
// hints, endpoints in the zone. When that leaves none, all are kept.
func preferZone(eps []Endpoint, zone string, preferClose bool) []Endpoint {
	if zone == "" || len(eps) == 0 {
		return eps
	}
	allHinted := !slices.ContainsFunc(eps, func(e Endpoint) bool { return len(e.HintZones) == 0 })
	var keep func(Endpoint) bool
	switch {
	case allHinted:
		keep = func(e Endpoint) bool { return slices.Contains(e.HintZones, zone) }
	case preferClose:
		keep = func(e Endpoint) bool { return e.Zone == zone }
	default:
		return eps
	}
	var out []Endpoint
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return eps
	}
	return out
}
