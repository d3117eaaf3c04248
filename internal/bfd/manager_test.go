package bfd

import (
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
)

type change struct {
	peer   netip.Addr
	usable bool
	at     time.Time
}

// loopbackPair is two managers on 127.0.0.1 sending to each other's
// ports, which one network namespace needs.
func loopbackPair(t *testing.T) (a, b *Manager, ca, cb chan change) {
	ca, cb = make(chan change, 16), make(chan change, 16)
	a = New(slog.Default(), func(p netip.Addr, u bool) { ca <- change{p, u, time.Now()} })
	b = New(slog.Default(), func(p netip.Addr, u bool) { cb <- change{p, u, time.Now()} })
	a.listenPorts, a.peerPorts = [2]int{13784, 14784}, [2]int{23784, 24784}
	b.listenPorts, b.peerPorts = [2]int{23784, 24784}, [2]int{13784, 14784}
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	return a, b, ca, cb
}

func wantChange(t *testing.T, c chan change, usable bool, within time.Duration) change {
	t.Helper()
	select {
	case got := <-c:
		if got.usable != usable {
			t.Fatalf("usable %v; want %v", got.usable, usable)
		}
		return got
	case <-time.After(within):
		t.Fatalf("no change to usable %v within %v", usable, within)
	}
	return change{}
}

