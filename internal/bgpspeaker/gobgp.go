// Package bgpspeaker is Weir's BGP speaker, GoBGP as a library: it dials
// the routers (it never listens) and announces host prefixes with a given
// next hop. The node speakers (agent/bgp) and the load-balancer tier
// (lbtier) both announce through it.
package bgpspeaker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/config/oc"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpnumbers"
	"github.com/weirlb/weir/internal/report"
	"github.com/weirlb/weir/internal/routeradv"
)

// Peer is an upstream router.
type Peer struct {
	// Address is the router's; an IPv6 link-local one carries its
	// interface as zone. The zero Addr with Interface is an unnumbered
	// router.
	Address netip.Addr
	// Interface, with no Address, is where an unnumbered router is: the
	// one IPv6 link-local neighbour the kernel knows on it.
	Interface string
	Port      uint16 // 0 means 179
	// ASN is the router's AS; 0 with DynamicASN.
	ASN        uint32
	DynamicASN bgpnumbers.DynamicASN
	// VRF is the device the session is bound to (SO_BINDTODEVICE); "" for
	// none.
	VRF      string
	MyASN    uint32        // 0 means the speaker's own AS
	HoldTime time.Duration // 0 means 90 s
	Password string        // TCP MD5, optional
	// GracefulRestart, when above 0, is the restart time offered to this
	// router; 0 means the speaker's Config.GracefulRestart.
	GracefulRestart time.Duration
	// EBGPMultihopTTL, when above 0, is the TTL of an eBGP session's
	// packets, for a router beyond the node's link; 0 sends them with TTL
	// 1, so that only a directly connected router hears them.
	EBGPMultihopTTL uint8
	// SourceAddress is the local address the session is made from; the
	// zero Addr lets the kernel choose.
	SourceAddress netip.Addr
	// Keepalive is the time between keepalives; 0 means a third of the
	// hold time.
	Keepalive time.Duration
	// ConnectRetry is the time between attempts to open the session while
	// it is down; 0 means bgpnumbers.DefaultConnectRetry.
	ConnectRetry time.Duration
	// BFD, when set, runs a BFD session with the router beside BGP: when
	// it goes down (the router stopped answering within its detection
	// time, or said so) the BGP session is closed at once, where the hold
	// timer would take seconds; it opens again when BFD is back up.
	BFD *bfd.Profile
}

// ParsePeer reads "ADDRESS[:PORT]/ASN" (IPv6 addresses in brackets when a
// port is given).
func ParsePeer(s string) (Peer, error) {
	i := len(s) - 1
	for i >= 0 && s[i] != '/' {
		i--
	}
	if i < 0 {
		return Peer{}, fmt.Errorf("peer %q: want ADDRESS[:PORT]/ASN", s)
	}
	asn, err := strconv.ParseUint(s[i+1:], 10, 32)
	if err != nil || asn == 0 {
		return Peer{}, fmt.Errorf("peer %q: bad ASN", s)
	}
	p := Peer{ASN: uint32(asn)}
	host := s[:i]
	if ap, err := netip.ParseAddrPort(host); err == nil {
		p.Address, p.Port = ap.Addr(), ap.Port()
	} else if a, err := netip.ParseAddr(host); err == nil {
		p.Address = a
	} else {
		return Peer{}, fmt.Errorf("peer %q: bad address", s)
	}
	return p, nil
}

