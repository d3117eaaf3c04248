// Package receive decides whether a node should receive a service's
// external traffic now, and when not, why: the verdict GetServiceStatus
// explains, the load-balancer tier follows (targets.go) and the L2 owner
// choice takes its candidates from (L2Candidates). The checks
// run in order and the first that fails is the reason: the node itself,
// then (per family of the load-balancer IPs, where the node speaks BGP)
// its sessions, then the service's local endpoints, then whether its
// speaker announces the addresses.
package receive

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/weirlb/weir/internal/report"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
)

// The reasons a node does not receive a service's external traffic, in
// the order they are checked.
const (
	Disconnected         = "Disconnected"
	NotProgrammed        = "NotProgrammed"
	AgentUnhealthy       = "AgentUnhealthy"
	NodeDrained          = "NodeDrained"
	NodeExcluded         = "NodeExcluded"
	NodeDeleting         = "NodeDeleting"
	BGPSessionsDown      = "BGPSessionsDown"
	HealthCheckPortError = "HealthCheckPortError"
	NoLocalEndpoints     = "NoLocalEndpoints"
	NotAnnounced         = "NotAnnounced"
)

// Verdict is whether a node should receive a service's external traffic
// now: Reason is "" when it should, and Message then says nothing.
type Verdict struct {
	Reason, Message string
	// Families says it per address family of the load-balancer IPs, when
	// the node runs a BGP speaker; the verdict is the first family's that
	// has a reason.
	Families []Family
}

// Receives: the node should receive the service's external traffic.
func (v Verdict) Receives() bool { return v.Reason == "" }

// Family is the verdict for the load-balancer IPs of one family.
type Family struct {
	Family          string // "ipv4" or "ipv6"
	Addresses       []netip.Addr
	Reason, Message string
}

// Of is the verdict for node n and service svc; aside is what the
// registry sets the node aside for.
func Of(svc *model.Service, n observed.Node, aside model.Aside) Verdict {
	var v Verdict
	key := svc.Namespace + "/" + svc.Name
	nodeReason, nodeMessage := nodeReason(n, aside)
	localReason, localMessage := localReason(svc, key, n)
	if len(n.BGPSessions) == 0 {
		// No speaker on the node: its addresses reach it some other way.
		v.Reason, v.Message = first(nodeReason, nodeMessage, localReason, localMessage)
		return v
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		addrs := ofFamily(svc.LoadBalancerIPs, fam)
		if len(addrs) == 0 {
			continue
		}
		f := Family{Family: fam, Addresses: addrs}
		// Only the sessions and the announcements differ by family; the
		// node's and the endpoints' reasons are said without one.
		f.Reason, f.Message = nodeReason, nodeMessage
		prefix := ""
		if f.Reason == "" {
			f.Reason, f.Message = sessionReason(n.BGPSessions, fam)
			prefix = fam + ": "
		}
		if f.Reason == "" {
			f.Reason, f.Message = localReason, localMessage
			prefix = ""
		}
		if f.Reason == "" {
			f.Reason, f.Message = announceReason(n.BGPAnnouncements, addrs)
			prefix = fam + ": "
		}
		v.Families = append(v.Families, f)
		if v.Reason == "" && f.Reason != "" {
			v.Reason, v.Message = f.Reason, prefix+f.Message
		}
	}
	if len(v.Families) == 0 {
		v.Reason, v.Message = first(nodeReason, nodeMessage, localReason, localMessage)
	}
	return v
}

// L2Candidates are the nodes that may answer ARP and NDP for svc's
// addresses now, in observed's order, and for every other node the
// verdict that keeps it out: the node's own reason, then for
// externalTrafficPolicy Local the local endpoints (the same rules as Of,
// without the BGP sessions and announcements an L2 address has no use
// for). aside tells which nodes are set aside (nil: none).
func L2Candidates(svc *model.Service, nodes []observed.Node, aside func(string) model.Aside) (candidates []string, why map[string]Verdict) {
	key := svc.Namespace + "/" + svc.Name
	why = map[string]Verdict{}
	for _, n := range nodes {
		// An owner must not lose its addresses to every write: a node
		// that applied a state and refused none counts as programmed
		// while newer ones are on their way.
		if n.AppliedVersion > 0 {
			n.SentVersion = min(n.SentVersion, n.AppliedVersion)
		}
		var a model.Aside
		if aside != nil {
			a = aside(n.Node)
		}
		nr, nm := nodeReason(n, a)
		lr, lm := localReason(svc, key, n)
		if r, m := first(nr, nm, lr, lm); r != "" {
			why[n.Node] = Verdict{Reason: r, Message: m}
			continue
		}
		candidates = append(candidates, n.Node)
	}
	return candidates, why
}

