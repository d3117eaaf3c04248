package datapath

import "net/netip"

// usableEndpoints returns the endpoints of one family that new connections
// may use, following kube-proxy: the ready ones or, when none is ready, those
// that are still serving while terminating (so a rolling update drains
// instead of failing).
func usableEndpoints(eps []Endpoint, is6 bool, keep func(Endpoint) bool) []Endpoint {
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
