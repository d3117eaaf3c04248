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

// Announced says in words, one line per load-balancer IP of svc and way
// it is announced, which nodes receive its traffic now and how: over L2
// the node holding its lease (owner tells it), otherwise the nodes whose
// verdict for the address's family lets them receive, "over BGP" when
// they run a speaker. An address of a pool announced both ways has a
// line for each (its BGP line only where nodes run speakers, or none
// receives it). missing is true when some address has no node by any of
// its ways; its lines then give every node's reason. This is what a
// Kubernetes Service's Announced condition and Events say.
func Announced(c Cluster, svc *model.Service, owner func(netip.Addr) (string, bool)) (lines []string, missing bool) {
	if svc.OtherController || len(svc.LoadBalancerIPs) == 0 {
		return nil, false
	}
	nodes := slices.Clone(c.Observed)
	slices.SortFunc(nodes, func(a, b observed.Node) int { return strings.Compare(a.Node, b.Node) })
	// The nodes' verdicts over the addresses announced over BGP (or
	// received without a speaker), leaving out those answered over L2
	// alone.
	routed := *svc
	routed.LoadBalancerIPs = slices.DeleteFunc(slices.Clone(svc.LoadBalancerIPs), func(a netip.Addr) bool {
		p := model.PoolOf(c.Pools, a)
		return p != nil && !p.AnnouncedOverBGP()
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
	var labels map[string]map[string]string
	for _, vip := range svc.LoadBalancerIPs {
		pool := model.PoolOf(c.Pools, vip)
		l2, overBGP := pool != nil && pool.AnsweredOverL2(), pool == nil || pool.AnnouncedOverBGP()
		answered := false
		if l2 {
			if n, ok := owner(vip); ok {
				lines = append(lines, fmt.Sprintf("%s over L2 from %s", vip, n))
				answered = true
			} else {
				if l2why == nil {
					l2why = map[netip.Addr]map[string]Verdict{}
					L2Why(c, svc, l2why)
				}
				var why []string
				for _, n := range slices.Sorted(maps.Keys(l2why[vip])) {
					why = append(why, n+": "+l2why[vip][n].Reason)
				}
				lines = append(lines, fmt.Sprintf("%s: no node answers it over L2 yet (%s)", vip, orNone(names(why))))
			}
		}
		if overBGP {
			var receiving, why []string
			bgp := false
			for i, n := range nodes {
				reason := verdicts[i].Reason
				for _, f := range verdicts[i].Families {
					if f.Family == familyOf(vip) {
						reason = f.Reason
					}
				}
				if reason == "" && pool != nil && pool.Selective() {
					if labels == nil {
						labels = nodeLabels(c)
					}
					if !slices.ContainsFunc(pool.BGPAdvertisements, func(a model.BGPAdvertisement) bool {
						return a.SelectsService(svc) && a.SelectsNode(labels[n.Node])
					}) {
						reason = NotSelected // no advertisement of the pool has this node announce the service
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
				lines = append(lines, fmt.Sprintf("%s: no node receives it (%s)", vip, orNone(names(why))))
			case bgp:
				lines = append(lines, fmt.Sprintf("%s over BGP from %s", vip, names(receiving)))
				answered = true
			case !l2:
				lines = append(lines, fmt.Sprintf("%s received by %s", vip, names(receiving)))
				answered = true
			}
		}
		missing = missing || !answered
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
