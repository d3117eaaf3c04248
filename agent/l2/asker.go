package l2

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/internal/recv"
	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// DefaultTTL is the lease life assumed until the server says its own.
const DefaultTTL = 600 * time.Millisecond

// Asker keeps this node's L2 leases with the server that decides the
// owners (AgentService.Leases): it asks a few times a lease's life, and
// at once when the server says so or when it gave a lease up, noting when
// it asked; it hands what it is granted to Leases, which answers for it
// until the lease ends by the node's own clock. It watches the node's
// state (a syncer observer) for the L2 addresses and where to answer
// them, and tells the server which it cannot answer for.
//
// Stopping (ctx ends: SIGTERM) gives every lease up and says so, so that
// another node takes the addresses at once.
type Asker struct {
	conn   grpc.ClientConnInterface
	node   string
	leases *Leases
	clk    clock.WithTicker
	log    *slog.Logger

	changed notify.Kick // what the node cannot answer for changed

	// mu guards the fields below and is a leaf: the Asker holds no other
	// lock under it, and calls its Leases outside it (the package's lock
	// order is at Leases).
	mu    sync.Mutex
	pools []datapath.L2Pool
	// asked are the L2 load-balancer IPs each service of the node's state
	// has, and askers how many services have each: kept per service, so
	// that a change costs the services it names.
	asked   map[datapath.ServiceKey][]netip.Addr
	askers  map[netip.Addr]int
	addrs   []netip.Addr            // the L2 load-balancer IPs of the node's state, sorted
	ifaces  map[netip.Addr][]string // where each is answered
	refused map[netip.Addr]string   // those that cannot be, and why
	// serving are, per service of the state received, its L2 addresses
	// this node can serve (a Local service's only with a ready endpoint
	// here), and servers how many services serve each; applied is that
	// set as of the last state applied: what the node may take over.
	serving map[datapath.ServiceKey][]netip.Addr
	servers map[netip.Addr]int
	applied map[netip.Addr]bool
}

// NewAsker asks over conn (its own connection: it moves to the replica
// that leads, whatever replica the node's state comes from).
func NewAsker(conn grpc.ClientConnInterface, node string, leases *Leases, clk clock.WithTicker, log *slog.Logger) *Asker {
	return &Asker{conn: conn, node: node, leases: leases, clk: clk, log: log,
		asked: map[datapath.ServiceKey][]netip.Addr{}, askers: map[netip.Addr]int{},
		serving: map[datapath.ServiceKey][]netip.Addr{}, servers: map[netip.Addr]int{}, applied: map[netip.Addr]bool{}}
}

// Received takes the node's new state (syncer.Observer): only the
// services st.Changed names, unless it is nil or the L2 pools changed.
func (a *Asker) Received(st datapath.NodeState) {
	a.mu.Lock()
	samePools := slices.EqualFunc(st.Node.L2Pools, a.pools, datapath.L2Pool.Equal)
	moved := false // an address gained its first service or lost its last
	ask := func(key datapath.ServiceKey, svc *datapath.Service) {
		for _, vip := range a.asked[key] {
			if a.askers[vip]--; a.askers[vip] == 0 {
				delete(a.askers, vip)
				moved = true
			}
		}
		for _, vip := range a.serving[key] {
			if a.servers[vip]--; a.servers[vip] == 0 {
				delete(a.servers, vip)
			}
		}
		delete(a.asked, key)
		delete(a.serving, key)
		if svc == nil || svc.OtherController {
			return // its controller answers for it
		}
		var vips, serves []netip.Addr
		for _, vip := range svc.LoadBalancerIPs {
			if _, ok := st.Node.L2PoolOf(vip); ok {
				vips = append(vips, vip)
				if a.askers[vip]++; a.askers[vip] == 1 {
					moved = true
				}
				if ready, _, _ := svc.LocalCounts(vip.Is6()); svc.ExternalTrafficPolicy != datapath.Local || ready > 0 {
					serves = append(serves, vip)
					a.servers[vip]++
				}
			}
		}
		if vips != nil {
			a.asked[key] = vips
		}
		if serves != nil {
			a.serving[key] = serves
		}
	}
	if st.Changed == nil || !samePools {
		a.asked, a.askers = map[datapath.ServiceKey][]netip.Addr{}, map[netip.Addr]int{}
		a.serving, a.servers = map[datapath.ServiceKey][]netip.Addr{}, map[netip.Addr]int{}
		for key, svc := range st.Services {
			ask(key, svc)
		}
		moved = true
	} else {
		for _, key := range st.Changed {
			ask(key, st.Services[key])
		}
	}
	addrs := a.addrs
	if moved {
		addrs = slices.SortedFunc(maps.Keys(a.askers), netip.Addr.Compare)
	}
	same := slices.Equal(addrs, a.addrs) && samePools
	a.pools, a.addrs = st.Node.L2Pools, addrs
	a.mu.Unlock()
	if !same {
		a.resolve()
	}
}

