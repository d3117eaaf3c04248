package receive

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
)

// L2Addresses are the load-balancer IPs of the cluster's L2 pools, each
// with the nodes that may answer ARP and NDP for it now (L2Candidates,
// among the nodes the pool's node selector picks), in name order: what
// the L2 owner choice chooses among.
func L2Addresses(c Cluster) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	if !slices.ContainsFunc(c.Pools, func(p *model.AddressPool) bool { return p.L2 != nil }) {
		return out
	}
	nodes := slices.Clone(c.Observed)
	slices.SortFunc(nodes, func(a, b observed.Node) int { return strings.Compare(a.Node, b.Node) })
	labels := map[string]map[string]string{}
	for _, n := range c.Nodes {
		labels[n.Name] = n.Labels
	}
	for _, svc := range c.Services {
		var candidates []string
		computed := false
		for _, vip := range svc.LoadBalancerIPs {
			pool := model.PoolOf(c.Pools, vip)
			if pool == nil || pool.L2 == nil {
				continue
			}
			if !computed {
				candidates, _ = L2Candidates(svc, nodes, c.Drained)
				computed = true
			}
			out[vip] = slices.DeleteFunc(slices.Clone(candidates), func(n string) bool {
				l, known := labels[n]
				return !known || !pool.L2.Selects(l)
			})
		}
	}
	return out
}
