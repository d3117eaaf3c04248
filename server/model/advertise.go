package model

import (
	"net/netip"
	"strconv"
)

// Which of a pool's BGP advertisements announce an address, by which
// nodes (MetalLB's several BGPAdvertisements of one IPAddressPool, each
// with nodeSelectors and serviceSelectors). How the attributes of several
// that apply to one prefix combine is datapath.CombineAdvertisements: the
// nodes do it, since only they know which of them they were given.

// AnsweredOverL2 reports whether the pool's addresses are answered by
// ARP and NDP, by one node per address (the pool has an L2
// advertisement).
func (p *AddressPool) AnsweredOverL2() bool { return p.L2 != nil }

// AnnouncedOverBGP reports whether the nodes announce the pool's
// addresses over BGP: every pool that is not answered over L2, and an L2
// pool that also has BGP advertisements (MetalLB's pool selected by both
// an L2Advertisement and BGPAdvertisements). Each way has its own node
// selection.
func (p *AddressPool) AnnouncedOverBGP() bool { return p.L2 == nil || len(p.BGPAdvertisements) > 0 }

// Advertisements are the ways the pool's addresses are announced over
// BGP: its several advertisements, or its one for every node and service
// (BGP, perhaps with no attribute at all); none for a pool answered over
// L2 alone.
func (p *AddressPool) Advertisements() []BGPAdvertisement {
	switch {
	case len(p.BGPAdvertisements) > 0:
		return p.BGPAdvertisements
	case p.L2 != nil:
		return nil
	}
	return []BGPAdvertisement{p.BGP}
}

// Selective reports whether which of the pool's advertisements apply
// depends on the node and the service: it has several (an L2 pool
// announced over BGP too has them, even one).
func (p *AddressPool) Selective() bool { return len(p.BGPAdvertisements) > 0 }

// SelectsNode reports whether a node with these labels announces through
// the advertisement.
func (a *BGPAdvertisement) SelectsNode(labels map[string]string) bool {
	return selects(a.NodeSelector, labels)
}

// SelectsService reports whether the advertisement announces svc's
// addresses.
func (a *BGPAdvertisement) SelectsService(svc *Service) bool {
	return selects(a.ServiceSelector, svc.Labels)
}

// Advertises reports whether a node with nodeLabels announces svc's
// addresses of the pool through its i-th advertisement. An address that
// no advertisement of a selective pool advertises on a node is not
// announced by that node.
func (p *AddressPool) Advertises(i int, svc *Service, nodeLabels map[string]string) bool {
	advs := p.Advertisements()
	return i >= 0 && i < len(advs) && advs[i].SelectsService(svc) && advs[i].SelectsNode(nodeLabels)
}

// AdvertisementsFor lists the names (AdvertisementName) of the selective
// pool's advertisements that select svc, whatever the node: the nodes
// are told these, and each keeps those of them it was given (the ones
// whose node selector selects it). Nil for a pool that is not selective.
func (p *AddressPool) AdvertisementsFor(svc *Service) []string {
	if !p.Selective() {
		return nil
	}
	out := []string{} // empty, not nil: no advertisement at all
	for i := range p.BGPAdvertisements {
		if p.BGPAdvertisements[i].SelectsService(svc) {
			out = append(out, AdvertisementName(p.Name, i))
		}
	}
	return out
}

// AdvertisementName names the i-th of a pool's several advertisements in
// a node's state, where an address refers to it.
func AdvertisementName(pool string, i int) string { return pool + "#" + strconv.Itoa(i) }

// SelectsService reports whether the L2 advertisement answers svc's
// addresses.
func (a *L2Advertisement) SelectsService(svc *Service) bool {
	return selects(a.ServiceSelector, svc.Labels)
}

// Avoids reports whether the pool never gives out a: with AvoidBuggyIPs,
// an IPv4 address ending in .0 or .255 (MetalLB's rule), which some old
// devices take for a network or broadcast address and drop.
func (p *AddressPool) Avoids(a netip.Addr) bool {
	if !p.AvoidBuggyIPs || !a.Is4() {
		return false
	}
	last := a.As4()[3]
	return last == 0 || last == 255
}
