// Package l2 answers ARP (IPv4) and NDP (IPv6) for the load-balancer
// addresses this node owns, on the interfaces it is told: what brings an
// address's traffic to a node on a segment without a router (MetalLB's
// L2 mode). The address is never assigned to an interface, so no other
// node's kernel answers for it; the node's rules take its packets.
//
// Which node owns an address is not decided here: the server decides and
// fences it. The Responder answers for what it is given, announces a
// takeover at once (gratuitous ARP, unsolicited neighbour advertisements,
// repeated so that switches and the clients' caches move), and stops
// answering for an address the moment it is taken away.
package l2

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// Announcements are when a takeover is announced, from the moment the
// address is given: at once, then repeated. A Linux client ignores an
// update to a neighbour entry younger than its locktime (1 s by
// default), so the repeats reach past it.
var Announcements = []time.Duration{0, 250 * time.Millisecond, 1100 * time.Millisecond, 2200 * time.Millisecond, 4400 * time.Millisecond}

// Owned is what the node answers for: per address, the interfaces.
type Owned map[netip.Addr][]string

// Responder answers for the owned addresses.
type Responder struct {
	log *slog.Logger

	// mu guards the fields below. It comes after Leases.mu in the lock
	// order (Leases.mu, then Responder.mu: the Leases set what is owned
	// under their lock), so valid, which takes the Leases', is called
	// outside it.
	mu     sync.Mutex
	owned  map[netip.Addr]map[string]bool // address → interfaces
	valid  func(netip.Addr) bool          // see Valid
	since  map[given]time.Time            // when each address was given on each interface
	links  map[string]*link               // by interface name
	closed bool
	wg     sync.WaitGroup
	cancel context.CancelFunc
	ctx    context.Context
}

// given is an address on one interface.
type given struct {
	addr  netip.Addr
	iface string
}

// link is one interface's listeners.
type link struct {
	ifi *net.Interface
	arp *arp.Client // nil without an IPv4 address
	ndp *ndp.Conn   // nil without a link-local IPv6 address
	// groups are the solicited-node multicast groups joined, by address.
	groups map[netip.Addr]netip.Addr
}

// New is a Responder that answers for nothing yet.
func New(log *slog.Logger) *Responder {
	ctx, cancel := context.WithCancel(context.Background())
	return &Responder{log: log, owned: map[netip.Addr]map[string]bool{}, since: map[given]time.Time{},
		links: map[string]*link{}, ctx: ctx, cancel: cancel}
}

// Set makes owned what the node answers for, at once: an address taken
// away is no longer answered, a new one is announced. Sockets for new
// interfaces are opened in the caller's network namespace. An interface
// that cannot be opened is an error naming it; the others still apply.
func (r *Responder) Set(owned Owned) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("l2: responder closed")
	}
	next := map[netip.Addr]map[string]bool{}
	var errs []error
	for a, ifaces := range owned {
		for _, name := range ifaces {
			l, err := r.linkLocked(name, a.Is6())
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if next[a] == nil {
				next[a] = map[string]bool{}
			}
			next[a][name] = true
			if a.Is6() && l.groups[a] == (netip.Addr{}) {
				group, err := ndp.SolicitedNodeMulticast(a)
				if err == nil {
					err = l.ndp.JoinGroup(group)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("l2: %s: join the solicited-node group of %s: %w", name, a, err))
					continue
				}
				l.groups[a] = group
			}
		}
	}
	// Gone from an interface: its multicast group is left there.
	for name, l := range r.links {
		for a, group := range l.groups {
			if !next[a][name] {
				l.ndp.LeaveGroup(group)
				delete(l.groups, a)
			}
		}
	}
	for a, now := range next {
		was := r.owned[a]
		if len(was) == 0 {
			r.log.Info("answering ARP and NDP for an L2 address", "address", a)
		}
		for name := range now {
			if !was[name] {
				r.since[given{a, name}] = time.Now()
				r.announce(a, name)
			}
		}
	}
	for a := range r.owned {
		if len(next[a]) == 0 {
			r.log.Info("no longer answering for an L2 address", "address", a)
		}
	}
	for g := range r.since {
		if !next[g.addr][g.iface] {
			delete(r.since, g)
		}
	}
	r.owned = next
	return errors.Join(errs...)
}

// owns tells whether the node answers for a on interface name now: it
// was given a, and its lease (Valid) still runs at this moment, whenever
// the owner's timer takes it away.
func (r *Responder) owns(a netip.Addr, name string) bool {
	r.mu.Lock()
	given := r.owned[a][name]
	valid := r.valid
	r.mu.Unlock()
	// Outside the lock: valid takes the owner's own.
	return given && (valid == nil || valid(a))
}

