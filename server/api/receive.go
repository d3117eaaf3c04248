package api

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// received is whether a node should receive a service's external traffic
// now: reason is "" when it should; families, with load-balancer IPs and
// a BGP speaker on the node, says it per address family.
type received struct {
	reason, message string
	families        []*weirv1.ServiceFamilyStatus
}

// receiveReasons tells why node n should not receive the service's
// external traffic now. The checks run in order and the first that fails
// is the reason: the node itself, then (per family of the load-balancer
// IPs, where the node speaks BGP) its sessions, then the service's local
// endpoints, then whether the speaker announces the addresses.
func receiveReasons(reg *registry.Registry, svc *model.Service, key string, n agentsync.NodeStatus) received {
	var r received
	nodeReason, nodeMessage := nodeReceiveReason(reg, n)
	localReason, localMessage := localReceiveReason(svc, key, n)
	if len(n.BGPSessions) == 0 {
		// No speaker on the node: its addresses reach it some other way.
		r.reason, r.message = firstReason(nodeReason, nodeMessage, localReason, localMessage)
		return r
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		addrs := ofFamily(svc.LoadBalancerIPs, fam)
		if len(addrs) == 0 {
			continue
		}
		f := &weirv1.ServiceFamilyStatus{Family: fam}
		for _, a := range addrs {
			f.Addresses = append(f.Addresses, a.String())
		}
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
		f.ReceivesExternalTraffic = f.Reason == ""
		r.families = append(r.families, f)
		if r.reason == "" && f.Reason != "" {
			r.reason, r.message = f.Reason, prefix+f.Message
		}
	}
	if len(r.families) == 0 {
		r.reason, r.message = firstReason(nodeReason, nodeMessage, localReason, localMessage)
	}
	return r
}

// targetReason is why a load-balancer-tier speaker should not send
// traffic for address a to the node: the reason for a's family, except
// that the node's own speaker not announcing a does not matter there.
func (r received) targetReason(a netip.Addr) string {
	for _, f := range r.families {
		if f.GetFamily() == familyOf(a) && f.GetReason() != "NotAnnounced" {
			return f.GetReason()
		}
		if f.GetFamily() == familyOf(a) {
			return ""
		}
	}
	return r.reason
}

// firstReason is the first of two (reason, message) pairs with a reason.
func firstReason(reason1, message1, reason2, message2 string) (string, string) {
	if reason1 != "" {
		return reason1, message1
	}
	return reason2, message2
}

// nodeReceiveReason is what keeps node n from receiving any service's
// external traffic.
func nodeReceiveReason(reg *registry.Registry, n agentsync.NodeStatus) (string, string) {
	switch {
	case !n.Connected:
		return "Disconnected", "the node's agent is not connected"
	case !programmed(n):
		if n.LastError != "" {
			return "NotProgrammed", fmt.Sprintf("the agent refused version %d: %s", n.LastErrorVersion, n.LastError)
		}
		return "NotProgrammed", fmt.Sprintf("the agent applied version %d of %d sent", n.AppliedVersion, n.SentVersion)
	case n.Health.LivezCode != 200:
		return "AgentUnhealthy", fmt.Sprintf("the node's /livez answers %d", n.Health.LivezCode)
	case reg.Drained(n.Node):
		return "NodeDrained", "the node is drained"
	case !n.Health.NodeEligible:
		return "NodeDeleting", "the node is being deleted"
	}
	return "", ""
}

// localReceiveReason is what keeps node n from receiving an
// externalTrafficPolicy: Local service's traffic.
func localReceiveReason(svc *model.Service, key string, n agentsync.NodeStatus) (string, string) {
	if svc.ExternalTrafficPolicy != model.PolicyLocal {
		return "", ""
	}
	h, seen := n.Services[key]
	switch {
	case h.HealthCheckError != "":
		return "HealthCheckPortError", "the health-check node port: " + h.HealthCheckError
	case !seen || h.HealthCheckCode != 200:
		return "NoLocalEndpoints", "no ready endpoint of the service on the node"
	}
	return "", ""
}

// sessionReason: a family reaches routers from the node only over an
// established session that negotiated it. When none did, the message
// names every session and why it does not carry the family.
func sessionReason(sessions []*weirv1.BgpSession, fam string) (string, string) {
	var why []string
	for _, s := range sessions {
		carries, negotiated := carriesFamily(s, fam)
		if s.GetState() == "established" && carries {
			return "", ""
		}
		peer := fmt.Sprintf("%s (AS %d)", s.GetPeerAddress(), s.GetPeerAsn())
		switch {
		case s.GetState() != "established":
			w := peer + " " + s.GetState()
			if e := s.GetLastError(); e != "" {
				w += ": " + e
			}
			why = append(why, w)
		case !negotiated:
			why = append(why, peer+" established without "+fam)
		}
	}
	return "BGPSessionsDown", "no established BGP session carries " + fam + ": " + strings.Join(why, "; ")
}

// carriesFamily tells whether session s carries fam now, and whether the
// family was negotiated at all. Reports from agents that predate
// per-family status carry a session's own family only.
func carriesFamily(s *weirv1.BgpSession, fam string) (carries, negotiated bool) {
	if len(s.GetFamilies()) == 0 {
		a, err := netip.ParseAddr(s.GetPeerAddress())
		same := err == nil && familyOf(a) == fam
		return same, same
	}
	for _, f := range s.GetFamilies() {
		if f.GetFamily() == fam && f.GetNegotiated() {
			return true, true
		}
	}
	return false, false
}

// announceReason names the addresses the node's speaker announces under
// no prefix.
func announceReason(announcements []*weirv1.BgpAnnouncement, addrs []netip.Addr) (string, string) {
	var missing []string
	for _, a := range addrs {
		if !slices.ContainsFunc(announcements, func(an *weirv1.BgpAnnouncement) bool { return announces(an, a) }) {
			missing = append(missing, a.String())
		}
	}
	if len(missing) == 0 {
		return "", ""
	}
	return "NotAnnounced", "the node's speaker does not announce " + strings.Join(missing, ", ")
}

// announcementsOf picks the announcements that carry a service's
// addresses: their host routes, or the aggregates holding them.
func announcementsOf(all []*weirv1.BgpAnnouncement, vips []netip.Addr) []*weirv1.BgpAnnouncement {
	var out []*weirv1.BgpAnnouncement
	for _, an := range all {
		if slices.ContainsFunc(vips, func(a netip.Addr) bool { return announces(an, a) }) {
			out = append(out, an)
		}
	}
	return out
}

// announces: a route to an's prefix reaches address a.
func announces(an *weirv1.BgpAnnouncement, a netip.Addr) bool {
	p, err := netip.ParsePrefix(an.GetPrefix())
	return err == nil && p.Contains(a)
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
