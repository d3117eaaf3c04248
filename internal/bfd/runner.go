package bfd

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// runner is one session's goroutine: it owns the session's machine and
// sending socket.
type runner struct {
	m    *Manager
	cfg  Session
	disc uint32
	conn *net.UDPConn
	dst  *net.UDPAddr
	// link is the index of a link-local peer's device, 0 for other
	// peers.
	link int

	rx       chan packet
	profiles chan Profile
	quit     chan struct{}
	done     chan struct{}

	// minTTL is the lowest TTL a packet of a multi-hop session may come
	// with, which the receiving goroutine reads.
	minTTL atomic.Uint32

	mu     sync.Mutex
	status Status
}

// start opens a session's socket and starts its goroutine; m.mu is held.
func (m *Manager) start(s Session) (*runner, error) {
	link := 0
	if s.Peer.Is6() && s.Peer.IsLinkLocalUnicast() {
		// Resolved now, in the caller's network namespace, where the
		// device's name means that device.
		ifi, err := net.InterfaceByName(cmpOr(s.Peer.Zone(), s.Interface))
		if err != nil {
			return nil, fmt.Errorf("bfd: session with %s: %w", s.Peer, err)
		}
		link = ifi.Index
	}
	conn, err := dial(s)
	if err != nil {
		return nil, err
	}
	r := &runner{
		m: m, cfg: s, disc: m.newDisc(), conn: conn, link: link,
		dst: &net.UDPAddr{IP: s.Peer.AsSlice(), Port: m.peerPorts[hop(s)]},
		rx:  make(chan packet, 16), profiles: make(chan Profile, 1),
		quit: make(chan struct{}), done: make(chan struct{}),
		status: Status{Peer: s.Peer, MultiHop: s.MultiHop, State: Down},
	}
	r.minTTL.Store(uint32(s.Profile.minimumTTL()))
	if link != 0 {
		r.dst.Zone = strconv.Itoa(link)
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(r.done)
		r.run(m.clock)
	}()
	return r, nil
}

// deliver hands the goroutine a packet; when it lags behind, the packet
// is dropped, as the network might have.
func (r *runner) deliver(p packet) {
	select {
	case r.rx <- p:
	default:
	}
}

func (r *runner) setProfile(p Profile) {
	r.minTTL.Store(uint32(p.minimumTTL()))
	select {
	case <-r.profiles: // a newer profile replaces one not yet taken
	default:
	}
	r.profiles <- p
}

// stop ends the session, sending AdminDown first.
func (r *runner) stop() {
	close(r.quit)
}