// ParsePeers reads a comma-separated list of ParsePeer's form.
func ParsePeers(list string) ([]Peer, error) {
	var out []Peer
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := ParsePeer(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// RouterID is id, or the host's first IPv4 address that is not loopback.
func RouterID(id string) (netip.Addr, error) {
	if id != "" {
		a, err := netip.ParseAddr(id)
		if err != nil || !a.Is4() {
			return netip.Addr{}, fmt.Errorf("%q is not an IPv4 address", id)
		}
		return a, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no IPv4 address on this host; set one")
}

// Config is a speaker.
type Config struct {
	ASN      uint32
	RouterID netip.Addr
	Peers    []Peer
	// GracefulRestart, when above 0, is the restart time the speaker
	// offers its peers (RFC 4724): a router keeps the speaker's routes
	// that long while the speaker restarts, and the speaker sends its
	// whole table before End-of-RIB when it comes back.
	GracefulRestart time.Duration
	// AddPath sends every path of a prefix, each with its own path
	// identifier (RFC 7911), to routers that agree to receive them;
	// without it a router hears only the best path.
	AddPath bool
	// Restarting says the speaker comes back from a restart with the
	// node's forwarding state kept (the nftables rules stayed): it opens
	// graceful-restart sessions with the Restart State and Forwarding
	// State bits set (RFC 4724), so routers keep forwarding on the routes
	// they hold, and sends its table with End-of-RIB once it has the
	// routers' own End-of-RIB.
	Restarting bool
	// NextHopSelfOnLinks says the routes are the speaker's own (a node
	// speaker's): to a router peered over IPv6 link-local addresses, which
	// reaches nothing of the node but its link, every route's next hop is
	// the speaker's own address on that link (an IPv4 route's then an
	// IPv6 one, RFC 8950). The load-balancer tier, whose next hops are
	// other machines, leaves it unset.
	NextHopSelfOnLinks bool
	Log                *slog.Logger
}

// Announcement is how a prefix is announced.
type Announcement struct {
	NextHop netip.Addr
	// Weight is the next hop's share of the prefix's traffic (ready
	// endpoints behind it); it rides along as the link-bandwidth extended
	// community, which routers turn into weighted ECMP. 0 announces no
	// weight.
	Weight uint32
	// Communities, LargeCommunities and LocalPref come from the address's
	// pool.
	Communities      []uint32
	LargeCommunities []bgpcommunity.Large
	LocalPref        uint32
	// PathID tells apart several paths of one prefix from this speaker
	// (ADD-PATH); 0 when there is one.
	PathID uint32
}

// AddWeights is the weight of one path standing for two announcements of
// weights a and b (an aggregate's addresses): their sum, or 0 (unweighted)
// when either is unweighted.
func AddWeights(a, b uint32) uint32 {
	if a == 0 || b == 0 {
		return 0
	}
	return a + b
}

// Same tells whether a and b announce the same path.
func (a Announcement) Same(b Announcement) bool {
	return a.NextHop == b.NextHop && a.Weight == b.Weight && slices.Equal(a.Communities, b.Communities) &&
		slices.Equal(a.LargeCommunities, b.LargeCommunities) && a.LocalPref == b.LocalPref && a.PathID == b.PathID
}

// Session is the speaker's session with one router.
type Session struct {
	PeerAddress netip.Addr
	PeerASN     uint32
	State       report.BGPState
	Since       time.Time
	// AddPath: the router agreed to receive several paths per prefix.
	AddPath bool
	// BFD is the state of the BFD session beside it; "" without BFD.
	BFD string
	// LastError is the session's last NOTIFICATION, from either side
	// ("the router sent NOTIFICATION code 2(open) subcode 2(bad peer
	// as)"); "" when there was none.
	LastError string
	// Families is the session per address family, IPv4 then IPv6.
	Families []Family
}

// Family is one address family of a session.
type Family struct {
	Name report.Family
	// Negotiated: both sides agreed to carry it in this session.
	Negotiated bool
	// Sent counts the prefixes advertised to the router, Received and
	// Accepted those it sent and this speaker kept.
	Sent, Received, Accepted uint64
}

// BandwidthPerWeight is the link bandwidth (bytes/s) one unit of weight
// announces: only the ratios between nodes matter to the routers.
const BandwidthPerWeight = 1e6

// GoBGP is a running speaker.
type GoBGP struct {
	s     *server.BgpServer
	asn   uint32
	cfg   Config
	notes *notifications
	bfd   *bfd.Manager
	ra    *routeradv.Advertiser

	reopenMu sync.Mutex
	// reopen holds, for each router whose session BFD closed, the timer
	// that opens it again.
	reopen  map[netip.Addr]*time.Timer
	closing bool

	mu      sync.Mutex // guards dynamic and the export fields
	dynamic map[netip.Addr]Peer
	// exportRules are the rules in force once exportAssigned, rendered
	// with exportLinks as the addresses of the unnumbered peers.
	exportRules    []ExportRule
	exportLinks    map[string][]netip.Addr
	exportAssigned bool
}

// ExportRule keeps the routes inside Prefixes (each prefix and every
// longer one inside it) to the routers at Peers and to the unnumbered
// routers on Links (whatever address each has now); none of either means
// none.
type ExportRule struct {
	Prefixes []netip.Prefix
	Peers    []netip.Addr
	Links    []string
	// Exact: the rule keeps Prefixes themselves only, not the longer
	// prefixes inside them.
	Exact bool
}

// covers tells whether the rule keeps prefix.
func (r ExportRule) covers(prefix netip.Prefix) bool {
	return slices.ContainsFunc(r.Prefixes, func(q netip.Prefix) bool {
		if r.Exact {
			return q == prefix
		}
		return q.Bits() <= prefix.Bits() && q.Contains(prefix.Addr())
	})
}

// SameAudience tells whether r and o keep their routes to the same
// routers.
func (r ExportRule) SameAudience(o ExportRule) bool {
	return slices.Equal(r.Peers, o.Peers) && slices.Equal(r.Links, o.Links)
}

// Equal tells whether r and o are the same rule.
func (r ExportRule) Equal(o ExportRule) bool {
	return slices.Equal(r.Prefixes, o.Prefixes) && r.Exact == o.Exact && r.SameAudience(o)
}

// linkAddresses is the address each unnumbered router among peers has
// now, by its interface: what an ExportRule's Links stand for.
func linkAddresses(peers []Peer) map[string][]netip.Addr {
	links := map[string][]netip.Addr{}
	for _, p := range peers {
		if p.Interface != "" && p.Address.IsValid() {
			// A neighbour set matches addresses without their zone.
			links[p.Interface] = append(links[p.Interface], p.Address.WithZone(""))
		}
	}
	for _, addrs := range links {
		slices.SortFunc(addrs, netip.Addr.Compare)
	}
	return links
}

const exportPolicy = "weir-export"

// SetExportRules replaces the rules of the last call. Routes no rule
// covers go to every router. The rules apply to what is announced from now
// on: GoBGP sends no withdrawal for a path its new policy refuses, so a
// caller takes back, before, what the change moves, and announces it again
// after.
func (g *GoBGP) SetExportRules(ctx context.Context, rules []ExportRule) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	links := linkAddresses(slices.Collect(maps.Values(g.dynamic)))
	if g.exportAssigned && slices.EqualFunc(rules, g.exportRules, ExportRule.Equal) && maps.EqualFunc(links, g.exportLinks, slices.Equal) {
		return nil
	}
	return g.setExport(ctx, rules, links)
}

// setExport sets the export policy of rules, with links as the addresses
// of their unnumbered routers; g.mu is held.
func (g *GoBGP) setExport(ctx context.Context, rules []ExportRule, links map[string][]netip.Addr) error {
	req := &api.SetPoliciesRequest{}
	policy := &api.Policy{Name: exportPolicy}
	if g.cfg.NextHopSelfOnLinks {
		// Evaluation goes on past a statement that only changes the route.
		const links = "weir-link-local-peers"
		req.DefinedSets = append(req.DefinedSets, &api.DefinedSet{DefinedType: api.DefinedType_NEIGHBOR, Name: links, List: []string{"fe80::/10"}})
		policy.Statements = append(policy.Statements, &api.Statement{Name: "weir-next-hop-self-on-links",
			Conditions: &api.Conditions{NeighborSet: &api.MatchSet{Name: links, Type: api.MatchSet_ANY}},
			Actions:    &api.Actions{RouteAction: api.RouteAction_NONE, Nexthop: &api.NexthopAction{Self: true}}})
	}
	for i, r := range rules {
		neighbors := fmt.Sprintf("weir-rule-%d-peers", i)
		named := len(r.Peers) > 0 || len(r.Links) > 0
		if named {
			set := &api.DefinedSet{DefinedType: api.DefinedType_NEIGHBOR, Name: neighbors}
			addrs := slices.Clone(r.Peers)
			for _, l := range r.Links {
				addrs = append(addrs, links[l]...)
			}
			for _, a := range addrs {
				set.List = append(set.List, netip.PrefixFrom(a.WithZone(""), a.BitLen()).String())
			}
			if len(set.List) == 0 {
				// Only unnumbered routers not found yet: no router has
				// the unspecified address (GoBGP takes an empty set as
				// matching every router).
				set.List = []string{"::/128"}
			}
			req.DefinedSets = append(req.DefinedSets, set)
		}
		// A prefix set holds one family.
		for _, family := range []string{"ipv4", "ipv6"} {
			set := &api.DefinedSet{DefinedType: api.DefinedType_PREFIX, Name: fmt.Sprintf("weir-rule-%d-%s", i, family)}
			for _, p := range r.Prefixes {
				if p.Addr().Is4() == (family == "ipv4") {
					longest := p.Addr().BitLen()
					if r.Exact {
						longest = p.Bits()
					}
					set.Prefixes = append(set.Prefixes, &api.Prefix{IpPrefix: p.Masked().String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: uint32(longest)})
				}
			}
			if len(set.Prefixes) == 0 {
				continue
			}
			req.DefinedSets = append(req.DefinedSets, set)
			st := &api.Statement{Name: set.Name,
				Conditions: &api.Conditions{PrefixSet: &api.MatchSet{Name: set.Name, Type: api.MatchSet_ANY}},
				Actions:    &api.Actions{RouteAction: api.RouteAction_REJECT}}
			if named {
				// Rejected for every router but these.
				st.Conditions.NeighborSet = &api.MatchSet{Name: neighbors, Type: api.MatchSet_INVERT}
			}
			policy.Statements = append(policy.Statements, st)
		}
	}
	req.Policies = []*api.Policy{policy}
	if err := g.s.SetPolicies(ctx, req); err != nil {
		return fmt.Errorf("setting the export policy: %w", err)
	}
	if !g.exportAssigned {
		if err := g.s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
			Name: "global", Direction: api.PolicyDirection_EXPORT, Policies: []*api.Policy{{Name: exportPolicy}},
			DefaultAction: api.RouteAction_ACCEPT}}); err != nil {
			return fmt.Errorf("assigning the export policy: %w", err)
		}
	}
	g.exportRules, g.exportLinks, g.exportAssigned = slices.Clone(rules), links, true
	return nil
}

