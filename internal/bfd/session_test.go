package bfd

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// handshake runs two machines against each other, each packet delivered
// at once, until neither changes.
func exchange(a, b *machine, now time.Time) {
	for range 4 {
		b.receive(a.packet(), now)
		a.receive(b.packet(), now)
	}
}

// RFC 5880 6.2: Down, Init, Up on both ends, then intervals agreed by a
// Poll sequence from the slow 1 s of a session not Up to the profile's.
func TestThreeWayHandshakeAndPoll(t *testing.T) {
	p := Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 100 * time.Millisecond}
	a, b := newMachine(p, 1, t0), newMachine(p, 2, t0)
	if a.txInterval() != time.Second {
		t.Errorf("down: transmit every %v; want 1s (6.8.3)", a.txInterval())
	}
	b.receive(a.packet(), t0)
	if b.state != Init {
		t.Fatalf("b after a's Down: %s; want Init", b.state)
	}
	a.receive(b.packet(), t0)
	if a.state != Up {
		t.Fatalf("a after b's Init: %s; want Up", a.state)
	}
	b.receive(a.packet(), t0)
	if b.state != Up {
		t.Fatalf("b after a's Up: %s; want Up", b.state)
	}
	if !a.polling || !b.polling {
		t.Fatalf("Up: no Poll sequence for the faster intervals (a %v, b %v)", a.polling, b.polling)
	}
	exchange(a, b, t0)
	if a.polling || b.polling {
		t.Errorf("the Poll sequences did not end")
	}
	if a.txInterval() != 100*time.Millisecond || a.detectionTime() != 300*time.Millisecond {
		t.Errorf("Up: transmit every %v, detect in %v; want 100ms, 300ms", a.txInterval(), a.detectionTime())
	}
}

func upPair(t *testing.T, pa, pb Profile) (*machine, *machine) {
	t.Helper()
	a, b := newMachine(pa, 1, t0), newMachine(pb, 2, t0)
	exchange(a, b, t0)
	if a.state != Up || b.state != Up {
		t.Fatalf("handshake: %s, %s", a.state, b.state)
	}
	return a, b
}

// Detection: no packet for multiplier × the agreed interval takes a
// session down with diagnostic 1, and forgets the peer's discriminator.
func TestDetectionTimeExpires(t *testing.T) {
	p := Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 100 * time.Millisecond}
	a, _ := upPair(t, p, Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 200 * time.Millisecond})
	// The peer sends every 200 ms at best: 3 × 200 ms.
	if d := a.detectionTime(); d != 600*time.Millisecond {
		t.Fatalf("detection time %v; want 600ms", d)
	}
	if a.expire(t0.Add(599 * time.Millisecond)) {
		t.Fatal("down before the detection time")
	}
	if !a.expire(t0.Add(600*time.Millisecond)) || a.state != Down || a.diag != DiagDetectionExpired || a.remoteDisc != 0 {
		t.Errorf("after the detection time: %s, %s, remote discriminator %d", a.state, a.diag, a.remoteDisc)
	}
}

// A peer that says AdminDown (it is shutting down) or Down takes the
// session down at once, with diagnostic 3.
func TestPeerSignalsDown(t *testing.T) {
	p := Profile{}
	for _, s := range []State{AdminDown, Down} {
		a, b := upPair(t, p, p)
		if s == AdminDown {
			b.adminDown(t0)
		} else {
			b.down(DiagDetectionExpired, t0)
		}
		if !a.receive(b.packet(), t0) || a.state != Down || a.diag != DiagNeighborDown {
			t.Errorf("peer %s: %s, %s", s, a.state, a.diag)
		}
	}
}

// A slower transmit interval waits for the peer's Final (6.8.3): the peer
// still times us by the old one until then.
func TestSlowerTransmitWaitsForFinal(t *testing.T) {
	fast := Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 100 * time.Millisecond}
	a, b := upPair(t, fast, fast)
	a.setProfile(Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 500 * time.Millisecond})
	if a.txInterval() != 100*time.Millisecond || !a.polling {
		t.Fatalf("before the Final: transmit every %v, polling %v; want 100ms, true", a.txInterval(), a.polling)
	}
	pkt := a.packet()
	if !pkt.Poll || pkt.DesiredMinTx != 500000 {
		t.Fatalf("the Poll packet: %+v", pkt)
	}
	b.receive(pkt, t0)
	a.receive(b.packet(), t0)
	if a.polling || a.txInterval() != 500*time.Millisecond {
		t.Errorf("after the Final: transmit every %v, polling %v; want 500ms, false", a.txInterval(), a.polling)
	}
	if b.detectionTime() != 1500*time.Millisecond {
		t.Errorf("the peer's detection time %v; want 1.5s", b.detectionTime())
	}
}

// A passive end sends nothing until the peer has spoken.
func TestPassiveWaits(t *testing.T) {
	a := newMachine(Profile{Passive: true}, 1, t0)
	if a.txInterval() != 0 {
		t.Fatalf("passive before hearing the peer: transmits every %v", a.txInterval())
	}
	b := newMachine(Profile{}, 2, t0)
	a.receive(b.packet(), t0)
	if a.txInterval() == 0 {
		t.Error("passive after hearing the peer: sends nothing")
	}
}

// Flap damping: the first flap costs nothing; each further one within a
// minute doubles the hold-down, to 30 s at most; a quiet minute resets it.
func TestDampingHoldsFlappingSessionsBack(t *testing.T) {
	var d damping
	now := t0
	var holds []time.Duration
	for range 8 {
		d.down(now)
		now = now.Add(time.Second)
		holds = append(holds, d.up(now))
	}
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i := range want {
		if holds[i] != want[i] {
			t.Fatalf("holds after each flap %v; want %v", holds, want)
		}
	}
	d.down(now.Add(2 * time.Minute))
	if h := d.up(now.Add(2*time.Minute + time.Second)); h != 0 {
		t.Errorf("a flap after a quiet minute: hold %v; want 0", h)
	}
	if d.flaps != 9 {
		t.Errorf("%d flaps counted; want 9", d.flaps)
	}
}

func TestProfileBounds(t *testing.T) {
	for _, p := range []Profile{{}, {ReceiveInterval: 10 * time.Millisecond, TransmitInterval: time.Minute, DetectMultiplier: 2}, {DetectMultiplier: 255}} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	for field, p := range map[string]Profile{
		"receive_interval_ms":  {ReceiveInterval: 9 * time.Millisecond},
		"transmit_interval_ms": {TransmitInterval: time.Minute + time.Millisecond},
		"detect_multiplier":    {DetectMultiplier: 1},
	} {
		if err := p.Validate(); err == nil || !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("%+v: %v; want an error naming %s", p, err, field)
		}
	}
	if err := (Profile{ReceiveInterval: 100*time.Millisecond + time.Microsecond}).Validate(); err == nil {
		t.Error("a fraction of a millisecond accepted")
	}
}
