package kubernetes

import (
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/server/ipam"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
)

// ConditionAccepted is a custom resource's condition: True when the
// server took it as it is, False (reason Refused) with why not.
const ConditionAccepted = "Accepted"

// accepted is the Accepted condition for an object the registry holds
// (held), or refused for why; ok is false while neither is known yet (the
// informer has not delivered it).
func accepted(obj metav1.Object, held bool, refused error) (metav1.Condition, bool) {
	c := metav1.Condition{Type: ConditionAccepted, ObservedGeneration: obj.GetGeneration(), LastTransitionTime: metav1.Now()}
	switch {
	case refused != nil && held:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Refused", refused.Error()+" (the last version taken stays in force)"
	case refused != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Refused", refused.Error()
	case held:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, "Accepted", "the server took it"
	default:
		return c, false
	}
	return c, true
}

// PoolStatus is the status of custom pool p: the registry's pool of its
// name (nil: none), why the source refused it, and the services that
// may hold its addresses. changed is false when p's status says it
// already.
func PoolStatus(p *v1alpha1.WeirAddressPool, held *model.AddressPool, refused error, services []*model.Service) (st v1alpha1.AddressPoolStatus, changed bool) {
	st = *p.Status.DeepCopy()
	cond, ok := accepted(p, held != nil && held.Source == model.SourceKubernetes, refused)
	if !ok {
		return st, false
	}
	apimeta.SetStatusCondition(&st.Conditions, cond)
	st.Mode, st.AssignedIPv4, st.AvailableIPv4, st.AssignedIPv6, st.AvailableIPv6 = "", 0, 0, 0, 0
	if held != nil && held.Source == model.SourceKubernetes { // the version in force, if refused
		u := ipam.UsageOf(held, services)
		st.AssignedIPv4, st.AvailableIPv4, st.AssignedIPv6, st.AvailableIPv6 = u.AssignedIPv4, u.AvailableIPv4, u.AssignedIPv6, u.AvailableIPv6
		st.Mode = PoolMode(held)
	}
	return st, !apiequality.Semantic.DeepEqual(st, p.Status)
}

// PeerStatus is the status of custom peer p: the registry's peer of its
// name, why the source refused it, and what the agents report of their
// sessions with its address.
func PeerStatus(p *v1alpha1.WeirBGPPeer, held *model.BGPPeer, refused error, nodes []observed.Node) (st v1alpha1.BGPPeerStatus, changed bool) {
	st = *p.Status.DeepCopy()
	cond, ok := accepted(p, held != nil && held.Source == model.SourceKubernetes, refused)
	if !ok {
		return st, false
	}
	apimeta.SetStatusCondition(&st.Conditions, cond)
	st.Sessions, st.Established = 0, 0
	if held != nil && held.Source == model.SourceKubernetes {
		for _, n := range nodes {
			for _, s := range n.BGPSessions {
				if s.PeerAddress == held.Address {
					st.Sessions++
					if s.State == "established" {
						st.Established++
					}
				}
			}
		}
	}
	return st, !apiequality.Semantic.DeepEqual(st, p.Status)
}

// PoolMode is how a pool is announced, as its status and printer column
// say: BGP, L2, or L2+BGP.
func PoolMode(p *model.AddressPool) string {
	switch {
	case p.AnsweredOverL2() && p.AnnouncedOverBGP():
		return "L2+BGP"
	case p.AnsweredOverL2():
		return "L2"
	}
	return "BGP"
}
