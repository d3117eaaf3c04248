package l2

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/test/wait"
)

// answering records what the Leases had the responder answer for.
type answering struct {
	mu  sync.Mutex
	now Owned
}

func (a *answering) set(o Owned) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now = o
	return nil
}

func (a *answering) addrs() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Addr
	for addr := range a.now {
		out = append(out, addr)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// A node answers while its lease, counted from when it asked, runs, and
// not a moment after: however late the grant arrived.
func TestALeaseIsAnsweredUntilItEnds(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	var ans answering
	l := NewLeases(clk, ans.set)
	defer l.Close()
	a, b := netip.MustParseAddr("192.0.2.50"), netip.MustParseAddr("192.0.2.51")
	const ttl = 2 * time.Second

	// Asked at t0, granted (the answer reached the node) at t0+0.5s.
	clk.SetTime(t0.Add(500 * time.Millisecond))
	if err := l.Granted(a, 7, t0, ttl, []string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	if got := ans.addrs(); !slices.Equal(got, []netip.Addr{a}) {
		t.Fatalf("answering %v; want %v", got, a)
	}
	// A grant that arrives after its lease would have ended is no lease.
	clk.SetTime(t0.Add(time.Second))
	if err := l.Granted(b, 8, t0.Add(-2*time.Second), ttl, []string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	if got := ans.addrs(); slices.Contains(got, b) {
		t.Fatalf("answering %v after a grant whose lease had ended", got)
	}
	// The lease ends at t0+2s by this node's clock: the answers stop.
	clk.SetTime(t0.Add(ttl - time.Millisecond))
	if got := ans.addrs(); len(got) != 1 {
		t.Fatalf("answering %v a moment before the lease ends", got)
	}
	clk.SetTime(t0.Add(ttl))
	wait.Until(t, 10*time.Second, "the answers stop when the lease ends", func() bool { return len(ans.addrs()) == 0 })
	if held := l.Held(); len(held) != 0 {
		t.Fatalf("still holding %v", held)
	}
	// It ended unrenewed: reported as lapsed for a while, for the next
	// server to give back.
	if lapsed := l.Lapsed(); lapsed[a] != 7 {
		t.Fatalf("lapsed %v; want %s of epoch 7", lapsed, a)
	}
	clk.SetTime(clk.Now().Add(LapsedFor))
	if lapsed := l.Lapsed(); len(lapsed) != 0 {
		t.Fatalf("lapsed %v after %v", lapsed, LapsedFor)
	}

	// Renewed: a later request extends it.
	l.Granted(a, 9, clk.Now(), ttl, []string{"eth0"})
	clk.SetTime(clk.Now().Add(1500 * time.Millisecond))
	l.Granted(a, 9, clk.Now(), ttl, []string{"eth0"})
	clk.SetTime(clk.Now().Add(1500 * time.Millisecond))
	if got := ans.addrs(); !slices.Equal(got, []netip.Addr{a}) {
		t.Fatalf("answering %v after a renewal; want %v", got, a)
	}
	// Released: silent at once, and the epoch goes back to the server.
	if epoch, ok := l.Release(a); !ok || epoch != 9 {
		t.Fatalf("released epoch %d (%v); want 9", epoch, ok)
	}
	if got := ans.addrs(); len(got) != 0 {
		t.Fatalf("answering %v after the release", got)
	}
}
