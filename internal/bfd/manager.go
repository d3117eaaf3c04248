package bfd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The ports of RFC 5881 4 and RFC 5883 5, and the source ports a session
// sends from.
const (
	SingleHopPort  = 3784
	MultiHopPort   = 4784
	sourcePortLow  = 49152
	sourcePortHigh = 65535
)

// Status is a session as it stands.
type Status struct {
	Peer     netip.Addr
	MultiHop bool
	State    State
	// Usable is what onChange last said of the peer.
	Usable bool
	// Diagnostic says why the session last left Up.
	Diagnostic Diag
	// PeerAdminDown: the session is Down because the peer said
	// AdminDown, taking BFD away on purpose. Its path is not known to
	// have failed, so that is neither reported unusable nor a flap (RFC
	// 5882 3.2).
	PeerAdminDown bool
	// Flaps counts the times it went down after Up, the peer's AdminDown
	// aside.
	Flaps int
	// HoldDown is how long the session must stay Up, once Up again,
	// before it is usable: the damping of its recent flaps.
	HoldDown   time.Duration
	LastChange time.Time
	// DetectTime is the negotiated detection time; 0 while not Up.
	DetectTime time.Duration
}

// Manager runs a set of sessions, one goroutine each, on shared listening
// sockets.
type Manager struct {
	log    *slog.Logger
	events *queue
	// clock times every session: the real one, but for tests.
	clock clock

	mu        sync.Mutex
	closed    bool
	sessions  map[key]*runner
	byDisc    map[uint32]*runner
	listeners map[listenKey]*net.UDPConn
	wg        sync.WaitGroup

	// listenPorts and peerPorts are the single-hop and multi-hop ports
	// this end listens on and sends to: the RFCs' ports, but for tests
	// that run two ends in one network namespace.
	listenPorts, peerPorts [2]int
}

type key struct {
	peer     netip.Addr
	multiHop bool
}

type listenKey struct {
	multiHop bool
	ipv4     bool
}

// New returns a manager with no sessions. onChange is called serially,
// from one goroutine of the manager, with a peer's usable state: false the
// moment a session that was Up leaves Up (its detection time passed, or
// the peer said Down), true once it is Up again and has stayed so for the
// damping hold-down (see damping). false is never said of a session that
// was never Up: a peer without BFD running is not taken for dead; nor of
// a session removed by Set or Close, nor of one whose peer said AdminDown
// (it took BFD away: RFC 5882 3.2).
func New(log *slog.Logger, onChange func(peer netip.Addr, usable bool)) *Manager {
	return &Manager{
		log: log, events: newQueue(onChange), clock: realClock{},
		sessions: map[key]*runner{}, byDisc: map[uint32]*runner{}, listeners: map[listenKey]*net.UDPConn{},
		listenPorts: [2]int{SingleHopPort, MultiHopPort}, peerPorts: [2]int{SingleHopPort, MultiHopPort},
	}
}

// hop indexes listenPorts and peerPorts.
func hop(s Session) int {
	if s.MultiHop {
		return 1
	}
	return 0
}

func keyOf(s Session) key { return key{s.Peer, s.MultiHop} }

// Set makes the manager run exactly these sessions: new ones start, gone
// ones end with AdminDown sent to their peer, and a changed profile is
// agreed with the peer by a Poll sequence without the session going down.
// A session that cannot be set up is left out, and the error says which;
// one already running that is given a bad setting runs on as it was.
func (m *Manager) Set(sessions []Session) error {
	want := map[key]Session{}
	// refused are sessions asked for with a bad setting: one already
	// running goes on as it was, so a mistake does not take it down.
	refused := map[key]bool{}
	var errs []error
	for _, s := range sessions {
		if err := s.validate(); err != nil {
			errs = append(errs, err)
			refused[keyOf(s)] = true
			continue
		}
		want[keyOf(s)] = s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("bfd: manager closed")
	}
	for k, r := range m.sessions {
		if refused[k] {
			delete(want, k)
			continue
		}
		if s, ok := want[k]; !ok || s.Local != r.cfg.Local || s.Interface != r.cfg.Interface {
			m.remove(k, r)
		}
	}
	for k, s := range want {
		if r, ok := m.sessions[k]; ok {
			r.setProfile(s.Profile)
			continue
		}
		if err := m.listen(s); err != nil {
			errs = append(errs, err)
			continue
		}
		r, err := m.start(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.sessions[k] = r
		m.byDisc[r.disc] = r
	}
	return errors.Join(errs...)
}

// remove ends a session; m.mu is held.
func (m *Manager) remove(k key, r *runner) {
	delete(m.sessions, k)
	delete(m.byDisc, r.disc)
	r.stop()
}

// Status is every session, ordered by peer.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	var out []Status
	for _, r := range m.sessions {
		out = append(out, r.snapshot())
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Status) int { return a.Peer.Compare(b.Peer) })
	return out
}

// Close sends AdminDown to every peer, so that each takes its side down
// at once rather than at its detection time, and stops.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	for k, r := range m.sessions {
		m.remove(k, r)
	}
	for _, l := range m.listeners {
		l.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.events.close()
}

// newDisc is a discriminator no session of the manager has; m.mu is held.
func (m *Manager) newDisc() uint32 {
	for {
		if d := rand.Uint32(); d != 0 && m.byDisc[d] == nil {
			return d
		}
	}
}

