// Package bgp announces this node's service VIPs to the upstream routers
// (MetalLB's "node speaker" placement): a VIP is announced with the node as
// next hop while the node should receive the VIP's traffic, and withdrawn
// the moment it should not.
package bgp

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weirlb/weir/agent/health"
)

// Peer is an upstream router.
type Peer struct {
	Address  netip.Addr
	Port     uint16 // 0 means 179
	ASN      uint32
	MyASN    uint32        // 0 means the speaker's own AS
	HoldTime time.Duration // 0 means 90 s
	Password string        // TCP MD5, optional
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

// Config is this node's BGP speaker.
type Config struct {
	ASN      uint32
	RouterID netip.Addr
	Peers    []Peer
	Log      *slog.Logger
}

// Speaker is the seam to a BGP implementation: announce or withdraw a
// prefix with a next hop.
type Speaker interface {
	// Announce advertises prefix via nextHop; a weight above 0 rides
	// along as the link-bandwidth extended community, which routers turn
	// into weighted ECMP.
	Announce(ctx context.Context, prefix netip.Prefix, a Announcement) error
	Withdraw(ctx context.Context, prefix netip.Prefix, nextHop netip.Addr) error
	// SetPeers makes peers the speaker's peers besides its configured
	// ones: new peers are dialled, changed ones re-dialled, missing ones
	// dropped.
	SetPeers(ctx context.Context, peers []Peer) error
	// Sessions lists every peer's session, by address.
	Sessions(ctx context.Context) ([]health.BGPSession, error)
	Close()
}

// BandwidthPerWeight is the link bandwidth (bytes/s) one unit of weight
// announces: only the ratios between nodes matter to the routers.
const BandwidthPerWeight = 1e6

// GoBGP is the real Speaker, GoBGP as a library. It never listens: it
// dials its peers.
type GoBGP struct {
	s   *server.BgpServer
	asn uint32

	mu      sync.Mutex // guards dynamic
	dynamic map[netip.Addr]Peer
}

// Start starts a speaker and adds its peers.
func Start(ctx context.Context, cfg Config) (*GoBGP, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := server.NewBgpServer(server.LoggerOption(&logger{cfg.Log}))
	go s.Serve()
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: cfg.ASN, RouterId: cfg.RouterID.String(), ListenPort: -1,
	}}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	for _, p := range cfg.Peers {
		if err := addPeer(ctx, s, p); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return &GoBGP{s: s, asn: cfg.ASN, dynamic: map[netip.Addr]Peer{}}, nil
}

func addPeer(ctx context.Context, s *server.BgpServer, p Peer) error {
	hold := uint64(90)
	if p.HoldTime > 0 {
		hold = uint64(p.HoldTime / time.Second)
	}
	peer := &api.Peer{
		Conf:   &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, LocalAsn: p.MyASN, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{HoldTime: hold, KeepaliveInterval: max(1, hold/3), ConnectRetry: 1}},
		AfiSafis: []*api.AfiSafi{
			{Config: &api.AfiSafiConfig{Family: &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}, Enabled: true}},
			{Config: &api.AfiSafiConfig{Family: &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}, Enabled: true}},
		},
	}
	if p.Port != 0 {
		peer.Transport = &api.Transport{RemotePort: uint32(p.Port)}
	}
	if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
		return fmt.Errorf("adding peer %s: %w", p.Address, err)
	}
	return nil
}

// SetPeers replaces the peers set by the last call. It goes on past a
// failing peer and returns the first error.
func (g *GoBGP) SetPeers(ctx context.Context, peers []Peer) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	want := make(map[netip.Addr]Peer, len(peers))
	for _, p := range peers {
		want[p.Address] = p
	}
	var first error
	for addr, had := range g.dynamic {
		if p, ok := want[addr]; ok && p == had {
			continue
		}
		if err := g.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
			first = cmp.Or(first, fmt.Errorf("removing peer %s: %w", addr, err))
			continue
		}
		delete(g.dynamic, addr)
	}
	for addr, p := range want {
		if _, ok := g.dynamic[addr]; ok {
			continue
		}
		if err := addPeer(ctx, g.s, p); err != nil {
			first = cmp.Or(first, err)
			continue
		}
		g.dynamic[addr] = p
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
	return &api.Path{Family: fam, Nlri: nlri, Pattrs: attrs}, nil
}

// Announce advertises prefix with nextHop to every peer, replacing an
// earlier announcement of it.
func (g *GoBGP) Announce(ctx context.Context, prefix netip.Prefix, a Announcement) error {
	p, err := g.path(prefix, a)
	if err != nil {
		return err
	}
	_, err = g.s.AddPath(ctx, &api.AddPathRequest{Path: p})
	return err
}

// Withdraw takes prefix back.
func (g *GoBGP) Withdraw(ctx context.Context, prefix netip.Prefix, nextHop netip.Addr) error {
	p, err := g.path(prefix, Announcement{NextHop: nextHop})
	if err != nil {
		return err
	}
	return g.s.DeletePath(ctx, &api.DeletePathRequest{Path: p})
}

// Sessions lists every peer's session, by address.
func (g *GoBGP) Sessions(ctx context.Context) ([]health.BGPSession, error) {
	var out []health.BGPSession
	err := g.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		addr, err := netip.ParseAddr(p.GetState().GetNeighborAddress())
		if err != nil {
			return
		}
		st := health.BGPSession{PeerAddress: addr, PeerASN: p.GetState().GetPeerAsn(),
			State: strings.ToLower(p.GetState().GetSessionState().String())}
		if st.State == "established" && p.GetTimers().GetState().GetUptime() != nil {
			st.Since = p.GetTimers().GetState().GetUptime().AsTime()
		}
		out = append(out, st)
	})
	slices.SortFunc(out, func(a, b health.BGPSession) int { return a.PeerAddress.Compare(b.PeerAddress) })
	return out, err
}

// Close ends every session (the routers drop the node's routes at once).
func (g *GoBGP) Close() {
	g.s.StopBgp(context.Background(), &api.StopBgpRequest{})
	g.s.Stop()
}

// logger sends GoBGP's log to slog.
type logger struct{ l *slog.Logger }

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
func (g *logger) Warn(msg string, f gobgplog.Fields)  { g.l.Warn(msg, g.attrs(f)...) }
func (g *logger) Info(msg string, f gobgplog.Fields)  { g.l.Debug(msg, g.attrs(f)...) }
func (g *logger) Debug(msg string, f gobgplog.Fields) {}
func (g *logger) SetLevel(gobgplog.LogLevel)          {}
func (g *logger) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }
