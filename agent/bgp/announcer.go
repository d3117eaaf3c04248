package bgp

import (
	"cmp"
	"context"
	"iter"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/internal/report"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/iprange"
)

// Announcer decides what the node announces: each load-balancer IP of a
// service, with the node as next hop, while the node is healthy, not
// drained or going away, and (for externalTrafficPolicy Local) has a ready
// local endpoint. It withdraws as soon as a new state says so, and
// announces only once the state's rules are applied.
type Announcer struct {
	sp           Speaker
	proxyHealthy func() bool
	log          *slog.Logger

	mu sync.Mutex // guards the fields below
	// node is the node as last received. The services are not kept:
	// wants holds what they ask for.
	node  datapath.NodeInfo
	wants wants
	// eligible: at the last sync, the node could attract traffic (not
	// going away, drained or excluded, and its proxy healthy).
	eligible  bool
	announced map[netip.Prefix]Announcement
	// pending are the prefixes whose announcement may differ from what
	// is wanted: the only ones a sync looks at.
	pending  map[netip.Prefix]bool
	reported report.BGPReport
	// peersFailed, rulesFailed: the last peer set or export rules were
	// not applied whole; Report, every second, tries again.
	peersFailed, rulesFailed bool
	// rules are the export rules last given to the speaker; perService:
	// some follow the services' own advertisements (ExportRules), so a
	// changed service may change them.
	rules                []ExportRule
	rulesSet, perService bool
	// applied: a state was applied since the start. Peers are dialled
	// only then, so that a router that kept this node's routes through a
	// restart (graceful restart) gets the whole table before End-of-RIB.
	applied bool
	// changed: announced differs from what was last reported.
	changed bool
}

// NewAnnouncer announces through sp.
func NewAnnouncer(sp Speaker, proxyHealthy func() bool, log *slog.Logger) *Announcer {
	return &Announcer{sp: sp, proxyHealthy: proxyHealthy, log: log, wants: newWants(),
		announced: map[netip.Prefix]Announcement{}, pending: map[netip.Prefix]bool{}}
}

// Received withdraws what st says the node should no longer attract.
func (a *Announcer) Received(st datapath.NodeState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	peersChanged := !slices.EqualFunc(st.Node.BGPPeers, a.node.BGPPeers, datapath.BGPPeer.Equal)
	rulesChanged := peersChanged || !slices.EqualFunc(st.Node.Advertisements, a.node.Advertisements, datapath.BGPAdvertisement.Equal)
	if st.Changed == nil || !sameForWants(st.Node, a.node) {
		// What every service asks for may differ.
		a.markPending(a.wants.clear())
		for key, svc := range st.Services {
			a.markPending(a.wants.set(key, svc, st.Node))
		}
	} else {
		for _, key := range st.Changed {
			a.markPending(a.wants.set(key, st.Services[key], st.Node))
		}
	}
	a.node = st.Node
	if rulesChanged || a.perService {
		// Before anything is announced under them.
		a.setExportRules()
	}
	if peersChanged && a.applied {
		a.setPeers(st.Node.BGPPeers)
	}
	a.sync(false)
}

// PeerGracefulRestart is the restart time offered to peers that ask for
// graceful restart, FRR's default.
const PeerGracefulRestart = 120 * time.Second

// setPeers peers with the routers the server chose for this node.
func (a *Announcer) setPeers(from []datapath.BGPPeer) {
	peers := make([]Peer, len(from))
	for i, p := range from {
		peers[i] = Peer{Address: p.Address, Port: p.Port, ASN: p.ASN, MyASN: p.MyASN, HoldTime: p.HoldTime, Password: p.Password,
			EBGPMultihopTTL: p.EBGPMultihopTTL, SourceAddress: p.SourceAddress, Keepalive: p.Keepalive, ConnectRetry: p.ConnectRetry,
			BFD: p.BFD, DynamicASN: p.DynamicASN, VRF: p.VRF}
		switch {
		case p.Address.IsValid() && p.Interface != "":
			// A link-local address means nothing without its link.
			peers[i].Address = p.Address.WithZone(p.Interface)
		case p.Interface != "":
			peers[i].Interface = p.Interface
		}
		if p.GracefulRestart {
			peers[i].GracefulRestart = PeerGracefulRestart
		}
	}
	if err := a.sp.SetPeers(context.Background(), peers); err != nil {
		if !a.peersFailed {
			a.log.Error("setting BGP peers failed; retrying every second", "error", err)
		}
		a.peersFailed = true
		return
	}
	a.peersFailed = false
	a.log.Info("BGP peers set", "peers", len(peers))
}

