package nodestate

import (
	"net/netip"
	"slices"

	"github.com/weirlb/weir/server/announcers"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// LimitsAnnouncers reports whether any pool limits its announcing nodes:
// then a change to the nodes or peers may change whose turn it is to
// announce any load-balancer address.
func LimitsAnnouncers(v registry.View) bool {
	return slices.ContainsFunc(v.Pools(), func(p *model.AddressPool) bool { return p.BGP.MaxAnnouncingNodes > 0 })
}

// Announcers returns, for each load-balancer IP of svc whose pool limits
// its announcing nodes, the nodes chosen to announce it, sorted; nil when
// every node may announce every address. Only externalTrafficPolicy
// Cluster services are limited: a Local service's addresses are announced
// by the nodes with its endpoints.
//
// The choice is per announced prefix (the address, or its pool's
// aggregate), so the nodes announcing an aggregate are at most the limit
// too. It depends only on the registry, so every replica, and every
// restart, makes the same one. c, when not nil, keeps the candidates for
// the next call.
func Announcers(v registry.View, svc *model.Service, c *Candidates) map[netip.Addr][]string {
	if svc.ExternalTrafficPolicy == model.PolicyLocal || len(svc.LoadBalancerIPs) == 0 || svc.OtherController {
		return nil
	}
	if c == nil {
		c = &Candidates{} // for this service's addresses alone
	}
	c.at(v)
	var out map[netip.Addr][]string
	for _, ip := range svc.LoadBalancerIPs {
		pool := model.PoolOf(c.pools, ip)
		if pool == nil || pool.BGP.MaxAnnouncingNodes <= 0 {
			continue
		}
		nodes, ok := c.byPool[pool.Name]
		if !ok {
			nodes = mayAnnounce(v, pool)
			c.byPool[pool.Name] = nodes
		}
		chosen := announcers.Choose(AnnouncedPrefix(pool, ip).String(), nodes, pool.BGP.MaxAnnouncingNodes)
		slices.Sort(chosen)
		if out == nil {
			out = map[netip.Addr][]string{}
		}
		out[ip] = chosen
	}
	return out
}

// Candidates keeps, per pool, the nodes that may announce its addresses
// (and the pools), for one CandidatesRevision of the registry: a change to
// the nodes, peers or pools makes the hub work out every load-balancer
// service again, and each would otherwise go over every node and peer. A
// Candidates is used by one goroutine at a time.
type Candidates struct {
	revision uint64
	valid    bool
	pools    []*model.AddressPool
	byPool   map[string][]string
}

// at makes c hold for v: forgets what it kept if the nodes, peers or
// pools changed since.
func (c *Candidates) at(v registry.View) {
	if c.valid && c.revision == v.CandidatesRevision() {
		return
	}
	c.revision, c.valid = v.CandidatesRevision(), true
	c.pools, c.byPool = v.Pools(), map[string][]string{}
}

// AnnouncedPrefix is what the nodes announce for ip: the host prefix, or
// the pool's aggregate holding it. The agents work it out from the same
// advertisement (datapath.BGPAdvertisement.PrefixOf), so that the
// announcer choice keyed on it is the one they make.
func AnnouncedPrefix(pool *model.AddressPool, ip netip.Addr) netip.Prefix {
	return Advertisement(pool).PrefixOf(ip)
}

// mayAnnounce lists the nodes that may announce the pool's addresses: not
// being deleted, not drained, not excluded from load balancers, and, where the routers are BgpPeer
// resources, peering with one that hears the pool. (With no BgpPeer at
// all, the agents' own command lines name the routers, which the server
// does not see: every node may.)
func mayAnnounce(v registry.View, pool *model.AddressPool) []string {
	peers := v.Peers()
	var out []string
	for _, name := range v.NodeNames() {
		n := v.Node(name)
		if n == nil || n.Deleting || n.Drained || n.Excluded() {
			continue
		}
		if len(peers) > 0 && !slices.ContainsFunc(peers, func(p *model.BGPPeer) bool {
			return p.Selects(n.Labels) && (len(pool.BGP.Peers) == 0 || slices.Contains(pool.BGP.Peers, p.Name))
		}) {
			continue
		}
		out = append(out, name)
	}
	return out
}
