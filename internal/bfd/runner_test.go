package bfd

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// fakePeer drives one session of a manager on a fake clock: it hands the
// session packets as if they had arrived, and steps the clock.
type fakePeer struct {
	t       *testing.T
	m       *Manager
	clock   *clocktesting.FakeClock
	r       *runner
	changes chan bool
	// talking makes the peer send Up at every step of the clock.
	talking bool
}

func newFakePeer(t *testing.T, p Profile) *fakePeer {
	f := &fakePeer{t: t, clock: clocktesting.NewFakeClock(t0), changes: make(chan bool, 16)}
	f.m = New(slog.Default(), func(_ netip.Addr, u bool) { f.changes <- u })
	f.m.clock = fakeClock{f.clock}
	f.m.listenPorts, f.m.peerPorts = [2]int{33784, 34784}, [2]int{43784, 44784}
	t.Cleanup(f.m.Close)
	peer := netip.MustParseAddr("127.0.0.1")
	if err := f.m.Set([]Session{{Peer: peer, Profile: p}}); err != nil {
		t.Fatal(err)
	}
	f.r = f.m.sessions[key{peer: peer}]
	return f
}

// say hands the session a packet of the peer (discriminator 7, sending
// and wanting every 100 ms), and waits until the session is in want.
func (f *fakePeer) say(s State, want State) {
	f.t.Helper()
	your := f.r.disc
	if s == Down {
		your = 0
	}
	f.r.deliver(f.packet(s, your))
	f.waitState(want)
}

func (f *fakePeer) packet(s State, your uint32) packet {
	return packet{State: s, DetectMult: 3, MyDisc: 7, YourDisc: your, DesiredMinTx: 100000, RequiredMinRx: 100000}
}

func (f *fakePeer) waitState(want State) {
	f.t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for f.r.snapshot().State != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("session %s; want %s", f.r.snapshot().State, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// up brings the session Up by the three-way handshake.
func (f *fakePeer) up() {
	f.t.Helper()
	f.say(Down, Init)
	f.say(Up, Up)
}

// stepUntil steps the fake clock 10 ms at a time until onChange says
// usable, and returns the fake time that took (a few steps more when the
// machine is slow to run the session); it fails after limit.
func (f *fakePeer) stepUntil(usable bool, limit time.Duration) time.Duration {
	f.t.Helper()
	start := f.clock.Now()
	for {
		select {
		case u := <-f.changes:
			if u != usable {
				f.t.Fatalf("reported usable %v; want %v", u, usable)
			}
			return f.clock.Since(start)
		case <-time.After(2 * time.Millisecond):
		}
		if f.clock.Since(start) > limit {
			f.t.Fatalf("no usable %v within %v (fake time); status %+v", usable, limit, f.r.snapshot())
		}
		f.clock.Step(10 * time.Millisecond)
		if f.talking {
			f.r.deliver(f.packet(Up, f.r.disc))
		}
	}
}

func (f *fakePeer) noChange(what string) {
	f.t.Helper()
	select {
	case u := <-f.changes:
		f.t.Fatalf("%s: reported usable %v", what, u)
	case <-time.After(20 * time.Millisecond):
	}
}

// What the session reports as time passes, on a fake clock: usable at
// once the first time Up; unusable at its detection time (3 × the 300 ms
// it receives at: 900 ms); usable at once after a first flap; held back
// 1 s after a second flap within a minute, 2 s after a third; a peer
// that says Down makes it unusable without waiting; and a peer that says
// AdminDown (it took BFD down on purpose: RFC 5882 3.2) leaves it usable,
// uncounted as a flap, until it comes Up again and fails.
func TestReportsOnAFakeClock(t *testing.T) {
	f := newFakePeer(t, Profile{})
	f.say(Down, Init)
	f.noChange("Init")
	f.say(Up, Up)
	if took := f.stepUntil(true, 0); took != 0 {
		t.Fatalf("first Up: usable after %v; want at once", took)
	}
	for flap, hold := range []time.Duration{0, time.Second, 2 * time.Second} {
		took := f.stepUntil(false, 2*time.Second)
		if took < 900*time.Millisecond || took > time.Second {
			t.Errorf("flap %d: unusable after %v of silence; want the 900 ms detection time", flap+1, took)
		}
		if st := f.r.snapshot(); st.State != Down || st.Diagnostic != DiagDetectionExpired || st.Flaps != flap+1 {
			t.Errorf("flap %d: status %+v", flap+1, st)
		}
		f.up()
		if hold > 0 {
			f.noChange("Up within the hold-down")
		}
		f.talking = true
		if took := f.stepUntil(true, hold+time.Second); took < hold || took > hold+100*time.Millisecond {
			t.Errorf("flap %d: usable %v after Up; want the hold-down %v", flap+1, took, hold)
		}
		f.talking = false
	}
	f.say(AdminDown, Down)
	f.noChange("the peer's AdminDown")
	if st := f.r.snapshot(); !st.Usable || st.Diagnostic != DiagNeighborDown || st.Flaps != 3 || !st.PeerAdminDown {
		t.Errorf("after the peer's AdminDown: %+v; want usable, 3 flaps, Down by the peer's AdminDown", st)
	}
	// Silence now is no news either: the session is not Up.
	f.clock.Step(2 * time.Second)
	f.noChange("silence after the peer's AdminDown")
	// BFD back on at the peer, and the session Up: still usable, said
	// once already; a Down from the peer then counts.
	f.up()
	f.noChange("Up again after the peer's AdminDown")
	f.say(Down, Down)
	if took := f.stepUntil(false, 0); took != 0 {
		t.Errorf("the peer's Down: unusable after %v; want at once", took)
	}
	if st := f.r.snapshot(); st.Diagnostic != DiagNeighborDown || st.Flaps != 4 || st.PeerAdminDown {
		t.Errorf("after the peer's Down: %+v", st)
	}
}

// A quiet minute forgets the flaps: the hold-down is 0 again.
func TestDampingDecaysOnAFakeClock(t *testing.T) {
	f := newFakePeer(t, Profile{})
	f.up()
	f.stepUntil(true, 0)
	f.stepUntil(false, 2*time.Second)
	f.up()
	f.stepUntil(true, 0)
	f.stepUntil(false, 2*time.Second) // a second flap: 1 s hold-down now
	f.clock.Step(61 * time.Second)
	f.up()
	if took := f.stepUntil(true, time.Second); took != 0 {
		t.Errorf("Up a minute after the last flap: usable after %v; want at once", took)
	}
}

// fakeClock is k8s.io/utils/clock's fake as the sessions' clock.
type fakeClock struct{ *clocktesting.FakeClock }

func (c fakeClock) NewTimer(d time.Duration) timer { return c.FakeClock.NewTimer(d) }
