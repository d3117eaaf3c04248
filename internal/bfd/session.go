package bfd

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"
)

// Profile is how a session runs; a zero field means its default.
type Profile struct {
	// ReceiveInterval is the Required Min RX Interval: how often the peer
	// may send at most; 0 means DefaultInterval.
	ReceiveInterval time.Duration
	// TransmitInterval is the Desired Min TX Interval: how often this end
	// would send; 0 means DefaultInterval.
	TransmitInterval time.Duration
	// DetectMultiplier is how many of the peer's packets may be missed
	// before the session is down; 0 means DefaultMultiplier.
	DetectMultiplier uint8
	// Passive sends nothing until the peer has spoken (RFC 5880 6.1).
	Passive bool
	// MinimumTTL is, for a multi-hop session, the lowest TTL a packet may
	// arrive with; 0 means DefaultMinimumTTL. A single-hop session takes
	// only TTL 255 (RFC 5881 5).
	MinimumTTL uint8
}

// Defaults, as FRR's bfdd and MetalLB's BFDProfile have them.
const (
	DefaultInterval   = 300 * time.Millisecond
	DefaultMultiplier = 3
	DefaultMinimumTTL = 254
)

// The bounds of a profile's intervals: RFC 5880 allows any number of
// microseconds; below 10 ms a Linux process cannot keep time, and above a
// minute a session detects nothing BGP's hold timer would not.
const (
	MinInterval = 10 * time.Millisecond
	MaxInterval = time.Minute
)

// Validate checks a profile; the error names the field as the API does.
func (p Profile) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"receive_interval_ms", p.ReceiveInterval}, {"transmit_interval_ms", p.TransmitInterval}} {
		if f.d != 0 && (f.d < MinInterval || f.d > MaxInterval || f.d%time.Millisecond != 0) {
			return fmt.Errorf("%s: %v is not 0 (%v) or a whole number of milliseconds from %v to %v", f.name, f.d, DefaultInterval, MinInterval, MaxInterval)
		}
	}
	if p.DetectMultiplier == 1 {
		return fmt.Errorf("detect_multiplier: 1 would take a session down at the first lost packet; 0 (%d) or 2-255", DefaultMultiplier)
	}
	return nil
}

func (p Profile) receive() time.Duration { return cmpOr(p.ReceiveInterval, DefaultInterval) }
func (p Profile) transmit() time.Duration {
	return cmpOr(p.TransmitInterval, DefaultInterval)
}
func (p Profile) multiplier() uint8 { return cmpOr(p.DetectMultiplier, DefaultMultiplier) }
func (p Profile) minimumTTL() uint8 { return cmpOr(p.MinimumTTL, DefaultMinimumTTL) }

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Session is one BFD session with a peer.
type Session struct {
	// Peer is the peer's address; an IPv6 link-local one with its zone.
	Peer netip.Addr
	// Local is the address to send from; the zero Addr lets the kernel
	// choose.
	Local netip.Addr
	// Interface binds the session to a device: for a single-hop peer
	// reached through a VRF or a given link.
	Interface string
	// MultiHop runs the session over several hops (RFC 5883): port 4784,
	// and packets arriving with a TTL of at least Profile.MinimumTTL.
	MultiHop bool
	Profile  Profile
}

// validate checks a session before it runs; the error names its peer.
func (s Session) validate() error {
	switch {
	case !s.Peer.IsValid():
		return errors.New("BFD session with no peer address")
	case s.MultiHop && s.Peer.Is6() && s.Peer.IsLinkLocalUnicast():
		// A link-local address is never more than one hop away.
		return fmt.Errorf("BFD session with %s: a link-local peer is on the link: not multi-hop", s.Peer)
	case s.Peer.Is6() && s.Peer.IsLinkLocalUnicast() && s.Peer.Zone() == "" && s.Interface == "":
		return fmt.Errorf("BFD session with %s: a link-local peer needs its zone (%%eth0) or an interface", s.Peer)
	}
	if err := s.Profile.Validate(); err != nil {
		return fmt.Errorf("BFD session with %s: %w", s.Peer, err)
	}
	return nil
}

// slowTx is the least interval between packets while a session is not
// Up (RFC 5880 6.8.3).
const slowTx = time.Second

// machine is a session's state variables and the rules of RFC 5880 6.8
// that change them; it keeps no time of its own: every call says when it
// is.
type machine struct {
	profile Profile

	state        State
	diag         Diag
	myDisc       uint32
	remoteState  State
	remoteDisc   uint32
	remoteMinRx  time.Duration // the peer's Required Min RX; 0 means send nothing
	remoteMinTx  time.Duration // the peer's Desired Min TX
	remoteMult   uint8
	heard        bool // a packet came from the peer since the last reset
	polling      bool // a Poll sequence is running
	advertisedTx time.Duration
	advertisedRx time.Duration
	// txInUse and rxInUse are the intervals this end times itself by:
	// while a Poll sequence runs, a slower transmit or a faster receive
	// waits for the peer's Final, lest the peer time out on the old
	// values (6.8.3).
	txInUse, rxInUse time.Duration
	detectBy         time.Time // zero while no detection runs
	finalDue         bool      // a packet with Final must go out now
	lastStateTime    time.Time
}