// listen opens the socket the session's packets arrive on, once per port
// and family; m.mu is held.
func (m *Manager) listen(s Session) error {
	lk := listenKey{multiHop: s.MultiHop, ipv4: s.Peer.Is4()}
	if m.listeners[lk] != nil {
		return nil
	}
	port := strconv.Itoa(m.listenPorts[hop(s)])
	network, addr := "udp6", "[::]:"+port
	if lk.ipv4 {
		network, addr = "udp4", "0.0.0.0:"+port
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return setsockopt(c, func(fd int) error {
			if lk.ipv4 {
				return syscall.SetsockoptInt(fd, syscall.IPPROTO_IP, syscall.IP_RECVTTL, 1)
			}
			if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_RECVPKTINFO, 1); err != nil {
				return err
			}
			return syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_RECVHOPLIMIT, 1)
		})
	}}
	pc, err := lc.ListenPacket(context.Background(), network, addr)
	if err != nil {
		return fmt.Errorf("bfd: listen on %s: %w", addr, err)
	}
	conn := pc.(*net.UDPConn)
	m.listeners[lk] = conn
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.receive(conn, lk.multiHop)
	}()
	return nil
}

// receive reads one listening socket until it is closed, and hands each
// valid packet to its session.
func (m *Manager) receive(conn *net.UDPConn, multiHop bool) {
	buf := make([]byte, 1500)
	oob := make([]byte, 128)
	for {
		n, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			m.log.Debug("BFD receive failed", "err", err)
			continue
		}
		p, err := parse(buf[:n])
		if err != nil {
			m.log.Debug("BFD packet dropped", "from", from, "err", err)
			continue
		}
		ttl, ok, link := received(oob[:oobn])
		r := m.lookup(p, from.Addr(), link, multiHop)
		if r == nil {
			continue
		}
		// GTSM (RFC 5881 5, RFC 5883 2): a single-hop packet must come
		// from the link, one not from farther than allowed.
		if !ok || (!multiHop && ttl != 255) || (multiHop && ttl < int(r.minTTL.Load())) {
			m.log.Debug("BFD packet dropped for its TTL", "from", from, "ttl", ttl)
			continue
		}
		r.deliver(p)
	}
}

// lookup finds a packet's session: by its Your Discriminator, or, while
// the peer does not know ours yet, by its source address; link is the
// index of the device it came in on, 0 if unknown.
func (m *Manager) lookup(p packet, from netip.Addr, link int, multiHop bool) *runner {
	m.mu.Lock()
	defer m.mu.Unlock()
	from = from.Unmap()
	if p.YourDisc != 0 {
		// The discriminator picks the session (RFC 5880 6.8.6), and only
		// a packet from its peer, on its port, may speak for it: the
		// other port's TTL rule is not the session's.
		if r := m.byDisc[p.YourDisc]; r != nil && r.sentBy(from, link, multiHop) {
			return r
		}
		return nil
	}
	for _, r := range m.sessions {
		if r.sentBy(from, link, multiHop) {
			return r
		}
	}
	return nil
}

// sentBy says whether a packet from addr, arrived on the device of index
// link, on a port of multiHop, is from the session's peer: the same
// address and, for a link-local one, the same link, since unnumbered links
// often give every router the same link-local address. Links are compared
// by index: a device's name is only known in its network namespace.
func (r *runner) sentBy(from netip.Addr, link int, multiHop bool) bool {
	if r.cfg.MultiHop != multiHop || r.cfg.Peer.WithZone("") != from.WithZone("") {
		return false
	}
	return r.link == 0 || link == 0 || link == r.link
}

// received reads the TTL (hop limit) of a received packet and, for IPv6,
// the index of the device it came in on.
func received(oob []byte) (ttl int, ok bool, link int) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false, 0
	}
	for _, msg := range msgs {
		switch {
		case len(msg.Data) < 1:
		case (msg.Header.Level == syscall.IPPROTO_IP && msg.Header.Type == syscall.IP_TTL) ||
			(msg.Header.Level == syscall.IPPROTO_IPV6 && msg.Header.Type == syscall.IPV6_HOPLIMIT):
			ttl, ok = int(msg.Data[0]), true // an int in host order; TTLs fit its low byte
		case msg.Header.Level == syscall.IPPROTO_IPV6 && msg.Header.Type == syscall.IPV6_PKTINFO && len(msg.Data) >= 20:
			// struct in6_pktinfo: the address, then the index in host order.
			link = int(binary.NativeEndian.Uint32(msg.Data[16:20]))
		}
	}
	return ttl, ok, link
}

func setsockopt(c syscall.RawConn, f func(fd int) error) error {
	var err error
	if cerr := c.Control(func(fd uintptr) { err = f(int(fd)) }); cerr != nil {
		return cerr
	}
	return err
}

// dial opens the socket a session sends from: a source port of RFC 5881's
// range, TTL 255, bound to the session's device and address if it has
// them.
func dial(s Session) (*net.UDPConn, error) {
	network := "udp6"
	if s.Peer.Is4() {
		network = "udp4"
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return setsockopt(c, func(fd int) error {
			if s.Interface != "" {
				if err := syscall.SetsockoptString(fd, syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, s.Interface); err != nil {
					return fmt.Errorf("bind to %s: %w", s.Interface, err)
				}
			}
			if s.Peer.Is4() {
				return syscall.SetsockoptInt(fd, syscall.IPPROTO_IP, syscall.IP_TTL, 255)
			}
			return syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_UNICAST_HOPS, 255)
		})
	}}
	local := ""
	if s.Local.IsValid() {
		local = s.Local.String()
	}
	var err error
	for range 32 {
		port := sourcePortLow + rand.IntN(sourcePortHigh-sourcePortLow+1)
		var pc net.PacketConn
		pc, err = lc.ListenPacket(context.Background(), network, net.JoinHostPort(local, strconv.Itoa(port)))
		if err == nil {
			return pc.(*net.UDPConn), nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("bfd: session with %s: %w", s.Peer, err)
}
