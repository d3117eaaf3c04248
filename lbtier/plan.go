// Package lbtier is the dedicated load-balancer tier (weir-speaker): it
// announces every load-balancer IP to the routers with the chosen nodes as
// next hops (third-party next hops; several per prefix through ADD-PATH),
// weighted by their ready local endpoints. A node is a next hop while the
// server says it should receive the IP's traffic, the speaker's own health
// probes of the node agree, and the node is alive in the membership.
package lbtier

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpspeaker"
)

// Target is a node that should receive a load-balancer IP's traffic, as
// the server says.
type Target struct {
	VIP netip.Addr
	// Prefix is what is announced for VIP: the address alone, or its
	// pool's aggregate.
	Prefix  netip.Prefix
	Service string // "namespace/name"
	Node    string
	NextHop netip.Addr
	Weight  uint32
	Probe   ProbeKey
	// The address pool's path attributes.
	Communities      []uint32
	LargeCommunities []bgpcommunity.Large
	LocalPref        uint32
}

// PathKey is one path of a prefix.
type PathKey struct {
	Prefix netip.Prefix
	PathID uint32
}

// Why a target's path is not announced, or reaches fewer routers than it
// should (weir.v1.SpeakerPath's reasons).
const (
	ReasonProbePending        = "ProbePending"
	ReasonProbeFailing        = "ProbeFailing"
	ReasonNodeUnreachable     = "NodeUnreachable"
	ReasonNoSessions          = "NoSessions"
	ReasonAddPathNotNegotiate = "AddPathNotNegotiated"
)

// PathStatus is one target as the speaker handles it.
type PathStatus struct {
	Target
	Announced bool
	Reason    string
	Probe     string
}

// Inputs are what decides a target's path besides the server's word.
type Inputs struct {
	Probe func(ProbeKey) ProbeState
	// Unreachable: the membership declared the node dead.
	Unreachable func(node string) bool
	// PathID is the node's path identifier, the same for every prefix.
	PathID func(node string) uint32
}

// Plan is what to announce for targets: one path per prefix and node that
// passes its probes and is reachable, with the node's path identifier. A
// node's path to an aggregate weighs all its targets' weights together,
// and nothing when one of them is unweighted.
func Plan(targets []Target, in Inputs) (map[PathKey]bgpspeaker.Announcement, []PathStatus) {
	want := map[PathKey]bgpspeaker.Announcement{}
	status := make([]PathStatus, 0, len(targets))
	for _, t := range targets {
		st := PathStatus{Target: t}
		pr := in.Probe(t.Probe)
		st.Probe = pr.Last
		switch {
		case in.Unreachable(t.Node):
			st.Reason = ReasonNodeUnreachable
		case !pr.Known:
			st.Reason = ReasonProbePending
		case !pr.Up:
			st.Reason = ReasonProbeFailing
		default:
			st.Announced = true
			key := PathKey{t.Prefix, in.PathID(t.Node)}
			weight := t.Weight
			if other, ok := want[key]; ok {
				weight = bgpspeaker.AddWeights(weight, other.Weight)
			}
			want[key] = bgpspeaker.Announcement{NextHop: t.NextHop, Weight: weight,
				Communities: t.Communities, LargeCommunities: t.LargeCommunities, LocalPref: t.LocalPref, PathID: key.PathID}
		}
		status = append(status, st)
	}
	slices.SortFunc(status, func(a, b PathStatus) int {
		if c := a.VIP.Compare(b.VIP); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	return want, status
}

// explainSessions adds what the routers' sessions mean for announced
// paths: none established, or a router that hears only one of a
// prefix's several next hops.
func explainSessions(status []PathStatus, sessions []bgpspeaker.Session) {
	established, addPath := 0, true
	for _, s := range sessions {
		if s.State == "established" {
			established++
			addPath = addPath && s.AddPath
		}
	}
	// Next hops per prefix: an aggregate's may come from several VIPs.
	hops := map[netip.Prefix]map[string]bool{}
	for _, st := range status {
		if st.Announced {
			if hops[st.Prefix] == nil {
				hops[st.Prefix] = map[string]bool{}
			}
			hops[st.Prefix][st.Node] = true
		}
	}
	for i := range status {
		st := &status[i]
		switch {
		case !st.Announced:
		case established == 0:
			st.Reason = ReasonNoSessions
		case !addPath && len(hops[st.Prefix]) > 1:
			st.Reason = ReasonAddPathNotNegotiate
		}
	}
}