// Audience is who hears prefix under rules: the routers of the first rule
// that covers it, or, when none does, every router (all).
func Audience(rules []ExportRule, prefix netip.Prefix) (r ExportRule, all bool) {
	for _, r := range rules {
		if r.covers(prefix) {
			return r, false
		}
	}
	return ExportRule{}, true
}

// Start starts a speaker and adds its peers.
func Start(ctx context.Context, cfg Config) (*GoBGP, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	notes := &notifications{last: map[netip.Addr]string{}}
	s := server.NewBgpServer(server.LoggerOption(&logger{cfg.Log, notes}))
	go s.Serve()
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: cfg.ASN, RouterId: cfg.RouterID.String(), ListenPort: -1,
	}}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	g := &GoBGP{s: s, asn: cfg.ASN, cfg: cfg, dynamic: map[netip.Addr]Peer{}, notes: notes, reopen: map[netip.Addr]*time.Timer{}}
	g.bfd = bfd.New(cfg.Log.With("component", "bfd"), g.bfdChanged)
	g.ra = routeradv.New(cfg.Log.With("component", "router-advertisements"))
	g.advertiseOnLinks(nil)
	for _, p := range cfg.Peers {
		p, err := resolve(p)
		if err == nil {
			err = g.addPeer(ctx, p)
		}
		if err != nil {
			g.bfd.Close()
			g.ra.Close()
			s.Stop()
			return nil, err
		}
	}
	if err := g.setBFD(); err != nil {
		cfg.Log.Warn("BFD sessions not all set up", "err", err)
	}
	if cfg.NextHopSelfOnLinks {
		// In force before any route is announced, rules or not.
		if err := g.SetExportRules(ctx, nil); err != nil {
			g.bfd.Close()
			g.ra.Close()
			s.Stop()
			return nil, err
		}
	}
	return g, nil
}

