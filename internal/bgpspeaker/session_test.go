package bgpspeaker

import (
	"context"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
)

// TestPeersOpenSessionsAsConfigured: GoBGP holds each router's eBGP
// multi-hop TTL, source address and timers as the peer sets them, the
// defaults where it sets none, and a change made in place.
func TestPeersOpenSessionsAsConfigured(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := Start(ctx, Config{ASN: 4200000001, RouterID: netip.MustParseAddr("192.0.2.100")})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
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