// Two managers over real UDP: both sessions come Up at the profile's
// intervals; when one end goes away it says AdminDown, and the other end
// takes its side Down at once, not at its detection time, without
// reporting the peer unusable (RFC 5882 3.2: BFD was taken away, the path
// did not fail).
func TestSessionsOverRealSockets(t *testing.T) {
	a, b, ca, cb := loopbackPair(t)
	peer := netip.MustParseAddr("127.0.0.1")
	fast := Profile{ReceiveInterval: 20 * time.Millisecond, TransmitInterval: 20 * time.Millisecond}
	for _, m := range []*Manager{a, b} {
		if err := m.Set([]Session{{Peer: peer, Profile: fast}}); err != nil {
			t.Fatal(err)
		}
	}
	wantChange(t, ca, true, 5*time.Second)
	wantChange(t, cb, true, 5*time.Second)
	// Up, then the Poll sequence agrees on the profile's intervals (the
	// detection time is 3 s while the peer still says 1 s).
	waitStatus := func(m *Manager, what string, ok func(Status) bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			st := m.Status()
			if len(st) == 1 && ok(st[0]) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("status %+v; want %s", st, what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitStatus(b, "one usable session Up with a 60ms detection time", func(s Status) bool {
		return s.State == Up && s.Usable && s.DetectTime == 60*time.Millisecond
	})

	// A slower profile is agreed without the session going down.
	if err := a.Set([]Session{{Peer: peer, Profile: Profile{ReceiveInterval: 50 * time.Millisecond, TransmitInterval: 50 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	waitStatus(b, "a 150ms detection time after a's new profile", func(s Status) bool { return s.DetectTime == 150*time.Millisecond })
	select {
	case c := <-cb:
		t.Fatalf("a profile change flapped the session: %+v", c)
	default:
	}

	if err := a.Set(nil); err != nil {
		t.Fatal(err)
	}
	waitStatus(b, "Down by the peer's AdminDown (not its detection time), still usable, no flap", func(s Status) bool {
		return s.State == Down && s.PeerAdminDown && s.Diagnostic == DiagNeighborDown && s.Usable && s.Flaps == 0
	})
	select {
	case c := <-cb:
		t.Fatalf("the peer's AdminDown was reported: %+v", c)
	case <-time.After(200 * time.Millisecond):
	}
}

// A session whose peer never answers is never reported unusable: BFD that
// never came up does not take a BGP session down.
func TestSilentPeerIsNotReportedDown(t *testing.T) {
	a, _, ca, _ := loopbackPair(t)
	if err := a.Set([]Session{{Peer: netip.MustParseAddr("127.0.0.1"), Profile: Profile{ReceiveInterval: 10 * time.Millisecond, TransmitInterval: 10 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-ca:
		t.Fatalf("reported %+v for a peer that never spoke", c)
	case <-time.After(300 * time.Millisecond):
	}
	if st := a.Status(); len(st) != 1 || st[0].State != Down {
		t.Errorf("status %+v", st)
	}
}

func TestSetRefusesBadProfiles(t *testing.T) {
	a, _, _, _ := loopbackPair(t)
	err := a.Set([]Session{{Peer: netip.MustParseAddr("127.0.0.1"), Profile: Profile{DetectMultiplier: 1}}})
	if err == nil || len(a.Status()) != 0 {
		t.Errorf("multiplier 1: %v, %d sessions", err, len(a.Status()))
	}
}

// Bad input is refused with the session named, and changes nothing: a
// running session given a bad profile keeps running on its old one.
func TestSetRefusesSessionsItCannotRun(t *testing.T) {
	a, _, _, _ := loopbackPair(t)
	peer := netip.MustParseAddr("127.0.0.1")
	good := Session{Peer: peer, Profile: Profile{ReceiveInterval: 50 * time.Millisecond}}
	if err := a.Set([]Session{good}); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]Session{
		"multiplier 1":                      {Peer: peer, Profile: Profile{DetectMultiplier: 1}},
		"link-local with no zone or device": {Peer: netip.MustParseAddr("fe80::1")},
		"link-local over several hops":      {Peer: netip.MustParseAddr("fe80::1%lo"), MultiHop: true},
		"no peer address":                   {},
	} {
		err := a.Set([]Session{good, s})
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if st := a.Status(); len(st) != 1 || st[0].Peer != peer {
			t.Errorf("%s: sessions %+v; want the good one alone", name, st)
		}
		err = a.Set([]Session{{Peer: peer, Profile: Profile{DetectMultiplier: 1}}})
		if err == nil || len(a.Status()) != 1 {
			t.Fatalf("a running session given multiplier 1: %v, %d sessions; want an error and the session kept", err, len(a.Status()))
		}
	}
}

// A packet is its session's only from the session's peer and on the
// session's port: a discriminator guessed or replayed from elsewhere, or a
// single-hop session's packet arriving on the multi-hop port (where a lower
// TTL passes), is not taken.
func TestPacketsAreMatchedToTheirPeerAndPort(t *testing.T) {
	a, _, _, _ := loopbackPair(t)
	peer := netip.MustParseAddr("127.0.0.1")
	if err := a.Set([]Session{{Peer: peer}}); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	r := a.sessions[key{peer: peer}]
	a.mu.Unlock()
	p := packet{State: Down, DetectMult: 3, MyDisc: 7, YourDisc: r.disc}
	if got := a.lookup(p, peer, 0, false); got != r {
		t.Fatalf("the peer's own packet: session %v", got)
	}
	if got := a.lookup(p, netip.MustParseAddr("127.0.0.2"), 0, false); got != nil {
		t.Errorf("the session's discriminator from another address: taken by %+v", got.cfg)
	}
	if got := a.lookup(p, peer, 0, true); got != nil {
		t.Errorf("a single-hop session's discriminator on the multi-hop port: taken by %+v", got.cfg)
	}
}

// GTSM (RFC 5881 5): a single-hop session takes only packets that
// arrive with TTL 255, which no router can have forwarded.
func TestSingleHopTakesOnlyTTL255(t *testing.T) {
	a, _, _, _ := loopbackPair(t)
	peer := netip.MustParseAddr("127.0.0.1")
	if err := a.Set([]Session{{Peer: peer}}); err != nil {
		t.Fatal(err)
	}
	down := packet{State: Down, DetectMult: 3, MyDisc: 7, DesiredMinTx: 1e6, RequiredMinRx: 1e6}.marshal()
	sendWithTTL := func(ttl int) {
		t.Helper()
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: a.listenPorts[0]})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := ipv4.NewConn(c).SetTTL(ttl); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(down); err != nil {
			t.Fatal(err)
		}
	}
	sendWithTTL(64)
	time.Sleep(100 * time.Millisecond)
	if st := a.Status(); st[0].State != Down {
		t.Fatalf("after a packet with TTL 64: %s; want Down (dropped)", st[0].State)
	}
	sendWithTTL(255)
	deadline := time.Now().Add(time.Second)
	for a.Status()[0].State != Init {
		if time.Now().After(deadline) {
			t.Fatalf("after a packet with TTL 255: %s; want Init", a.Status()[0].State)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A session this end removes (its peer dropped from Set, or Close) is not
// reported unusable: the peer is not known to be down, and a speaker told
// so would close a BGP session that an operator only took BFD off.
func TestRemovedSessionIsNotReportedDown(t *testing.T) {
	a, b, ca, cb := loopbackPair(t)
	peer := netip.MustParseAddr("127.0.0.1")
	fast := Profile{ReceiveInterval: 20 * time.Millisecond, TransmitInterval: 20 * time.Millisecond}
	for _, m := range []*Manager{a, b} {
		if err := m.Set([]Session{{Peer: peer, Profile: fast}}); err != nil {
			t.Fatal(err)
		}
	}
	wantChange(t, ca, true, 5*time.Second)
	wantChange(t, cb, true, 5*time.Second)
	if err := a.Set(nil); err != nil {
		t.Fatal(err)
	}
	a.Close()
	select {
	case c := <-ca:
		t.Errorf("the end that removed the session reported %+v", c)
	case c := <-cb:
		t.Errorf("the end told AdminDown reported %+v", c)
	case <-time.After(200 * time.Millisecond):
	}
}

// Unnumbered links often give every router the same link-local address
// (fe80::1) on each link: a packet belongs to the session of the link it
// came in on.
func TestLinkLocalPeersAreToldApartByLink(t *testing.T) {
	a, _, _, _ := loopbackPair(t)
	onLo := Session{Peer: netip.MustParseAddr("fe80::1%lo")}
	onDevice := Session{Peer: netip.MustParseAddr("fe80::1"), Interface: "lo"}
	for _, s := range []Session{onLo, onDevice} {
		if err := a.Set([]Session{s}); err != nil {
			t.Fatal(err)
		}
		a.mu.Lock()
		r := a.sessions[keyOf(s)]
		a.mu.Unlock()
		for _, tc := range []struct {
			link int // lo is 1
			your uint32
			want *runner
		}{
			{1, 0, r},
			{1, r.disc, r},
			{7, 0, nil},
			{7, r.disc, nil},
		} {
			p := packet{State: Down, DetectMult: 3, MyDisc: 7, YourDisc: tc.your}
			if got := a.lookup(p, netip.MustParseAddr("fe80::1"), tc.link, false); got != tc.want {
				t.Errorf("session %+v, a packet from link %d to discriminator %d: taken %v; want %v", s, tc.link, tc.your, got != nil, tc.want != nil)
			}
		}
	}
}