// setBFD runs a BFD session with each peer that asks for one; g.mu is
// held or g not yet shared.
func (g *GoBGP) setBFD() error {
	var sessions []bfd.Session
	for _, p := range slices.Concat(g.cfg.Peers, slices.Collect(maps.Values(g.dynamic))) {
		if p.BFD == nil || !p.Address.IsValid() {
			// Without BFD, or an unnumbered router not found yet.
			continue
		}
		sessions = append(sessions, bfd.Session{Peer: p.Address, Local: p.SourceAddress, MultiHop: p.EBGPMultihopTTL > 1, Profile: *p.BFD})
	}
	return g.bfd.Set(sessions)
}

// bfdChanged closes a router's BGP session when its BFD session goes
// down, so that both ends drop its routes at once. The session opens
// again when BFD is back up, or after minReopen (longer while BFD flaps:
// its damping hold-down) whatever BFD says: many routers run BFD only
// for a neighbour whose BGP session is up (FRR and BIRD do for the
// dynamic neighbours of a listen range), so waiting for BFD first could
// wait for ever. A path still dead then fails BGP's own connect.
func (g *GoBGP) bfdChanged(peer netip.Addr, usable bool) {
	g.reopenMu.Lock()
	defer g.reopenMu.Unlock()
	if g.closing {
		return
	}
	if t := g.reopen[peer]; t != nil {
		t.Stop()
		delete(g.reopen, peer)
	}
	if usable {
		g.enable(peer)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.s.DisablePeer(ctx, &api.DisablePeerRequest{Address: peer.String(), Communication: "BFD session down"}); err != nil {
		// The peer was removed meanwhile: nothing to close or open.
		g.cfg.Log.Debug("BFD down not applied to BGP", "peer", peer, "err", err)
		return
	}
	wait := minReopen
	for _, s := range g.bfd.Status() {
		if s.Peer == peer {
			wait = max(wait, s.HoldDown)
		}
	}
	g.cfg.Log.Info("BFD session down: BGP session closed", "peer", peer, "reopen_in", wait)
	g.reopen[peer] = time.AfterFunc(wait, func() {
		g.reopenMu.Lock()
		defer g.reopenMu.Unlock()
		if g.reopen[peer] != nil && !g.closing {
			delete(g.reopen, peer)
			g.enable(peer)
		}
	})
}

// minReopen is the least time a session BFD closed stays closed.
const minReopen = time.Second

// enable opens a session BFD closed; g.reopenMu is held.
func (g *GoBGP) enable(peer netip.Addr) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.s.EnablePeer(ctx, &api.EnablePeerRequest{Address: peer.String()}); err != nil {
		// Not closed (BFD came up without having gone down), or removed.
		g.cfg.Log.Debug("BGP session not reopened", "peer", peer, "err", err)
		return
	}
	g.cfg.Log.Info("BGP session reopened after BFD", "peer", peer)
}

