package bfd

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"
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
// takes the peer as unusable at once, not at its detection time.
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

	start := time.Now()
	if err := a.Set(nil); err != nil {
		t.Fatal(err)
	}
	got := wantChange(t, cb, false, time.Second)
	if d := got.at.Sub(start); d > 100*time.Millisecond {
		t.Logf("AdminDown took %v to take b's side down (its detection time is 150ms)", d)
	}
	if st := b.Status(); st[0].State != Down || st[0].Diagnostic != DiagNeighborDown || st[0].Flaps != 1 {
		t.Errorf("b's status %+v; want Down by the neighbour's signal, one flap", st[0])
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
