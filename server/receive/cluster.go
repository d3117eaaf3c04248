package receive

import (
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry"
)

// ClusterOf is what every decision of who receives a load-balancer IP
// starts from, as one read of the registry (v) sees it: the nodes, the
// pools, the services with load-balancer IPs (no rule looks at the
// others) and what sets each observed node aside; with the nodes' status
// as observed.
func ClusterOf(v registry.View, observed []observed.Node) Cluster {
	aside := make(map[string]model.Aside, len(observed))
	for _, n := range observed {
		aside[n.Node] = v.Aside(n.Node)
	}
	return Cluster{Nodes: v.Nodes(), Pools: v.Pools(), Services: v.LoadBalancerServices(), Observed: observed,
		Aside: func(node string) model.Aside { return aside[node] }}
}