// BFD is the speaker's BFD sessions.
func (g *GoBGP) BFD() []bfd.Status { return g.bfd.Status() }

var families = []*api.Family{
	{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST},
	{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST},
}

// resolve finds an unnumbered router: the one IPv6 link-local neighbour
// on its interface, as GoBGP's own unnumbered peers do (which a router's
// advertisements, or any neighbour discovery, put in the kernel's table).
// Until there is one the peer cannot be dialled: the caller tries again.
func resolve(p Peer) (Peer, error) {
	if p.Address.IsValid() || p.Interface == "" {
		return p, nil
	}
	s, err := oc.GetIPv6LinkLocalNeighborAddress(p.Interface)
	if err != nil {
		return p, fmt.Errorf("unnumbered peer on %q: no IPv6 link-local neighbour to dial yet: %w", p.Interface, err)
	}
	if p.Address, err = netip.ParseAddr(s); err != nil {
		return p, fmt.Errorf("unnumbered peer on %q: %w", p.Interface, err)
	}
	return p, nil
}

func (g *GoBGP) addPeer(ctx context.Context, p Peer) error {
	if err := g.s.AddPeer(ctx, &api.AddPeerRequest{Peer: g.peerConfig(p)}); err != nil {
		return fmt.Errorf("adding peer %s: %w", p.Address, err)
	}
	return nil
}

// peerConfig is GoBGP's form of p.
func (g *GoBGP) peerConfig(p Peer) *api.Peer {
	hold := uint64(cmp.Or(p.HoldTime, bgpnumbers.DefaultHoldTime) / time.Second)
	keepalive := max(1, hold/3)
	if p.Keepalive > 0 {
		keepalive = uint64(p.Keepalive / time.Second)
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: bgpnumbers.RemoteAS(p.ASN, p.DynamicASN, cmp.Or(p.MyASN, g.asn)),
			LocalAsn: p.MyASN, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{HoldTime: hold, KeepaliveInterval: keepalive,
			ConnectRetry: uint64(cmp.Or(p.ConnectRetry, bgpnumbers.DefaultConnectRetry) / time.Second)}},
		Transport: &api.Transport{RemotePort: uint32(p.Port), BindInterface: p.VRF},
	}
	if p.EBGPMultihopTTL > 0 {
		peer.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.EBGPMultihopTTL)}
	}
	switch {
	case p.SourceAddress.IsValid():
		peer.Transport.LocalAddress = p.SourceAddress.String()
	case p.Address.Zone() != "":
		// GoBGP would take the interface's link-local address, zone and
		// all, which it then cannot parse as the session's own address:
		// next hop self would have none. Unspecified, it reads the
		// address from the connection.
		peer.Transport.LocalAddress = "::"
	}
	restart := cmp.Or(p.GracefulRestart, g.cfg.GracefulRestart)
	gr := restart > 0
	if gr {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(restart / time.Second),
			LocalRestarting: g.cfg.Restarting}
	}
	for _, f := range families {
		af := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f, Enabled: true}}
		if gr {
			af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
		if g.cfg.AddPath {
			af.AddPaths = &api.AddPaths{Config: &api.AddPathsConfig{SendMax: 255}}
		}
		peer.AfiSafis = append(peer.AfiSafis, af)
	}
	return peer
}