// Applied takes the addresses the node serves in the state received as
// those of the state applied (the syncer applies what it last received),
// and tells the server when they changed.
func (a *Asker) Applied(time.Duration) {
	a.mu.Lock()
	same := len(a.servers) == len(a.applied)
	if same {
		for vip := range a.servers {
			if !a.applied[vip] {
				same = false
				break
			}
		}
	}
	if !same {
		a.applied = map[netip.Addr]bool{}
		for vip := range a.servers {
			a.applied[vip] = true
		}
	}
	a.mu.Unlock()
	if !same {
		a.changed.Kick()
	}
}

// Report: the Asker reports nothing through the syncer.
func (a *Asker) Report(bool) *report.Report { return nil }

// answerableLocked is what the node can answer for now: the addresses of
// the state it applied that it serves, and has an interface for.
func (a *Asker) answerableLocked() []netip.Addr {
	var out []netip.Addr
	for vip := range a.ifaces {
		if a.applied[vip] {
			out = append(out, vip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// resolve finds the interfaces of every L2 address, and signals a
// change of what the node cannot answer for.
func (a *Asker) resolve() {
	a.mu.Lock()
	pools, addrs := a.pools, a.addrs
	a.mu.Unlock()
	ifaces, refused := map[netip.Addr][]string{}, map[netip.Addr]string{}
	links, err := localLinks()
	for _, addr := range addrs {
		pool, _ := datapath.NodeInfo{L2Pools: pools}.L2PoolOf(addr)
		names, why := interfacesFor(addr, pool.Interfaces, links, err)
		if why != "" {
			refused[addr] = why
			continue
		}
		ifaces[addr] = names
	}
	a.mu.Lock()
	changed := !maps.Equal(refused, a.refused) || !maps.EqualFunc(ifaces, a.ifaces, slices.Equal)
	a.ifaces, a.refused = ifaces, refused
	a.mu.Unlock()
	if changed {
		a.changed.Kick()
	}
}

// localLink is one of the node's interfaces with its subnets.
type localLink struct {
	name    string
	subnets []netip.Prefix
}

func localLinks() ([]localLink, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []localLink
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		l := localLink{name: ifi.Name}
		addrs, _ := ifi.Addrs()
		for _, ad := range addrs {
			if n, ok := ad.(*net.IPNet); ok {
				if p, err := netip.ParsePrefix(n.String()); err == nil {
					l.subnets = append(l.subnets, p.Masked())
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// interfacesFor is where addr is answered: the pool's interfaces, each of
// which must exist, or else every interface whose subnet holds addr; or
// why it cannot be answered.
func interfacesFor(addr netip.Addr, named []string, links []localLink, linkErr error) ([]string, string) {
	if linkErr != nil {
		return nil, "listing the node's interfaces: " + linkErr.Error()
	}
	if len(named) > 0 {
		for _, n := range named {
			if !slices.ContainsFunc(links, func(l localLink) bool { return l.name == n }) {
				return nil, fmt.Sprintf("the node has no interface %q", n)
			}
		}
		return named, ""
	}
	var out []string
	for _, l := range links {
		if slices.ContainsFunc(l.subnets, func(p netip.Prefix) bool { return p.Contains(addr) }) {
			out = append(out, l.name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Sprintf("no interface of the node has a subnet that holds %s (name the interfaces in the pool's l2_advertisement)", addr)
	}
	return out, ""
}

// wanted reports whether the node's state has L2 addresses.
func (a *Asker) wanted() bool {
	a.mu.Lock()
	has := len(a.addrs) > 0
	a.mu.Unlock()
	return has || len(a.leases.Holding()) > 0
}

// Run keeps the leases until ctx ends, then gives them up.
func (a *Asker) Run(ctx context.Context) {
	// Back soon after a server is: a lease cannot wait long.
	retry := dial.NewReconnect(a.conn, 500*time.Millisecond)
	resolveEvery := a.clk.NewTicker(5 * time.Second)
	defer resolveEvery.Stop()
	for {
		for !a.wanted() {
			select {
			case <-ctx.Done():
				return
			case <-a.changed.C():
			case <-resolveEvery.C():
			}
		}
		server := retry.Server()
		granted, err := a.session(ctx, retry.WaitForReady())
		if ctx.Err() != nil {
			return
		}
		wait := retry.Ended(err, granted)
		a.log.Debug("L2 lease stream ended", "server", server, "error", err, "next", retry.Server(), "retry_in", wait)
		select {
		case <-ctx.Done():
			a.leases.Close()
			return
		case <-a.clk.After(wait):
		}
	}
}

// session runs one Leases stream; granted reports whether the server
// answered at all.
func (a *Asker) session(ctx context.Context, waitForReady bool) (granted bool, err error) {
	// The stream outlives ctx by the time it takes to give the leases up.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := weirv1.NewAgentServiceClient(a.conn).Leases(sctx, grpc.WaitForReady(waitForReady))
	if err != nil {
		return false, err
	}
	s := &leaseSession{a: a, stream: stream, asked: map[uint64]time.Time{}, ttl: DefaultTTL}
	grants, recvErr := recv.Pump(sctx, stream.Recv, 16)
	if err := s.ask(); err != nil {
		return false, recv.SendError(sctx, err, grants, recvErr)
	}
	s.tick = a.clk.NewTicker(s.ttl / 4)
	defer func() { s.tick.Stop() }()
	resolveEvery := a.clk.NewTicker(5 * time.Second)
	defer resolveEvery.Stop()
	for {
		select {
		case <-ctx.Done():
			s.stop(grants, recvErr, 2*s.ttl)
			return s.granted, ctx.Err()
		case err := <-recvErr:
			return s.granted, err
		case <-s.tick.C():
			err = s.ask()
		case <-a.changed.C():
			err = s.ask()
		case <-resolveEvery.C():
			a.resolve()
		case g := <-grants:
			err = s.received(g)
		}
		if err != nil {
			return s.granted, recv.SendError(ctx, err, grants, recvErr)
		}
	}
}

// leaseSession is one Leases stream: the asks not yet answered, the
// leases given up and not yet told, and the lease life the server says.
type leaseSession struct {
	a        *Asker
	stream   grpc.BidiStreamingClient[weirv1.LeasesRequest, weirv1.LeasesResponse]
	seq      uint64
	asked    map[uint64]time.Time // by sequence: when it was asked
	released []*weirv1.L2Lease
	// nudged is the last request to ask received, echoed in every ask.
	nudged uint64
	// answerable is what the stream was last told the node can answer
	// for (nil before the first ask).
	answerable []netip.Addr
	ttl        time.Duration
	tick       clock.Ticker // asks a few times a lease's life
	stopping   bool
	granted    bool // the server answered at all
}

// ask sends what the node holds, has lost, cannot answer for and gave up.
func (s *leaseSession) ask() error {
	a := s.a
	s.seq++
	// The lease counts from before the ask leaves.
	s.asked[s.seq] = a.clk.Now()
	msg := &weirv1.LeasesRequest{NodeName: a.node, Sequence: s.seq, Released: s.released, Stopping: s.stopping, Nudged: s.nudged}
	for addr, epoch := range a.leases.Holding() {
		msg.Held = append(msg.Held, &weirv1.L2Lease{Address: addr.String(), Epoch: epoch})
	}
	for addr, epoch := range a.leases.Lapsed() {
		msg.Lapsed = append(msg.Lapsed, &weirv1.L2Lease{Address: addr.String(), Epoch: epoch})
	}
	a.mu.Lock()
	for addr, why := range a.refused {
		msg.Refused = append(msg.Refused, &weirv1.L2Refusal{Address: addr.String(), Reason: why})
	}
	answerable := a.answerableLocked()
	a.mu.Unlock()
	if s.answerable == nil || !slices.Equal(answerable, s.answerable) {
		msg.Answerable = &weirv1.L2Answerable{}
		for _, addr := range answerable {
			msg.Answerable.Addresses = append(msg.Answerable.Addresses, addr.String())
		}
	}
	if err := s.stream.Send(msg); err != nil {
		return err
	}
	s.released = nil
	if answerable == nil {
		answerable = []netip.Addr{}
	}
	s.answerable = answerable
	return nil
}

// received takes one answer: a grant to an ask, or a request to ask again
// (sequence 0).
func (s *leaseSession) received(g *weirv1.LeasesResponse) error {
	s.granted = true
	if g.GetSequence() == 0 {
		s.nudged = max(s.nudged, g.GetNudge())
		return s.ask()
	}
	at, ok := s.asked[g.GetSequence()]
	if !ok {
		return nil // answered already
	}
	for seq := range s.asked {
		if seq <= g.GetSequence() {
			delete(s.asked, seq)
		}
	}
	if d := g.GetTtl().AsDuration(); d > 0 && d != s.ttl {
		s.ttl = d
		s.tick.Stop()
		s.tick = s.a.clk.NewTicker(s.ttl / 4)
	}
	s.released = append(s.released, s.a.take(g, at, s.ttl)...)
	if len(s.released) > 0 {
		return s.ask()
	}
	return nil
}

// stop hands every lease over, then ends the stream. It says it is
// stopping and keeps answering for each address the server still lists,
// giving each up as the answers drop it (its next owner can take it), so
// that a planned stop leaves no address unanswered for longer than the
// handover itself. After within (two leases' life: the server is away,
// or the next owner's stream slow), it gives the rest up at once.
func (s *leaseSession) stop(grants <-chan *weirv1.LeasesResponse, recvErr <-chan error, within time.Duration) {
	a := s.a
	s.stopping = true
	held := len(a.leases.Holding())
	deadline := a.clk.After(within)
	err := s.ask()
handing:
	for err == nil && len(a.leases.Holding()) > 0 {
		select {
		case g := <-grants:
			err = s.received(g) // tells the server of what it gave up
		case <-s.tick.C():
			err = s.ask()
		case err = <-recvErr:
		case <-deadline:
			break handing
		}
	}
	handedOver := held - len(a.leases.Holding())
	for addr := range a.leases.Holding() {
		if epoch, ok := a.leases.Release(addr); ok {
			s.released = append(s.released, &weirv1.L2Lease{Address: addr.String(), Epoch: epoch})
		}
	}
	a.leases.Close()
	gaveUp := len(s.released)
	if err == nil && gaveUp > 0 {
		err = s.ask()
	}
	if err == nil && len(s.asked) > 0 {
		s.awaitAnswer(grants, recvErr)
	}
	a.log.Info("stopping: handed the L2 leases over", "handed_over", handedOver, "given_up_at_once", gaveUp)
	s.stream.CloseSend()
}

// awaitAnswer waits, a second at most, for the answer to the last ask:
// the server has read the release once it answers it (an answer to an
// earlier one may come first), and until then the stream must stay, or
// the ask may be lost with it.
func (s *leaseSession) awaitAnswer(grants <-chan *weirv1.LeasesResponse, recvErr <-chan error) {
	deadline := time.After(time.Second)
	for {
		select {
		case g := <-grants:
			if g.GetSequence() == s.seq {
				return
			}
		case <-recvErr:
			return
		case <-deadline:
			s.a.log.Warn("stopping: the server did not confirm that the L2 leases were given up; they end with their lease")
			return
		}
	}
}

// take hands a grant to the leases, asked at at: the leases it lists are
// held from at for ttl, every other is given up at once (and returned, to
// tell the server).
func (a *Asker) take(g *weirv1.LeasesResponse, at time.Time, ttl time.Duration) (released []*weirv1.L2Lease) {
	listed := map[netip.Addr]bool{}
	for _, l := range g.GetLeases() {
		addr, err := netip.ParseAddr(l.GetAddress())
		if err != nil {
			continue
		}
		a.mu.Lock()
		ifaces, ok := a.ifaces[addr]
		a.mu.Unlock()
		if !ok {
			// Not answerable here (and refused in the next ask).
			released = append(released, &weirv1.L2Lease{Address: addr.String(), Epoch: l.GetEpoch()})
			continue
		}
		listed[addr] = true
		if err := a.leases.Granted(addr, l.GetEpoch(), at, ttl, ifaces); err != nil {
			a.log.Warn("answering for an L2 address", "address", addr, "error", err)
		}
	}
	for addr := range a.leases.Holding() {
		if listed[addr] {
			continue
		}
		if epoch, ok := a.leases.Release(addr); ok {
			released = append(released, &weirv1.L2Lease{Address: addr.String(), Epoch: epoch})
		}
	}
	return released
}