// TargetReason is why a load-balancer-tier speaker should not send
// traffic for address a to the node: the reason for a's family, except
// that the node's own speaker not announcing a does not matter there.
func (v Verdict) TargetReason(a netip.Addr) string {
	for _, f := range v.Families {
		if f.Family != familyOf(a) {
			continue
		}
		if f.Reason == NotAnnounced {
			return ""
		}
		return f.Reason
	}
	return v.Reason
}

// first is the first of two (reason, message) pairs with a reason.
func first(reason1, message1, reason2, message2 string) (string, string) {
	if reason1 != "" {
		return reason1, message1
	}
	return reason2, message2
}

// nodeReason is what keeps node n from receiving any service's external
// traffic.
func nodeReason(n observed.Node, aside model.Aside) (string, string) {
	switch {
	case !n.Connected:
		return Disconnected, "the node's agent is not connected"
	case !n.Programmed():
		if n.LastError != "" {
			return NotProgrammed, fmt.Sprintf("the agent refused version %d: %s", n.LastErrorVersion, n.LastError)
		}
		return NotProgrammed, fmt.Sprintf("the agent applied version %d of %d sent", n.AppliedVersion, n.SentVersion)
	case n.Health.LivezCode != 200:
		return AgentUnhealthy, fmt.Sprintf("the node's /livez answers %d", n.Health.LivezCode)
	case aside.Drained:
		return NodeDrained, "the node is drained"
	case aside.Excluded:
		return NodeExcluded, "the node is labelled " + model.LabelExcludeFromLoadBalancers
	case !n.Health.NodeEligible:
		return NodeDeleting, "the node is being deleted"
	}
	return "", ""
}

// localReason is what keeps node n from receiving an
// externalTrafficPolicy: Local service's traffic.
func localReason(svc *model.Service, key string, n observed.Node) (string, string) {
	if svc.ExternalTrafficPolicy != model.PolicyLocal {
		return "", ""
	}
	h, seen := n.Services[key]
	switch {
	case h.HealthCheckError != "":
		return HealthCheckPortError, "the health-check node port: " + h.HealthCheckError
	case !seen || h.HealthCheckCode != 200:
		return NoLocalEndpoints, "no ready endpoint of the service on the node"
	}
	return "", ""
}

// sessionReason: a family reaches routers from the node only over an
// established session that negotiated it. When none did, the message
// names every session and why it does not carry the family.
func sessionReason(sessions []report.BGPSession, fam string) (string, string) {
	var why []string
	for _, s := range sessions {
		carries, negotiated := carriesFamily(s, fam)
		if s.State == "established" && carries {
			return "", ""
		}
		peer := fmt.Sprintf("%s (AS %d)", s.PeerAddress, s.PeerASN)
		switch {
		case s.State != "established":
			w := peer + " " + string(s.State)
			if s.LastError != "" {
				w += ": " + s.LastError
			}
			why = append(why, w)
		case !negotiated:
			why = append(why, peer+" established without "+fam)
		}
	}
	return BGPSessionsDown, "no established BGP session carries " + fam + ": " + strings.Join(why, "; ")
}

// carriesFamily tells whether session s carries fam now, and whether the
// family was negotiated at all. Reports from agents that predate
// per-family status carry a session's own family only.
func carriesFamily(s report.BGPSession, fam string) (carries, negotiated bool) {
	if len(s.Families) == 0 {
		same := s.PeerAddress.IsValid() && familyOf(s.PeerAddress) == fam
		return same, same
	}
	for _, f := range s.Families {
		if string(f.Name) == fam && f.Negotiated {
			return true, true
		}
	}
	return false, false
}

// announceReason names the addresses the node's speaker announces under
// no prefix.
func announceReason(announcements []report.BGPAnnouncement, addrs []netip.Addr) (string, string) {
	var missing []string
	for _, a := range addrs {
		if !slices.ContainsFunc(announcements, func(an report.BGPAnnouncement) bool { return an.Prefix.Contains(a) }) {
			missing = append(missing, a.String())
		}
	}
	if len(missing) == 0 {
		return "", ""
	}
	return NotAnnounced, "the node's speaker does not announce " + strings.Join(missing, ", ")
}

// Announcing picks the announcements that carry some of addrs: their
// host routes, or the aggregates holding them.
func Announcing(all []report.BGPAnnouncement, addrs []netip.Addr) []report.BGPAnnouncement {
	var out []report.BGPAnnouncement
	for _, an := range all {
		if slices.ContainsFunc(addrs, an.Prefix.Contains) {
			out = append(out, an)
		}
	}
	return out
}

func ofFamily(addrs []netip.Addr, fam string) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if familyOf(a) == fam {
			out = append(out, a)
		}
	}
	return out
}

func familyOf(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "ipv4"
	}
	return "ipv6"
}
