package receive

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
)

// namesShown is how many nodes a line names before it counts the rest.
const namesShown = 10

// Announced says in words, one line per load-balancer IP of svc, which
// nodes receive its traffic now and how: over L2 the node holding its
// lease (owner tells it), otherwise the nodes whose verdict for the
// address's family lets them receive, "over BGP" when they run a speaker.
// missing is true when some address has no node; its line then gives
// every node's reason. This is what a Kubernetes Service's Announced
// condition and Events say.
func Announced(c Cluster, svc *model.Service, owner func(netip.Addr) (string, bool)) (lines []string, missing bool) {
	if svc.OtherController || len(svc.LoadBalancerIPs) == 0 {
		return nil, false
	}
	nodes := slices.Clone(c.Observed)
	slices.SortFunc(nodes, func(a, b observed.Node) int { return strings.Compare(a.Node, b.Node) })
	// The nodes' verdicts over the addresses that are not L2's, which no
	// speaker announces.
	routed := *svc
	routed.LoadBalancerIPs = slices.DeleteFunc(slices.Clone(svc.LoadBalancerIPs), func(a netip.Addr) bool {
		p := model.PoolOf(c.Pools, a)
		return p != nil && p.L2 != nil
	})
	verdicts := make([]Verdict, len(nodes))
	for i, n := range nodes {
		var aside model.Aside
		if c.Aside != nil {
			aside = c.Aside(n.Node)
		}
		verdicts[i] = Of(&routed, n, aside)
	}
	var l2why map[netip.Addr]map[string]Verdict
	for _, vip := range svc.LoadBalancerIPs {
		if pool := model.PoolOf(c.Pools, vip); pool != nil && pool.L2 != nil {
			if n, ok := owner(vip); ok {
				lines = append(lines, fmt.Sprintf("%s over L2 from %s", vip, n))
				continue
			}
			if l2why == nil {
				l2why = map[netip.Addr]map[string]Verdict{}
				L2Why(c, svc, l2why)
			}
			var why []string
			for _, n := range slices.Sorted(maps.Keys(l2why[vip])) {
				why = append(why, n+": "+l2why[vip][n].Reason)
			}
			missing = true
			lines = append(lines, fmt.Sprintf("%s: no node answers it over L2 yet (%s)", vip, orNone(names(why))))
			continue
		}
		var receiving, why []string
		bgp := false
		for i, n := range nodes {
			reason := verdicts[i].Reason
			for _, f := range verdicts[i].Families {
				if f.Family == familyOf(vip) {
					reason = f.Reason
				}
			}
			if reason == "" {
				receiving = append(receiving, n.Node)
				bgp = bgp || len(n.BGPSessions) > 0
			} else {
				why = append(why, n.Node+": "+reason)
			}
		}
		switch {
		case len(receiving) == 0:
			missing = true
			lines = append(lines, fmt.Sprintf("%s: no node receives it (%s)", vip, orNone(names(why))))
		case bgp:
			lines = append(lines, fmt.Sprintf("%s over BGP from %s", vip, names(receiving)))
		default:
			lines = append(lines, fmt.Sprintf("%s received by %s", vip, names(receiving)))
		}
	}
	return lines, missing
}

// names joins the first namesShown items and counts the rest.
func names(items []string) string {
	if len(items) <= namesShown {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:namesShown], ", "), len(items)-namesShown)
}

func orNone(s string) string {
	if s == "" {
		return "no node is connected"
	}
	return s
}