// setExportRules keeps each pool that names its peers to those of the
// node's peers. What the new rules send to other peers is withdrawn first
// (under the old rules, which is the only way the routers hear it) and
// announced again by the next sync.
func (a *Announcer) setExportRules() {
	ctx := context.Background()
	rules, perService := ExportRules(a.node, a.wants.audiences)
	a.perService = perService
	if a.rulesSet && !a.rulesFailed && slices.EqualFunc(rules, a.rules, ExportRule.Equal) {
		return
	}
	for p, had := range a.announced {
		before, allBefore := bgpspeaker.Audience(a.rules, p)
		after, allAfter := bgpspeaker.Audience(rules, p)
		if allBefore == allAfter && before.SameAudience(after) {
			continue
		}
		if err := a.sp.Withdraw(ctx, p, had); err != nil {
			a.log.Error("BGP withdraw failed", "prefix", p, "error", err)
			continue
		}
		delete(a.announced, p)
		a.pending[p] = true // announced again by the next sync
		a.changed = true
	}
	if err := a.sp.SetExportRules(ctx, rules); err != nil {
		if !a.rulesFailed {
			a.log.Error("setting which peers hear which pools failed; retrying every second", "error", err)
		}
		a.rulesFailed = true
		return
	}
	a.rules, a.rulesSet, a.rulesFailed = rules, true, false
}

// ExportRules are the rules for node's advertisements that name peers. A
// pool whose advertisements all go to the same peers has one rule over its
// ranges. A pool whose several advertisements (chosen by service) go to
// different peers has one rule per set of peers, over the prefixes its
// services ask for (audiences: each wanted prefix of the ranges and the
// peers its own advertisements name, none for every peer); perService
// says there is such a pool, so that a changed service may change the
// rules.
func ExportRules(node datapath.NodeInfo, audiences func(ranges []datapath.AddressRange) map[netip.Prefix][]string) (rules []ExportRule, perService bool) {
	// The pools: one advertisement of its own, or several named ones
	// over the same ranges.
	type pool struct {
		ranges []datapath.AddressRange
		peers  [][]string
	}
	var pools []pool
	for _, adv := range node.Advertisements {
		i := -1
		if adv.Name != "" {
			i = slices.IndexFunc(pools, func(p pool) bool { return slices.Equal(p.ranges, adv.Ranges) })
		}
		if i < 0 {
			pools = append(pools, pool{ranges: adv.Ranges})
			i = len(pools) - 1
		}
		pools[i].peers = append(pools[i].peers, sortedPeers(adv.Peers))
	}
	rule := func(prefixes []netip.Prefix, names []string) ExportRule {
		r := ExportRule{Prefixes: prefixes}
		for _, p := range node.BGPPeers {
			switch {
			case !slices.Contains(names, p.Name):
			case p.Address.IsValid():
				r.Peers = append(r.Peers, p.Address)
			default:
				// Unnumbered: whoever is on the link.
				r.Links = append(r.Links, p.Interface)
			}
		}
		return r
	}
	for _, p := range pools {
		if !slices.ContainsFunc(p.peers, func(names []string) bool { return !slices.Equal(names, p.peers[0]) }) {
			if len(p.peers[0]) == 0 {
				continue // every peer
			}
			var prefixes []netip.Prefix
			for _, rg := range p.ranges {
				prefixes = append(prefixes, iprange.Prefixes(rg.First, rg.Last)...)
			}
			rules = append(rules, rule(prefixes, p.peers[0]))
			continue
		}
		perService = true
		if audiences == nil {
			continue
		}
		byPeers := map[string][]netip.Prefix{}
		for prefix, names := range audiences(p.ranges) {
			if names = sortedPeers(names); len(names) > 0 {
				key := strings.Join(names, "\x00")
				byPeers[key] = append(byPeers[key], prefix)
			}
		}
		for _, key := range slices.Sorted(maps.Keys(byPeers)) {
			prefixes := byPeers[key]
			slices.SortFunc(prefixes, func(a, b netip.Prefix) int {
				return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
			})
			r := rule(prefixes, strings.Split(key, "\x00"))
			// Each prefix alone: an aggregate of one advertisement may
			// hold the host prefixes of another.
			r.Exact = true
			rules = append(rules, r)
		}
	}
	return rules, perService
}