// Valid makes the Responder check, right before every answer and
// announcement, that valid(addr) holds: the owner's lease runs. A late
// timer (a loaded node) then cannot stretch an answer past the lease.
func (r *Responder) Valid(valid func(netip.Addr) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.valid = valid
}

// linkLocked opens the interface's listener for the family, if not yet.
// Called with mu held.
func (r *Responder) linkLocked(name string, v6 bool) (*link, error) {
	l := r.links[name]
	if l == nil {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return nil, fmt.Errorf("l2: interface %q: %w", name, err)
		}
		l = &link{ifi: ifi, groups: map[netip.Addr]netip.Addr{}}
		r.links[name] = l
	}
	switch {
	case !v6 && l.arp == nil:
		c, err := arp.Dial(l.ifi)
		if err != nil {
			return nil, fmt.Errorf("l2: answer ARP on %s: %w", name, err)
		}
		l.arp = c
		r.wg.Add(1)
		go r.answerARP(l)
	case v6 && l.ndp == nil:
		c, _, err := ndp.Listen(l.ifi, ndp.LinkLocal)
		if err != nil {
			return nil, fmt.Errorf("l2: answer NDP on %s: %w", name, err)
		}
		l.ndp = c
		r.wg.Add(1)
		go r.answerNDP(l)
	}
	return l, nil
}

// answerARP replies to every request for an owned address on l.
func (r *Responder) answerARP(l *link) {
	defer r.wg.Done()
	for {
		p, _, err := l.arp.Read()
		if err != nil {
			if r.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a frame that does not parse
		}
		if p.Operation != arp.OperationRequest || !r.owns(p.TargetIP, l.ifi.Name) {
			continue
		}
		if err := l.arp.Reply(p, l.ifi.HardwareAddr, p.TargetIP); err != nil {
			r.log.Warn("ARP reply failed", "address", p.TargetIP, "interface", l.ifi.Name, "error", err)
		}
	}
}

// answerNDP answers every neighbour solicitation for an owned address on l.
func (r *Responder) answerNDP(l *link) {
	defer r.wg.Done()
	for {
		m, _, from, err := l.ndp.ReadFrom()
		if err != nil {
			if r.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ns, ok := m.(*ndp.NeighborSolicitation)
		if !ok || !r.owns(ns.TargetAddress, l.ifi.Name) {
			continue
		}
		na := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: ns.TargetAddress,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: l.ifi.HardwareAddr}}}
		to := from
		if from.IsUnspecified() {
			// Duplicate address detection: answer every node (RFC 4861 7.2.4).
			to, na.Solicited = netip.IPv6LinkLocalAllNodes(), false
		}
		if err := l.ndp.WriteTo(na, nil, to); err != nil {
			r.log.Warn("neighbour advertisement failed", "address", ns.TargetAddress, "interface", l.ifi.Name, "error", err)
		}
	}
}

// announce sends, at each of Announcements from now, a gratuitous ARP
// or an unsolicited neighbour advertisement for a on interface name, as
// long as the node still owns it there. Called with mu held.
func (r *Responder) announce(a netip.Addr, name string) {
	key := given{a, name}
	at0 := r.since[key]
	l := r.links[name]
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for _, at := range Announcements {
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(time.Until(at0.Add(at))):
			}
			r.mu.Lock()
			still := r.since[key].Equal(at0)
			r.mu.Unlock()
			if !still || !r.owns(a, name) {
				return
			}
			if err := l.unsolicited(a); err != nil {
				r.log.Warn("announcing an address failed", "address", a, "interface", name, "error", err)
			}
		}
	}()
}

// unsolicited tells the segment that a is at this interface.
func (l *link) unsolicited(a netip.Addr) error {
	if a.Is4() {
		// An ARP reply to broadcast: Linux updates an existing entry
		// from it whatever its arp_accept.
		p, err := arp.NewPacket(arp.OperationReply, l.ifi.HardwareAddr, a, ethernet.Broadcast, a)
		if err != nil {
			return err
		}
		return l.arp.WriteTo(p, ethernet.Broadcast)
	}
	na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: a,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: l.ifi.HardwareAddr}}}
	return l.ndp.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
}

// Close stops answering and releases the sockets.
func (r *Responder) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.owned = map[netip.Addr]map[string]bool{}
	r.cancel()
	for _, l := range r.links {
		if l.arp != nil {
			l.arp.Close()
		}
		if l.ndp != nil {
			l.ndp.Close()
		}
	}
	r.mu.Unlock()
	r.wg.Wait()
}