func newMachine(p Profile, disc uint32, now time.Time) *machine {
	m := &machine{profile: p, state: Down, myDisc: disc, remoteMinRx: time.Microsecond, lastStateTime: now}
	m.advertisedTx, m.advertisedRx = m.desiredTx(), p.receive()
	m.txInUse, m.rxInUse = m.advertisedTx, m.advertisedRx
	return m
}

// desiredTx is the Desired Min TX to advertise now: at least a second
// while not Up (6.8.3).
func (m *machine) desiredTx() time.Duration {
	if m.state != Up {
		return max(m.profile.transmit(), slowTx)
	}
	return m.profile.transmit()
}

// setProfile takes new intervals; while Up they are agreed by a Poll
// sequence (6.8.3).
func (m *machine) setProfile(p Profile) {
	m.profile = p
	m.renegotiate()
}

// renegotiate starts a Poll sequence when what is advertised changes.
func (m *machine) renegotiate() {
	tx, rx := m.desiredTx(), m.profile.receive()
	if tx == m.advertisedTx && rx == m.advertisedRx {
		return
	}
	m.advertisedTx, m.advertisedRx = tx, rx
	if m.state != Up && m.state != Init {
		m.txInUse, m.rxInUse = tx, rx
		return
	}
	m.polling = true
	m.txInUse, m.rxInUse = min(m.txInUse, tx), max(m.rxInUse, rx)
}

// txInterval is the time between two packets, before jitter; 0 means
// send nothing (the peer asked for none, or this end is passive and has
// not heard the peer).
func (m *machine) txInterval() time.Duration {
	if m.remoteMinRx == 0 || (m.profile.Passive && m.remoteDisc == 0) {
		return 0
	}
	return max(m.txInUse, m.remoteMinRx)
}

// jittered is a transmit interval less 0-25 % (0-10 % more with a
// multiplier of 1: RFC 5880 6.8.7).
func (m *machine) jittered(d time.Duration) time.Duration {
	low := 0.75
	high := 1.0
	if m.profile.multiplier() == 1 {
		high = 0.9
	}
	return time.Duration(float64(d) * (low + rand.Float64()*(high-low)))
}

// detectionTime is how long without a packet takes the session down.
func (m *machine) detectionTime() time.Duration {
	return time.Duration(m.remoteMult) * max(m.rxInUse, m.remoteMinTx)
}

// packet is what this end sends now.
func (m *machine) packet() packet {
	p := packet{
		Diag: m.diag, State: m.state, DetectMult: m.profile.multiplier(),
		MyDisc: m.myDisc, YourDisc: m.remoteDisc,
		DesiredMinTx: uint32(m.advertisedTx / time.Microsecond), RequiredMinRx: uint32(m.advertisedRx / time.Microsecond),
		Poll: m.polling && !m.finalDue, Final: m.finalDue,
	}
	m.finalDue = false
	return p
}

// receive applies a valid packet from the peer (6.8.6); it says whether
// the state changed.
func (m *machine) receive(p packet, now time.Time) bool {
	if p.YourDisc != 0 && p.YourDisc != m.myDisc {
		return false
	}
	m.remoteDisc = p.MyDisc
	m.remoteState = p.State
	m.remoteMinTx = time.Duration(p.DesiredMinTx) * time.Microsecond
	m.remoteMinRx = time.Duration(p.RequiredMinRx) * time.Microsecond
	m.remoteMult = p.DetectMult
	m.heard = true
	if p.Final && m.polling {
		m.polling = false
		m.txInUse, m.rxInUse = m.advertisedTx, m.advertisedRx
	}
	if p.Poll {
		m.finalDue = true
	}
	before := m.state
	if m.state == AdminDown {
		return false
	}
	switch {
	case p.State == AdminDown:
		if m.state != Down {
			m.down(DiagNeighborDown, now)
		}
	case m.state == Down && p.State == Down:
		m.set(Init, now)
	case m.state == Down && p.State == Init, m.state == Init && (p.State == Init || p.State == Up):
		m.diag = DiagNone
		m.set(Up, now)
	case m.state == Up && p.State == Down:
		m.down(DiagNeighborDown, now)
	}
	if m.state == Init || m.state == Up {
		m.detectBy = now.Add(m.detectionTime())
	}
	return m.state != before
}

// expire ends the session if its detection time has passed; it says
// whether it did.
func (m *machine) expire(now time.Time) bool {
	if m.detectBy.IsZero() || now.Before(m.detectBy) {
		return false
	}
	m.down(DiagDetectionExpired, now)
	// The peer is forgotten: it may have restarted with a new
	// discriminator (6.8.1).
	m.remoteDisc, m.remoteMinRx = 0, time.Microsecond
	if m.profile.Passive {
		m.remoteMinRx = 0
	}
	return true
}

func (m *machine) down(d Diag, now time.Time) {
	m.diag = d
	m.set(Down, now)
}

func (m *machine) set(s State, now time.Time) {
	m.state = s
	m.lastStateTime = now
	if s == Down || s == AdminDown {
		m.detectBy = time.Time{}
		m.polling = false
	}
	m.renegotiate()
}

// adminDown stops the session: it tells the peer so, which takes the
// peer's side down without waiting for detection (6.8.16).
func (m *machine) adminDown(now time.Time) {
	m.diag = DiagAdminDown
	m.set(AdminDown, now)
}