// sortedPeers is names sorted, without repeats.
func sortedPeers(names []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(names)))
}

// Applied announces what the applied state says the node should attract.
func (a *Announcer) Applied(time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sync(true)
	if !a.applied {
		a.applied = true
		a.setPeers(a.node.BGPPeers)
	}
}

// Report gives the speaker's sessions and announcements when they
// changed (always when full).
func (a *Announcer) Report(full bool) *report.Report {
	sessions, err := a.sp.Sessions(context.Background())
	if err != nil {
		a.log.Error("listing BGP sessions failed", "error", err)
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rulesFailed {
		a.setExportRules()
	}
	if a.peersFailed {
		a.setPeers(a.node.BGPPeers)
	}
	if !full && !a.changed && sameSessions(sessions, a.reported.Sessions) {
		return nil
	}
	now := report.BGPReport{Announcements: a.reported.Announcements}
	for _, s := range sessions {
		hs := report.BGPSession{PeerAddress: s.PeerAddress, PeerASN: s.PeerASN, State: s.State, Since: s.Since, LastError: s.LastError, BFD: s.BFD}
		for _, f := range s.Families {
			hs.Families = append(hs.Families, report.BGPFamily(f))
		}
		now.Sessions = append(now.Sessions, hs)
	}
	if a.changed || full {
		// Rebuilt only when it changed: a node may announce thousands.
		now.Announcements = make([]report.BGPAnnouncement, 0, len(a.announced))
		for p, an := range a.announced {
			now.Announcements = append(now.Announcements, report.BGPAnnouncement{Prefix: p, NextHop: an.NextHop, Weight: an.Weight})
		}
		slices.SortFunc(now.Announcements, func(x, y report.BGPAnnouncement) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	}
	a.reported, a.changed = now, false
	return &report.Report{Full: full, BGP: &now}
}

// Established reports whether the node announces to a router: a state
// was applied (so the announcements were made) and at least one session is
// established. A rollout waits for it before it stops the next node's
// agent (see the agent's /readyz).
func (a *Announcer) Established() bool {
	a.mu.Lock()
	applied := a.applied
	a.mu.Unlock()
	if !applied {
		return false
	}
	sessions, err := a.sp.Sessions(context.Background())
	if err != nil {
		return false
	}
	for _, s := range sessions {
		if s.State == report.BGPEstablished {
			return true
		}
	}
	return false
}

// Announced lists what is announced now.
func (a *Announcer) Announced() map[netip.Prefix]Announcement {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[netip.Prefix]Announcement, len(a.announced))
	for p, h := range a.announced {
		out[p] = h
	}
	return out
}

// sync withdraws what is not wanted and, when rise, announces what is,
// looking at the pending prefixes alone. Called with mu held.
func (a *Announcer) sync(rise bool) {
	eligible := attracts(a.node) && a.proxyHealthy()
	if eligible != a.eligible {
		a.eligible = eligible
		a.markPending(maps.Keys(a.announced))
		a.markPending(maps.Keys(a.wants.prefixes))
	}
	changed, _ := bgpspeaker.ReconcileKeys(context.Background(), a.sp, a.announced, a.want, maps.Keys(a.pending),
		func(p netip.Prefix) netip.Prefix { return p }, rise, a.log)
	a.changed = a.changed || changed
	for p := range a.pending {
		had, announced := a.announced[p]
		want, wanted := a.want(p)
		if announced == wanted && (!wanted || had.Same(want)) {
			delete(a.pending, p)
		}
	}
	if len(a.pending) == 0 {
		// A new map: an emptied one keeps its size, and walking it
		// would cost every prefix a whole state once made pending.
		a.pending = map[netip.Prefix]bool{}
	}
}

// want is what the node should announce for p now.
func (a *Announcer) want(p netip.Prefix) (Announcement, bool) {
	if !a.eligible {
		return Announcement{}, false
	}
	return a.wants.of(p)
}

func (a *Announcer) markPending(prefixes iter.Seq[netip.Prefix]) {
	for p := range prefixes {
		a.pending[p] = true
	}
}

// attracts tells whether node may attract traffic: not going away,
// drained by an operator or labelled out of external load balancers.
func attracts(node datapath.NodeInfo) bool {
	return !node.Deleting && !node.Drained && !node.Excluded
}

// Wanted is what a node in state st should announce: every load-balancer
// IP, as a host prefix or its pool's aggregate, with the node's address of
// that family as next hop, unless the node should not attract the
// service's traffic. An aggregate is announced while any of its addresses
// would be, weighted by all their local endpoints (unweighted when one of
// them is a Cluster service's, which every node serves alike). Where the
// pool limits its announcing nodes, only the nodes chosen for an address
// announce it. The Announcer keeps the same incrementally.
func Wanted(st datapath.NodeState, proxyHealthy bool) map[netip.Prefix]Announcement {
	want := map[netip.Prefix]Announcement{}
	if !attracts(st.Node) || !proxyHealthy {
		return want
	}
	for _, svc := range st.Services {
		for _, w := range serviceWants(svc, st.Node) {
			a := w.Announcement
			if other, ok := want[w.prefix]; ok {
				a.Weight = bgpspeaker.AddWeights(a.Weight, other.Weight)
			}
			want[w.prefix] = a
		}
	}
	return want
}

// prefixWant is one load-balancer IP's wish: its prefix announced so, to
// the peers its advertisements name (none: every peer).
type prefixWant struct {
	prefix netip.Prefix
	Announcement
	peers []string
}

// serviceWants are the announcements svc asks of node, one per
// load-balancer IP the node should announce.
func serviceWants(svc *datapath.Service, node datapath.NodeInfo) []prefixWant {
	if svc.OtherController {
		return nil // its controller announces it
	}
	var out []prefixWant
	for _, vip := range svc.LoadBalancerIPs {
		hop, ok := datapath.NextHop(node.Addresses, vip.Is6())
		if !ok {
			continue
		}
		if !node.AnnouncesOverBGP(vip) {
			continue // answered over L2 alone, by the node that holds its lease
		}
		if chosen, limited := svc.Announcers[vip]; limited && !slices.Contains(chosen, node.Name) {
			continue // the pool's other nodes announce it (max_announcing_nodes)
		}
		advs := node.AdvertisementsOf(svc, vip)
		if len(advs) == 0 {
			continue // no advertisement of the pool selects both the service and this node
		}
		var weight uint32
		if svc.ExternalTrafficPolicy == datapath.Local {
			// The node gets traffic in proportion to its endpoints.
			if weight = readyLocal(svc, vip.Is6()); weight == 0 {
				continue
			}
		}
		// One route per prefix: advertisements that aggregate differently
		// announce different prefixes, those that do not, one together.
		var prefixes []netip.Prefix
		byPrefix := map[netip.Prefix][]datapath.BGPAdvertisement{}
		for _, adv := range advs {
			p := adv.PrefixOf(vip)
			if _, seen := byPrefix[p]; !seen {
				prefixes = append(prefixes, p)
			}
			byPrefix[p] = append(byPrefix[p], adv)
		}
		for _, p := range prefixes {
			adv := datapath.CombineAdvertisements(byPrefix[p])
			a := Announcement{NextHop: hop, Weight: weight, Communities: adv.Communities, LargeCommunities: adv.LargeCommunities, LocalPref: adv.LocalPref}
			out = append(out, prefixWant{prefix: p, Announcement: a, peers: adv.Peers})
		}
	}
	return out
}

// sameForWants tells whether services ask the same of both nodes: same
// name, addresses, pools and L2 pools.
func sameForWants(a, b datapath.NodeInfo) bool {
	return a.Name == b.Name && slices.Equal(a.Addresses, b.Addresses) &&
		slices.EqualFunc(a.Advertisements, b.Advertisements, datapath.BGPAdvertisement.Equal) &&
		slices.EqualFunc(a.L2Pools, b.L2Pools, datapath.L2Pool.Equal)
}

// wants is what every service asks for, kept per service and summed per
// prefix, so that a changed service costs its own announcements alone.
type wants struct {
	byService map[datapath.ServiceKey][]prefixWant
	prefixes  map[netip.Prefix]*prefixSum
}

// prefixSum is one prefix's announcement, summed over the addresses that
// ask for it (several, for a pool's aggregate).
type prefixSum struct {
	// Announcement and peers are the latest asker's, its weight aside.
	Announcement
	peers  []string
	askers int
	// unweighted counts the askers without a weight (Cluster services):
	// with any, the prefix is unweighted; else it weighs sum
	// (bgpspeaker.AddWeights over the askers).
	unweighted int
	sum        uint32
}

func newWants() wants {
	return wants{byService: map[datapath.ServiceKey][]prefixWant{}, prefixes: map[netip.Prefix]*prefixSum{}}
}

// clear forgets every service, and returns the prefixes they asked for.
func (w *wants) clear() iter.Seq[netip.Prefix] {
	old := w.prefixes
	*w = newWants()
	return maps.Keys(old)
}

// set makes key ask for what svc (nil: gone) asks of node, and returns the
// prefixes whose announcement this may change.
func (w *wants) set(key datapath.ServiceKey, svc *datapath.Service, node datapath.NodeInfo) iter.Seq[netip.Prefix] {
	old := w.byService[key]
	for _, pw := range old {
		ps := w.prefixes[pw.prefix]
		if ps.askers--; ps.askers == 0 {
			delete(w.prefixes, pw.prefix)
			continue
		}
		if pw.Weight == 0 {
			ps.unweighted--
		}
		ps.sum -= pw.Weight
	}
	var now []prefixWant
	if svc != nil {
		now = serviceWants(svc, node)
	}
	for _, pw := range now {
		ps := w.prefixes[pw.prefix]
		if ps == nil {
			ps = &prefixSum{}
			w.prefixes[pw.prefix] = ps
		}
		ps.Announcement, ps.peers = pw.Announcement, pw.peers
		ps.askers++
		if pw.Weight == 0 {
			ps.unweighted++
		}
		ps.sum += pw.Weight
	}
	if len(now) == 0 {
		delete(w.byService, key)
	} else {
		w.byService[key] = now
	}
	return func(yield func(netip.Prefix) bool) {
		for _, pws := range [][]prefixWant{old, now} {
			for _, pw := range pws {
				if !yield(pw.prefix) {
					return
				}
			}
		}
	}
}

// audiences is each wanted prefix inside ranges, with the peers its
// advertisements name.
func (w *wants) audiences(ranges []datapath.AddressRange) map[netip.Prefix][]string {
	out := map[netip.Prefix][]string{}
	for p, ps := range w.prefixes {
		if slices.ContainsFunc(ranges, func(r datapath.AddressRange) bool { return r.Contains(p.Addr()) }) {
			out[p] = ps.peers
		}
	}
	return out
}

// of is what the services ask for p.
func (w *wants) of(p netip.Prefix) (Announcement, bool) {
	ps := w.prefixes[p]
	if ps == nil {
		return Announcement{}, false
	}
	a := ps.Announcement
	a.Weight = ps.sum
	if ps.unweighted > 0 {
		a.Weight = 0
	}
	return a, true
}

// readyLocal counts the service's ready endpoints of one family on this
// node (an endpoint behind several ports counts once).
func readyLocal(svc *datapath.Service, is6 bool) uint32 {
	ready, _, _ := svc.LocalCounts(is6)
	return uint32(ready)
}

func sameSessions(now []bgpspeaker.Session, reported []report.BGPSession) bool {
	return slices.EqualFunc(now, reported, func(s bgpspeaker.Session, r report.BGPSession) bool {
		return s.PeerAddress == r.PeerAddress && s.PeerASN == r.PeerASN && s.State == r.State && s.Since.Equal(r.Since) && s.LastError == r.LastError && s.BFD == r.BFD &&
			slices.EqualFunc(s.Families, r.Families, func(a bgpspeaker.Family, b report.BGPFamily) bool { return report.BGPFamily(a) == b })
	})
}
