package receive

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/server/announcers"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/observed"
)

// NodeHealthPort is where load balancers probe a node for services of
// externalTrafficPolicy Cluster: kube-proxy's /healthz port.
const NodeHealthPort = 10256

// VIP is one load-balancer IP with the nodes a load-balancer-tier
// speaker should send its traffic to, and how it announces it.
type VIP struct {
	Address netip.Addr
	Service string // "namespace/name"
	// Communities, LargeCommunities, LocalPreference and PrefixLength
	// are the address pool's BGP advertisement; PrefixLength 0 announces
	// the host route.
	Communities      []uint32
	LargeCommunities []bgpcommunity.Large
	LocalPreference  uint32
	PrefixLength     int
	Targets          []Target
}

// Target is one node that should receive a VIP's traffic now.
type Target struct {
	Node    string
	Address netip.Addr // the node's address of the VIP's family: the next hop
	// Weight is, for externalTrafficPolicy Local, the node's ready local
	// endpoints; 0 otherwise.
	Weight uint32
	// HealthCheckPort and HealthCheckPath are where the speaker probes
	// the node for this service.
	HealthCheckPort int
	HealthCheckPath string
}

// Cluster is what the targets are computed from: the registry's nodes,
// pools and services, what the hub knows of every node, and what sets
// nodes aside (nil: nothing).
type Cluster struct {
	Nodes    []*model.Node
	Pools    []*model.AddressPool
	Services []*model.Service
	Observed []observed.Node
	Aside    func(node string) model.Aside
}

// Targets is every load-balancer IP with the nodes that should receive
// its traffic now, sorted by address: the nodes whose verdict for the
// IP's family lets them receive (the node's own speaker not announcing
// it does not matter here), with an address of the IP's family; for
// externalTrafficPolicy Cluster, within the pool's announcer limit.
func Targets(c Cluster) []VIP {
	nodes := slices.Clone(c.Observed)
	slices.SortFunc(nodes, func(a, b observed.Node) int { return strings.Compare(a.Node, b.Node) })
	addrs, labels := map[string][]netip.Addr{}, map[string]map[string]string{}
	for _, n := range c.Nodes {
		addrs[n.Name], labels[n.Name] = n.Addresses, n.Labels
	}
	aside := make([]model.Aside, len(nodes))
	for i, n := range nodes {
		if c.Aside != nil {
			aside[i] = c.Aside(n.Node)
		}
	}
	var out []VIP
	for _, svc := range c.Services {
		if len(svc.LoadBalancerIPs) == 0 || svc.OtherController {
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		// Once per node, not per address: a verdict covers every family.
		verdicts := make([]Verdict, len(nodes))
		for i, n := range nodes {
			verdicts[i] = Of(svc, n, aside[i])
		}
		for _, vip := range svc.LoadBalancerIPs {
			vt := VIP{Address: vip, Service: key}
			pool := model.PoolOf(c.Pools, vip)
			if pool != nil && !pool.AnnouncedOverBGP() {
				continue // answered over L2 alone: no router hears it
			}
			if pool != nil {
				adv := attributes(pool, svc)
				vt.Communities, vt.LargeCommunities, vt.LocalPreference = adv.Communities, adv.LargeCommunities, adv.LocalPref
				vt.PrefixLength = adv.AggregationLength
				if vip.Is6() {
					vt.PrefixLength = adv.AggregationLengthV6
				}
			}
			for i, n := range nodes {
				hop, ok := datapath.NextHop(addrs[n.Node], vip.Is6())
				if !ok || verdicts[i].TargetReason(vip) != "" {
					continue
				}
				if pool != nil && pool.Selective() && !slices.ContainsFunc(pool.BGPAdvertisements, func(a model.BGPAdvertisement) bool {
					return a.SelectsService(svc) && a.SelectsNode(labels[n.Node])
				}) {
					continue // no advertisement of the pool has this node announce the service
				}
				t := Target{Node: n.Node, Address: hop, HealthCheckPort: NodeHealthPort, HealthCheckPath: "/healthz"}
				if svc.ExternalTrafficPolicy == model.PolicyLocal {
					t.Weight = uint32(n.Services[key].LocalReady)
					t.HealthCheckPort, t.HealthCheckPath = int(svc.HealthCheckNodePort), "/"
				}
				vt.Targets = append(vt.Targets, t)
			}
			if pool != nil && svc.ExternalTrafficPolicy != model.PolicyLocal {
				vt.Targets = withinLimit(vt.Targets, nodestate.AnnouncedPrefix(pool, vip), pool.BGP.MaxAnnouncingNodes)
			}
			out = append(out, vt)
		}
	}
	slices.SortFunc(out, func(a, b VIP) int { return strings.Compare(a.Address.String(), b.Address.String()) })
	return out
}

// attributes are what a load-balancer-tier speaker announces svc's
// addresses of pool with: the pool's one advertisement, or its several
// that select the service, combined as the nodes combine them
// (datapath.CombineAdvertisements). The speaker announces one route for
// an address, so where they aggregate differently the first's length
// holds.
func attributes(pool *model.AddressPool, svc *model.Service) datapath.BGPAdvertisement {
	var advs []datapath.BGPAdvertisement
	for _, a := range pool.Advertisements() {
		if a.SelectsService(svc) {
			advs = append(advs, nodestate.AdvertisementOf(pool, a))
		}
	}
	if len(advs) == 0 {
		return datapath.BGPAdvertisement{}
	}
	return datapath.CombineAdvertisements(advs)
}

// withinLimit keeps the targets the pool's announcer limit chooses for
// prefix among those that receive its traffic now: the same rendezvous
// choice the nodes' own speakers follow, over the healthy nodes only, so
// a node that fails is replaced by the next in the prefix's order and the
// other prefixes keep theirs.
func withinLimit(targets []Target, prefix netip.Prefix, limit int) []Target {
	if limit <= 0 || len(targets) <= limit {
		return targets
	}
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Node
	}
	chosen := announcers.Choose(prefix.String(), names, limit)
	return slices.DeleteFunc(targets, func(t Target) bool { return !slices.Contains(chosen, t.Node) })
}