func (r *runner) snapshot() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// run is the session: it sends at the negotiated interval, applies what
// arrives, watches the detection time and reports usability through the
// damping rule.
func (r *runner) run(clk clock) {
	now := clk.Now
	defer r.conn.Close()
	mc := newMachine(r.cfg.Profile, r.disc, now())
	var d damping
	usable := false // as last reported

	stopped := func() timer {
		t := clk.NewTimer(time.Hour)
		t.Stop()
		return t
	}
	tx, detect, hold := stopped(), stopped(), stopped()
	defer tx.Stop()
	defer detect.Stop()
	defer hold.Stop()
	if mc.txInterval() > 0 {
		tx.Reset(0)
	}

	publish := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.status.State, r.status.Usable, r.status.Diagnostic = mc.state, usable, mc.diag
		r.status.PeerAdminDown = mc.state == Down && mc.remoteState == AdminDown
		r.status.Flaps, r.status.LastChange, r.status.HoldDown = d.flaps, mc.lastStateTime, d.hold(now())
		r.status.DetectTime = 0
		if mc.state == Up {
			r.status.DetectTime = mc.detectionTime()
		}
	}
	// report tells onChange, once Status says the same.
	report := func(u bool) {
		if u == usable {
			return
		}
		usable = u
		publish()
		r.m.events.push(r.cfg.Peer, u)
	}
	send := func() {
		if _, err := r.conn.WriteToUDP(mc.packet().marshal(), r.dst); err != nil {
			r.m.log.Debug("BFD send failed", "peer", r.cfg.Peer, "err", err)
		}
	}
	// schedule sets the next packet's time from the interval in force.
	schedule := func() {
		if iv := mc.txInterval(); iv > 0 {
			tx.Reset(mc.jittered(iv))
		}
	}
	// changed follows a state change: reporting, damping, timers.
	changed := func(before State) {
		t := now()
		switch {
		case mc.state == Up:
			if h := d.up(t); h > 0 {
				hold.Reset(h)
			} else {
				report(true)
			}
		case before == Up && mc.remoteState == AdminDown:
			// The peer took BFD away on purpose (RFC 5882 3.2): its
			// path is not known to have failed, and the client goes on
			// as without BFD. Not a flap either.
			hold.Stop()
		case before == Up:
			d.down(t)
			hold.Stop()
			report(false)
		}
		if mc.detectBy.IsZero() {
			detect.Stop()
		}
		r.m.log.Info("BFD session "+mc.state.String(), "peer", r.cfg.Peer, "diagnostic", mc.diag.String())
	}

	for {
		select {
		case <-r.quit:
			mc.adminDown(now())
			// Three times: one lost packet must not leave the peer to
			// find out by its detection time.
			for range 3 {
				send()
			}
			// Nothing is reported: this end ended the session, so the
			// peer is not known to be down.
			return
		case p := <-r.rx:
			before, wasPolling, hadRemote := mc.state, mc.polling, mc.remoteDisc != 0
			stateChanged := mc.receive(p, now())
			// The detection timer first: once Status says Up, it runs.
			if !mc.detectBy.IsZero() {
				detect.Reset(mc.detectBy.Sub(now()))
			}
			if stateChanged {
				changed(before)
			}
			switch {
			case mc.finalDue, mc.state != before:
				send() // answer a Poll, and tell a change at once (6.8.7)
				schedule()
			case !hadRemote || wasPolling != mc.polling:
				schedule() // a passive end starts sending; an interval ended its Poll
			}
		case <-tx.C():
			if mc.txInterval() > 0 {
				send()
				schedule()
			}
		case <-detect.C():
			before := mc.state
			if mc.expire(now()) {
				changed(before)
				send()
				schedule()
			}
		case <-hold.C():
			if mc.state == Up {
				report(true)
			}
		case p := <-r.profiles:
			mc.setProfile(p)
			send()
			schedule()
		}
		publish()
	}
}

// damping holds a flapping session back: a session that goes down once is
// usable again as soon as it is Up, but each further flap within a minute
// doubles the time it must stay Up first, from 1 s to 30 s, so a link that
// loses packets in bursts does not move the peer's routes back and forth.
// Flaps older than a minute are forgotten.
type damping struct {
	recent []time.Time // times the session left Up, in the last minute
	flaps  int
}

const (
	dampWindow  = time.Minute
	dampInitial = time.Second
	dampMax     = 30 * time.Second
)

func (d *damping) forget(now time.Time) {
	i := 0
	for i < len(d.recent) && now.Sub(d.recent[i]) > dampWindow {
		i++
	}
	d.recent = d.recent[i:]
}

func (d *damping) down(now time.Time) {
	d.forget(now)
	d.recent = append(d.recent, now)
	d.flaps++
}

// up is how long the session must stay Up before it is usable.
func (d *damping) up(now time.Time) time.Duration {
	d.forget(now)
	return d.hold(now)
}

// hold is the hold-down the flaps of the last minute call for.
func (d *damping) hold(now time.Time) time.Duration {
	n := 0
	for _, t := range d.recent {
		if now.Sub(t) <= dampWindow {
			n++
		}
	}
	if n <= 1 {
		return 0
	}
	return min(dampInitial<<(n-2), dampMax)
}

// queue calls onChange in order, from one goroutine, without blocking the
// sessions that push to it.
type queue struct {
	onChange func(netip.Addr, bool)
	mu       sync.Mutex
	pending  []event
	wake     chan struct{}
	done     chan struct{}
}

type event struct {
	peer   netip.Addr
	usable bool
}

func newQueue(onChange func(netip.Addr, bool)) *queue {
	q := &queue{onChange: onChange, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *queue) push(peer netip.Addr, usable bool) {
	q.mu.Lock()
	q.pending = append(q.pending, event{peer, usable})
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) run() {
	for {
		_, open := <-q.wake
		q.mu.Lock()
		batch := q.pending
		q.pending = nil
		q.mu.Unlock()
		for _, e := range batch {
			if q.onChange != nil {
				q.onChange(e.peer, e.usable)
			}
		}
		if !open {
			close(q.done)
			return
		}
	}
}

// close delivers what is pending, then stops.
func (q *queue) close() {
	close(q.wake)
	<-q.done
}

// clock is what sessions keep time by: the real one, or a fake in tests
// (k8s.io/utils/clock's, adapted: the datapath, which reads a Profile,
// depends on no Kubernetes module).
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

type timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