// advertiseOnLinks sends router advertisements on the links of the
// link-local and unnumbered peers (the static ones and peers), so that
// routers running unnumbered BGP there learn the speaker's address.
func (g *GoBGP) advertiseOnLinks(peers []Peer) {
	var links []string
	for _, p := range slices.Concat(g.cfg.Peers, peers) {
		if p.Interface != "" {
			links = append(links, p.Interface)
		} else if p.Address.Zone() != "" {
			links = append(links, p.Address.Zone())
		}
	}
	g.ra.Set(links)
}

// SetPeers replaces the peers set by the last call. It goes on past a
// failing peer and returns the first error.
func (g *GoBGP) SetPeers(ctx context.Context, peers []Peer) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	want := make(map[netip.Addr]Peer, len(peers))
	var first error
	g.advertiseOnLinks(peers)
	for _, p := range peers {
		p, err := resolve(p)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		want[p.Address] = p
	}
	if links := linkAddresses(slices.Collect(maps.Values(want))); g.exportAssigned && !maps.EqualFunc(links, g.exportLinks, slices.Equal) {
		// An unnumbered router found, or found at a new address, hears
		// what its rules give it from its first UPDATE: the policy
		// names it before it is added.
		if err := g.setExport(ctx, g.exportRules, links); err != nil {
			first = cmp.Or(first, err)
		}
	}
	// BFD is not GoBGP's: a change of it alone leaves the BGP session be.
	bgpOnly := func(p Peer) Peer { p.BFD = nil; return p }
	for addr, had := range g.dynamic {
		p, ok := want[addr]
		switch {
		case ok && bgpOnly(p) == bgpOnly(had):
			g.dynamic[addr] = p
			continue
		case ok && p.Port == had.Port && p.EBGPMultihopTTL == had.EBGPMultihopTTL && p.ConnectRetry == had.ConnectRetry:
			// A changed router is updated in place, without closing the
			// session: a password takes effect at once, and a hold time
			// or keepalive at the session's next OPEN, which agrees on
			// them (as routers apply their own timers); GoBGP re-opens it
			// at once only for what the OPEN must say again (AS,
			// graceful restart, source address). A TTL or connect-retry change is not updated in
			// place: GoBGP's dialer reads them once when the peer is
			// added, so a session that is not up would keep dialling
			// with the old ones.
			if _, err := g.s.UpdatePeer(ctx, &api.UpdatePeerRequest{Peer: g.peerConfig(p)}); err != nil {
				first = cmp.Or(first, fmt.Errorf("updating peer %s: %w", addr, err))
				continue
			}
			if p.ASN != had.ASN || p.MyASN != had.MyASN || p.Password != had.Password {
				// What a router refused was the old configuration: its
				// error no longer says anything of the new one.
				g.notes.forget(addr)
			}
			g.dynamic[addr] = p
			continue
		}
		if err := g.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
			first = cmp.Or(first, fmt.Errorf("removing peer %s: %w", addr, err))
			continue
		}
		g.notes.forget(addr)
		delete(g.dynamic, addr)
	}
	for addr, p := range want {
		if _, ok := g.dynamic[addr]; ok {
			continue
		}
		if err := g.addPeer(ctx, p); err != nil {
			first = cmp.Or(first, err)
			continue
		}
		g.dynamic[addr] = p
	}
	// Only the sessions of the restart itself say Restart State; routers
	// added later meet a speaker that has long restarted.
	g.cfg.Restarting = false
	if err := g.setBFD(); err != nil {
		first = cmp.Or(first, err)
	}
	return first
}

