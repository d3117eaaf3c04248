package l2

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/utils/clock"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// The package's lock order is Leases.mu, then Responder.mu, and the
// Asker's mu is a leaf. Each check below runs where a lock is taken
// under another and fails when one is held that the order forbids.

// The Responder asks whether a lease runs (the Leases' lock) with its own
// lock free.
func TestResponderAsksValidOutsideItsLock(t *testing.T) {
	r := New(slog.New(slog.DiscardHandler))
	defer r.Close()
	asked := false
	r.Valid(func(netip.Addr) bool {
		asked = true
		if !r.mu.TryLock() {
			t.Error("the Responder asked Valid with its lock held: Leases.mu would be taken under Responder.mu")
			return true
		}
		r.mu.Unlock()
		return true
	})
	r.mu.Lock()
	r.owned[vip4] = map[string]bool{"n1": true}
	r.mu.Unlock()
	if !r.owns(vip4, "n1") || !asked {
		t.Fatal("an owned address with a running lease is not answered, or its lease was not asked")
	}
}

// The Leases set what the Responder answers under their own lock, so that
// answers follow the leases in the order they change.
func TestLeasesApplyUnderTheirLock(t *testing.T) {
	var l *Leases
	applied := 0
	l = NewLeases(clock.RealClock{}, func(Owned) error {
		applied++
		if l.mu.TryLock() {
			l.mu.Unlock()
			t.Error("the Leases applied outside their lock: an older set could land after a newer one")
		}
		return nil
	})
	if err := l.Granted(vip4, 1, time.Now(), time.Minute, []string{"n1"}); err != nil {
		t.Fatal(err)
	}
	l.Release(vip4)
	l.Close()
	if applied != 3 {
		t.Fatalf("applied %d times, want 3 (grant, release, close)", applied)
	}
}

// askerHeldClock is a Leases clock that fails the test when the Asker's
// lock is held while the Leases read the time (every Leases call does).
type askerHeldClock struct {
	clock.RealClock
	t *testing.T
	a *Asker
}

func (c *askerHeldClock) Now() time.Time {
	if c.a != nil {
		if !c.a.mu.TryLock() {
			c.t.Error("the Asker called its Leases with its lock held")
		} else {
			c.a.mu.Unlock()
		}
	}
	return c.RealClock.Now()
}

// The Asker calls its Leases with its own lock free.
func TestAskerCallsItsLeasesOutsideItsLock(t *testing.T) {
	clk := &askerHeldClock{t: t}
	leases := NewLeases(clk, func(Owned) error { return nil })
	a := NewAsker(nil, "node1", leases, clock.RealClock{}, slog.New(slog.DiscardHandler))
	clk.a = a
	a.mu.Lock()
	a.ifaces = map[netip.Addr][]string{vip4: {"n1"}}
	a.mu.Unlock()
	a.wanted()
	grant := &weirv1.LeasesResponse{Sequence: 1, Ttl: durationpb.New(time.Minute),
		Leases: []*weirv1.L2Lease{{Address: vip4.String(), Epoch: 1}}}
	a.take(grant, time.Now(), time.Minute)
	if !leases.Valid(vip4) {
		t.Fatal("the grant was not taken")
	}
	a.take(&weirv1.LeasesResponse{Sequence: 2}, time.Now(), time.Minute)
	if leases.Valid(vip4) {
		t.Fatal("a grant that no longer lists the address did not give it up")
	}
}
