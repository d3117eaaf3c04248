package bgpspeaker

import (
	"context"
	"maps"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"

	"github.com/weirlb/weir/internal/bfd"
)

// TestPeersOpenSessionsAsConfigured: GoBGP holds each router's eBGP
// multi-hop TTL, source address and timers as the peer sets them, the
// defaults where it sets none, and a change made in place.
func TestPeersOpenSessionsAsConfigured(t *testing.T) {
	ctx, g := startSpeaker(t, 4200000001)
	reflector := Peer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 4200000100, HoldTime: 30 * time.Second,
		EBGPMultihopTTL: 2, SourceAddress: netip.MustParseAddr("198.51.100.7"), Keepalive: 7 * time.Second, ConnectRetry: 5 * time.Second}
	tor := Peer{Address: netip.MustParseAddr("2001:db8::1"), ASN: 64500}
	type session struct {
		multihop     bool
		ttl          uint32
		source       string
		hold, alive  uint64
		connectRetry uint64
	}
	check := func(when string, want map[netip.Addr]session) {
		t.Helper()
		got := map[netip.Addr]session{}
		if err := g.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
			s := session{source: p.GetTransport().GetLocalAddress(), hold: p.GetTimers().GetConfig().GetHoldTime(),
				alive: p.GetTimers().GetConfig().GetKeepaliveInterval(), connectRetry: p.GetTimers().GetConfig().GetConnectRetry()}
			if m := p.GetEbgpMultihop(); m != nil {
				s.multihop, s.ttl = m.GetEnabled(), m.GetMultihopTtl()
			}
			got[netip.MustParseAddr(p.GetConf().GetNeighborAddress())] = s
		}); err != nil {
			t.Fatal(err)
		}
		for addr, w := range want {
			if got[addr] != w {
				t.Errorf("%s: GoBGP holds %s as %+v; want %+v", when, addr, got[addr], w)
			}
		}
	}
	if err := g.SetPeers(ctx, []Peer{reflector, tor}); err != nil {
		t.Fatal(err)
	}
	check("set", map[netip.Addr]session{
		reflector.Address: {multihop: true, ttl: 2, source: "198.51.100.7", hold: 30, alive: 7, connectRetry: 5},
		// The defaults: directly connected, the kernel's source, a third
		// of 90 s, a second between attempts.
		tor.Address: {source: "::", hold: 90, alive: 30, connectRetry: 1},
	})

	reflector.SourceAddress, reflector.EBGPMultihopTTL, reflector.Keepalive = netip.MustParseAddr("198.51.100.8"), 3, 0
	if err := g.SetPeers(ctx, []Peer{reflector, tor}); err != nil {
		t.Fatal(err)
	}
	check("changed", map[netip.Addr]session{
		// No keepalive: a third of the hold time.
		reflector.Address: {multihop: true, ttl: 3, source: "198.51.100.8", hold: 30, alive: 10, connectRetry: 5},
	})
}

// TestBFDRunsBesideTheSessions: a peer with a BFD profile gets a BFD
// session (multi-hop when its TTL is above 1), follows a change of the
// profile, and ends when the peer drops BFD; a peer without BFD has none.
func TestBFDRunsBesideTheSessions(t *testing.T) {
	ctx, g := startSpeaker(t, 64512)
	tor := Peer{Address: netip.MustParseAddr("127.0.0.1"), ASN: 64500, BFD: &bfd.Profile{ReceiveInterval: 100 * time.Millisecond}}
	reflector := Peer{Address: netip.MustParseAddr("::1"), ASN: 64500, EBGPMultihopTTL: 2, BFD: &bfd.Profile{}}
	plain := Peer{Address: netip.MustParseAddr("127.0.0.2"), ASN: 64500}
	if err := g.SetPeers(ctx, []Peer{tor, reflector, plain}); err != nil {
		t.Fatal(err)
	}
	sessions := func() map[netip.Addr]bool {
		out := map[netip.Addr]bool{}
		for _, s := range g.BFD() {
			out[s.Peer] = s.MultiHop
		}
		return out
	}
	if got, want := sessions(), map[netip.Addr]bool{tor.Address: false, reflector.Address: true}; !maps.Equal(got, want) {
		t.Errorf("BFD sessions (peer: multi-hop) %v; want %v", got, want)
	}
	tor.BFD = &bfd.Profile{ReceiveInterval: 50 * time.Millisecond}
	reflector.BFD = nil
	if err := g.SetPeers(ctx, []Peer{tor, reflector, plain}); err != nil {
		t.Fatal(err)
	}
	if got, want := sessions(), map[netip.Addr]bool{tor.Address: false}; !maps.Equal(got, want) {
		t.Errorf("after the change, BFD sessions %v; want %v", got, want)
	}
}

// startSpeaker starts a speaker of AS asn with no peers, closed when the
// test ends, and a context of 10 s for the test's calls.
func startSpeaker(t *testing.T, asn uint32) (context.Context, *GoBGP) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	g, err := Start(ctx, Config{ASN: asn, RouterID: netip.MustParseAddr("192.0.2.100")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return ctx, g
}