func (g *GoBGP) path(prefix netip.Prefix, a Announcement) (*api.Path, error) {
	nextHop, weight := a.NextHop, a.Weight
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: prefix.Addr().String(), PrefixLen: uint32(prefix.Bits())})
	if err != nil {
		return nil, err
	}
	origin, _ := anypb.New(&api.OriginAttribute{Origin: 0})
	fam := &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	var hop *anypb.Any
	if prefix.Addr().Is4() {
		hop, err = anypb.New(&api.NextHopAttribute{NextHop: nextHop.String()})
	} else {
		fam = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
		hop, err = anypb.New(&api.MpReachNLRIAttribute{Family: fam, NextHops: []string{nextHop.String()}, Nlris: []*anypb.Any{nlri}})
	}
	if err != nil {
		return nil, err
	}
	attrs := []*anypb.Any{origin, hop}
	if len(a.Communities) > 0 {
		c, err := anypb.New(&api.CommunitiesAttribute{Communities: a.Communities})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, c)
	}
	if len(a.LargeCommunities) > 0 {
		var large []*api.LargeCommunity
		for _, c := range a.LargeCommunities {
			large = append(large, &api.LargeCommunity{GlobalAdmin: c.Global, LocalData1: c.Local1, LocalData2: c.Local2})
		}
		lc, err := anypb.New(&api.LargeCommunitiesAttribute{Communities: large})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, lc)
	}
	if a.LocalPref > 0 {
		lp, err := anypb.New(&api.LocalPrefAttribute{LocalPref: a.LocalPref})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, lp)
	}
	if weight > 0 {
		lb, err := anypb.New(&api.LinkBandwidthExtended{Asn: g.asn, Bandwidth: float32(weight) * BandwidthPerWeight})
		if err != nil {
			return nil, err
		}
		ext, err := anypb.New(&api.ExtendedCommunitiesAttribute{Communities: []*anypb.Any{lb}})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, ext)
	}
	return &api.Path{Family: fam, Nlri: nlri, Pattrs: attrs, Identifier: a.PathID}, nil
}

// Announce advertises prefix to every peer, replacing an earlier
// announcement of it with the same path identifier.
func (g *GoBGP) Announce(ctx context.Context, prefix netip.Prefix, a Announcement) error {
	p, err := g.path(prefix, a)
	if err != nil {
		return err
	}
	_, err = g.s.AddPath(ctx, &api.AddPathRequest{Path: p})
	return err
}

// Withdraw takes back the path a announced (its next hop and path
// identifier tell which).
func (g *GoBGP) Withdraw(ctx context.Context, prefix netip.Prefix, a Announcement) error {
	p, err := g.path(prefix, Announcement{NextHop: a.NextHop, PathID: a.PathID})
	if err != nil {
		return err
	}
	return g.s.DeletePath(ctx, &api.DeletePathRequest{Path: p})
}

// Sessions lists every peer's session, by address.
func (g *GoBGP) Sessions(ctx context.Context) ([]Session, error) {
	var out []Session
	bfdStates := map[netip.Addr]string{}
	for _, s := range g.bfd.Status() {
		bfdStates[s.Peer] = s.State.String()
	}
	err := g.s.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		addr, err := netip.ParseAddr(p.GetState().GetNeighborAddress())
		if err != nil {
			return
		}
		st := Session{PeerAddress: addr, PeerASN: p.GetState().GetPeerAsn(),
			State: report.BGPState(strings.ToLower(p.GetState().GetSessionState().String())), LastError: g.notes.get(addr), BFD: bfdStates[addr]}
		st.AddPath = g.cfg.AddPath && st.State == report.BGPEstablished && receivesAddPath(p.GetState().GetRemoteCap())
		if st.State == report.BGPEstablished && p.GetTimers().GetState().GetUptime() != nil {
			st.Since = p.GetTimers().GetState().GetUptime().AsTime()
		}
		remote := remoteFamilies(p.GetState().GetRemoteCap())
		for _, af := range p.GetAfiSafis() {
			fs := af.GetState()
			name := report.IPv4
			if fs.GetFamily().GetAfi() == api.Family_AFI_IP6 {
				name = report.IPv6
			}
			// Enabled is only this side's configuration: the family is
			// carried when the router offered it too.
			negotiated := st.State == report.BGPEstablished && fs.GetEnabled() && remote[fs.GetFamily().GetAfi()]
			st.Families = append(st.Families, Family{Name: name, Negotiated: negotiated,
				Sent: fs.GetAdvertised(), Received: fs.GetReceived(), Accepted: fs.GetAccepted()})
		}
		slices.SortFunc(st.Families, func(a, b Family) int { return strings.Compare(string(a.Name), string(b.Name)) })
		out = append(out, st)
	})
	slices.SortFunc(out, func(a, b Session) int { return a.PeerAddress.Compare(b.PeerAddress) })
	return out, err
}

// remoteFamilies are the unicast families the router's OPEN offered. A
// router that sends no multiprotocol capability speaks IPv4 unicast only
// (RFC 4760).
func remoteFamilies(caps []*anypb.Any) map[api.Family_Afi]bool {
	out := map[api.Family_Afi]bool{}
	multiprotocol := false
	for _, c := range caps {
		var mp api.MultiProtocolCapability
		if c.UnmarshalTo(&mp) != nil {
			continue
		}
		multiprotocol = true
		if f := mp.GetFamily(); f.GetSafi() == api.Family_SAFI_UNICAST {
			out[f.GetAfi()] = true
		}
	}
	if !multiprotocol {
		out[api.Family_AFI_IP] = true
	}
	return out
}

// receivesAddPath: the router's capabilities say it receives several
// paths per prefix for some family.
func receivesAddPath(caps []*anypb.Any) bool {
	for _, c := range caps {
		var ap api.AddPathCapability
		if c.UnmarshalTo(&ap) != nil {
			continue
		}
		for _, t := range ap.GetTuples() {
			if m := t.GetMode(); m == api.AddPathCapabilityTuple_RECEIVE || m == api.AddPathCapabilityTuple_BOTH {
				return true
			}
		}
	}
	return false
}

// Close ends every session with a Cease NOTIFICATION: routers drop the
// speaker's routes at once, graceful restart or not.
func (g *GoBGP) Close() {
	// BFD first, while GoBGP still takes requests: what BFD reports
	// from here on changes nothing.
	g.reopenMu.Lock()
	g.closing = true
	for _, t := range g.reopen {
		t.Stop()
	}
	g.reopenMu.Unlock()
	g.bfd.Close() // AdminDown to every router
	g.ra.Close()
	g.s.StopBgp(context.Background(), &api.StopBgpRequest{})
	g.s.Stop()
}

// GracefulRestart reports whether any of the speaker's peers is offered
// graceful restart: a process that stops for a restart should then exit
// without Close, so that its sessions end without a NOTIFICATION (the
// TCP connections close with the process) and the routers keep its routes
// for the restart time (RFC 4724; a Cease would make them flush at once).
func (g *GoBGP) GracefulRestart() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cfg.GracefulRestart > 0 {
		return true
	}
	for _, p := range g.cfg.Peers {
		if p.GracefulRestart > 0 {
			return true
		}
	}
	for _, p := range g.dynamic {
		if p.GracefulRestart > 0 {
			return true
		}
	}
	return false
}

// logger sends GoBGP's log to slog, and keeps the last NOTIFICATION of
// each session: GoBGP's API does not say why a session went down, its log
// does.
type logger struct {
	l     *slog.Logger
	notes *notifications
}

// notifications is the last NOTIFICATION sent or received per router.
type notifications struct {
	mu   sync.Mutex
	last map[netip.Addr]string
}

func (n *notifications) get(addr netip.Addr) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last[addr]
}

// forget drops a router's last NOTIFICATION.
func (n *notifications) forget(addr netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.last, addr)
}

// note records a NOTIFICATION GoBGP logged ("received notification" or
// "sent notification", with the peer's address and the code and subcode).
func (n *notifications) note(msg string, f gobgplog.Fields) {
	who := map[string]string{"received notification": "the router sent", "sent notification": "this speaker sent"}[msg]
	key, _ := f["Key"].(string)
	addr, err := netip.ParseAddr(key)
	code, okCode := f["Code"].(uint8)
	subcode, okSub := f["Subcode"].(uint8)
	detail, _ := f["Communicated-Reason"].(string)
	if e, ok := f["Data"].(*bgp.MessageError); ok {
		// A NOTIFICATION GoBGP sends for an error it found: the error
		// carries the codes and says what it was.
		code, subcode, okCode, okSub, detail = e.TypeCode, e.SubTypeCode, true, true, e.Message
	}
	if who == "" || err != nil || !okCode || !okSub {
		return
	}
	text := fmt.Sprintf("%s NOTIFICATION %s", who, bgp.NewNotificationErrorCode(code, subcode))
	if detail != "" {
		text += ": " + detail
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last[addr] = text
}

func (g *logger) attrs(f gobgplog.Fields) []any {
	out := make([]any, 0, 2*len(f))
	for k, v := range f {
		out = append(out, k, v)
	}
	return out
}
func (g *logger) Panic(msg string, f gobgplog.Fields) { g.l.Error(msg, g.attrs(f)...) }
func (g *logger) Fatal(msg string, f gobgplog.Fields) { g.l.Error(msg, g.attrs(f)...) }
func (g *logger) Error(msg string, f gobgplog.Fields) { g.l.Error(msg, g.attrs(f)...) }
func (g *logger) Warn(msg string, f gobgplog.Fields) {
	g.notes.note(msg, f)
	g.l.Warn(msg, g.attrs(f)...)
}
func (g *logger) Info(msg string, f gobgplog.Fields)  { g.l.Debug(msg, g.attrs(f)...) }
func (g *logger) Debug(msg string, f gobgplog.Fields) {}
func (g *logger) SetLevel(gobgplog.LogLevel)          {}
func (g *logger) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }
