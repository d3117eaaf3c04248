package l2

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Leases is the node's side of the fence: it answers for an address only
// while it holds an unexpired lease on it, counted from the moment the
// node asked for it, by the node's own clock. The server counts the same
// lease from when it granted it, which is later, and waits a margin more
// before it gives the address to another node: so this node has stopped
// answering before any other starts, whatever the delays between them.
type Leases struct {
	clk   clock.WithDelayedExecution
	apply func(Owned) error // the Responder's Set, or a fake

	// mu guards the fields below. Lock order: Leases.mu, then
	// Responder.mu. apply (the Responder's Set) runs with mu held, so
	// that the answers follow the leases in the order they change; the
	// Responder asks Valid outside its own lock, and a timer's function
	// takes mu on a goroutine of its own, never under the clock's lock.
	mu   sync.Mutex
	held map[netip.Addr]held
	// lapsed are the leases that ended without being given up (no
	// server renewed them), with when: reported for a while, so that the
	// next server can give them back.
	lapsed map[netip.Addr]lapse
	timer  clock.Timer
	closed bool
}

// lapse is a lease that ended unrenewed.
type lapse struct {
	epoch uint64
	at    time.Time
}

// LapsedFor is how long a lapsed lease is reported: past a server's start
// and its wait to hear from the nodes.
const LapsedFor = time.Minute

// held is one lease: until when it is valid here, and where to answer.
type held struct {
	epoch  uint64
	until  time.Time
	ifaces []string
}

// NewLeases answers through apply (a Responder's Set) for the leases it
// holds, counting time on clk.
func NewLeases(clk clock.WithDelayedExecution, apply func(Owned) error) *Leases {
	return &Leases{clk: clk, apply: apply, held: map[netip.Addr]held{}, lapsed: map[netip.Addr]lapse{}}
}

// Granted records a lease of epoch on addr that the server granted for
// ttl in answer to a request the node made at asked (a time of this
// Leases' clock), to be answered on ifaces. A lease that has already
// ended changes nothing.
func (l *Leases) Granted(addr netip.Addr, epoch uint64, asked time.Time, ttl time.Duration, ifaces []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	until := asked.Add(ttl)
	if l.closed || !l.clk.Now().Before(until) {
		return nil
	}
	if h, ok := l.held[addr]; ok && h.epoch == epoch && !until.After(h.until) {
		return nil // an older answer arriving late
	}
	l.held[addr] = held{epoch: epoch, until: until, ifaces: slices.Clone(ifaces)}
	delete(l.lapsed, addr)
	return l.applyLocked()
}

// Release stops answering for addr at once (a handover, or the server
// chose another node); it returns the epoch released, for the server.
func (l *Leases) Release(addr netip.Addr) (epoch uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[addr]
	if !ok {
		return 0, false
	}
	delete(l.held, addr)
	delete(l.lapsed, addr)
	l.applyLocked()
	return h.epoch, true
}

// Lapsed are the leases that ended unrenewed within LapsedFor, by
// address: their epochs.
func (l *Leases) Lapsed() map[netip.Addr]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[netip.Addr]uint64{}
	now := l.clk.Now()
	for a, lp := range l.lapsed {
		if now.Sub(lp.at) < LapsedFor {
			out[a] = lp.epoch
		} else {
			delete(l.lapsed, a)
		}
	}
	return out
}

// Holding is every lease held now, by address: its epoch.
func (l *Leases) Holding() map[netip.Addr]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[netip.Addr]uint64{}
	now := l.clk.Now()
	for a, h := range l.held {
		if now.Before(h.until) {
			out[a] = h.epoch
		}
	}
	return out
}

// Valid reports whether a lease on addr runs at this moment, by the
// node's clock (for Responder.Valid).
func (l *Leases) Valid(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[addr]
	return ok && l.clk.Now().Before(h.until)
}

// Held lists the addresses answered for now.
func (l *Leases) Held() []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []netip.Addr
	now := l.clk.Now()
	for a, h := range l.held {
		if now.Before(h.until) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// applyLocked drops the ended leases, answers for the others, and sets
// the timer for the next end. Called with mu held.
func (l *Leases) applyLocked() error {
	now := l.clk.Now()
	owned := Owned{}
	var next time.Time
	for a, h := range l.held {
		if !now.Before(h.until) {
			delete(l.held, a)
			l.lapsed[a] = lapse{epoch: h.epoch, at: h.until}
			continue
		}
		owned[a] = h.ifaces
		if next.IsZero() || h.until.Before(next) {
			next = h.until
		}
	}
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if !next.IsZero() && !l.closed {
		var t clock.Timer
		t = l.clk.AfterFunc(next.Sub(now), func() {
			// On a goroutine of its own, as time.AfterFunc runs it: a fake
			// clock calls it under its lock, which Now takes.
			go func() {
				l.mu.Lock()
				defer l.mu.Unlock()
				if l.timer == t {
					l.applyLocked()
				}
			}()
		})
		l.timer = t
	}
	return l.apply(owned)
}

// Close stops answering for everything.
func (l *Leases) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.held = map[netip.Addr]held{}
	l.applyLocked()
}
