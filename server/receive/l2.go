package receive

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
)

// NotSelected: the L2 pool's node selector leaves the node out, or its
// service selector the service.
const NotSelected = "NotSelected"

// L2Addresses are the load-balancer IPs of the cluster's L2 pools, each
// with the nodes that may answer ARP and NDP for it now (L2Why), in name
// order: what the L2 owner choice chooses among.
func L2Addresses(c Cluster) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	if !slices.ContainsFunc(c.Pools, func(p *model.AddressPool) bool { return p.L2 != nil }) {
		return out
	}
	labels := nodeLabels(c)
	for _, svc := range c.Services {
		for a, candidates := range l2Why(c, labels, svc, nil) {
			out[a] = candidates
		}
	}
	return out
}

// nodeLabels are the labels of c's nodes, by name.
func nodeLabels(c Cluster) map[string]map[string]string {
	out := make(map[string]map[string]string, len(c.Nodes))
	for _, n := range c.Nodes {
		out[n.Name] = n.Labels
	}
	return out
}

// L2Why gives, for each of svc's load-balancer IPs in an L2 pool, the
// nodes that may answer for it now (L2Candidates among those the pool's
// node selector picks), in name order, and when why is not nil, the
// reason of every other node per address.
func L2Why(c Cluster, svc *model.Service, why map[netip.Addr]map[string]Verdict) map[netip.Addr][]string {
	return l2Why(c, nodeLabels(c), svc, why)
}

func l2Why(c Cluster, labels map[string]map[string]string, svc *model.Service, why map[netip.Addr]map[string]Verdict) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	var candidates []string
	var reasons map[string]Verdict
	computed := false
	if svc.OtherController {
		return out // another controller answers for them
	}
	for _, vip := range svc.LoadBalancerIPs {
		pool := model.PoolOf(c.Pools, vip)
		if pool == nil || pool.L2 == nil {
			continue
		}
		if !computed {
			nodes := slices.Clone(c.Observed)
			slices.SortFunc(nodes, func(a, b observed.Node) int { return strings.Compare(a.Node, b.Node) })
			candidates, reasons = L2Candidates(svc, nodes, c.Aside)
			computed = true
		}
		mine := map[string]Verdict{}
		for n, v := range reasons {
			mine[n] = v
		}
		serviceSelected := pool.L2.SelectsService(svc)
		out[vip] = slices.DeleteFunc(slices.Clone(candidates), func(name string) bool {
			if !serviceSelected {
				mine[name] = Verdict{Reason: NotSelected, Message: "the service selector of pool " + pool.Name + " leaves the service out"}
				return true
			}
			if l, known := labels[name]; !known || !pool.L2.Selects(l) {
				mine[name] = Verdict{Reason: NotSelected, Message: "the node selector of pool " + pool.Name + " leaves the node out"}
				return true
			}
			return false
		})
		if why != nil {
			why[vip] = mine
		}
	}
	return out
}
