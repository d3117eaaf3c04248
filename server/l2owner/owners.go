package l2owner

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/internal/notify"
)

// Owners is the server's side of the L2 leases. It chooses the owner of
// every L2 address (Assign) among the address's candidates that keep
// asking for their leases, answers the nodes' asks from its Table, and
// tells a node to ask at once when the node has just been chosen, when
// the lease it waits for becomes free, or when it must give one up.
//
// Only the server that decides the owners answers (Lead): a single
// server from its start, the leader among replicas while it leads. Each
// leadership starts a new Table, fenced as after a restart.
type Owners struct {
	clk         clock.Clock
	ttl, margin time.Duration
	log         *slog.Logger
	metrics     metrics

	mu         sync.Mutex
	table      *Table // nil while not leading
	candidates map[netip.Addr][]string
	// index numbers the candidates' nodes in name order; sets are each
	// address's candidates as a set of them (shared by the addresses
	// with the same candidates, never changed in place), and able, for
	// each address, the nodes whose stream says they can answer for it.
	// The choice works on these (see nodeset.go).
	index      nodeIndex
	sets, able map[netip.Addr]nodeSet
	owner      map[netip.Addr]string
	owned      map[string][]netip.Addr // owner by node, each sorted: an ask costs its node's addresses

	movedAt map[netip.Addr]time.Time // when the choice last changed, until granted
	// lapsed are the lapsed leases nodes claim on addresses the table
	// knows no lease on (the newest epoch's): the choice keeps them with
	// their nodes, as it keeps running leases with their holders.
	lapsed map[netip.Addr]claim
	// handing are the planned moves under way, by address: the holder
	// keeps answering until the chosen node has shown it can take over.
	// handingFrom and handingTo are their addresses by holder and by
	// chosen node, in address order, made again with every plan (an
	// address whose handover ended since is skipped): an ask costs its
	// node's handovers, not everyone's.
	handing                map[netip.Addr]*handover
	handingFrom, handingTo map[string][]netip.Addr
	streams                map[string]*Stream
	wake                   notify.Kick // the timer loop looks again
	// asked is broadcast when a stream's node asks for the first time
	// (Asked turns true): the leader's warm-up waits on it. Its lock is
	// taken under mu, never the other way round.
	asked notify.Signal
	// warm: the server has heard from the nodes (Lead's heard).
	warm bool
}

// CannotAnswer is why a node that said it cannot answer for an address
// (no such interface, no interface whose subnet holds it) is passed over.
const CannotAnswer = "CannotAnswer"

// MaxUnknownAnswerable bounds, per node, the addresses it says it can
// answer for that are no L2 address this server knows (yet).
const MaxUnknownAnswerable = 1024

// ErrNotLeading refuses a node's stream on a server that does not decide
// the owners.
var ErrNotLeading = errors.New("this server does not decide the L2 owners (it is not the leader)")

// NewOwners decides nothing until Lead; grants last ttl, and a lease that
// was not given up is given to another node margin after it ended. reg,
// when not nil, receives the metrics.
func NewOwners(clk clock.Clock, ttl, margin time.Duration, log *slog.Logger, reg prometheus.Registerer) *Owners {
	o := &Owners{clk: clk, ttl: ttl, margin: margin, log: log, candidates: map[netip.Addr][]string{},
		index: newNodeIndex(nil), sets: map[netip.Addr]nodeSet{}, able: map[netip.Addr]nodeSet{},
		owner: map[netip.Addr]string{}, movedAt: map[netip.Addr]time.Time{}, lapsed: map[netip.Addr]claim{}, handing: map[netip.Addr]*handover{},
		streams: map[string]*Stream{}}
	o.metrics = newMetrics(o, reg)
	return o
}

// metrics tell how often L2 addresses move and how long a move takes.
type metrics struct {
	changes  prometheus.Counter
	takeover prometheus.Histogram
}

func newMetrics(o *Owners, reg prometheus.Registerer) metrics {
	m := metrics{
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_l2_owner_changes_total",
			Help: "Leases on L2 addresses granted to a node that did not hold them (a first owner, a failover, a handover).",
		}),
		takeover: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weir_l2_takeover_duration_seconds",
			Help:    "From the server choosing a new owner for an L2 address (its owner failed, left or was drained) to granting it the lease; the node announces the address at once.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	addresses := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_l2_addresses_unanswered",
		Help: "L2 addresses no node holds a lease on now (on the server that decides the owners).",
	}, func() float64 {
		o.mu.Lock()
		defer o.mu.Unlock()
		n := 0
		for a := range o.candidates {
			if o.table == nil {
				break
			}
			if _, held := o.table.Holder(a); !held {
				n++
			}
		}
		return float64(n)
	})
	if reg != nil {
		reg.MustRegister(m.changes, m.takeover, addresses)
	}
	return m
}

// TTL is how long a grant lasts from the node's ask.
func (o *Owners) TTL() time.Duration { return o.ttl }

// Lead decides the owners until ctx ends, then closes every stream. Until
// heard is closed (the server has heard from the nodes) it moves no
// address: it renews the leases the nodes say they hold and grants
// nothing new.
func (o *Owners) Lead(ctx context.Context, heard <-chan struct{}) {
	o.mu.Lock()
	o.table = NewTable(o.clk, o.ttl, o.margin)
	o.owner = map[netip.Addr]string{}
	o.owned = map[string][]netip.Addr{}
	o.lapsed = map[netip.Addr]claim{}
	o.handing = map[netip.Addr]*handover{}
	o.handingFrom, o.handingTo = nil, nil
	o.warm = false
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.table = nil
		for _, s := range o.streams {
			o.setAnswerableLocked(s.node, s.answerable, nil)
			s.closeLocked()
		}
		o.streams = map[string]*Stream{}
		o.mu.Unlock()
	}()
	timer := o.clk.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		o.mu.Lock()
		next := o.tickLocked()
		o.mu.Unlock()
		timer.Stop()
		timer = o.clk.NewTimer(next)
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		case <-o.wake.C():
		case <-heard:
			heard = nil
			o.mu.Lock()
			o.warm = true
			o.assignLocked()
			o.mu.Unlock()
		}
	}
}

// SetCandidates gives the nodes that may own each L2 address now, by the
// cluster's rules (receive.L2Addresses); an address not given has no
// owner. It is given before the server has heard from the nodes too: the
// addresses alone then bound what a node may claim.
func (o *Owners) SetCandidates(c map[netip.Addr][]string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if maps.EqualFunc(c, o.candidates, slices.Equal) {
		return
	}
	o.candidates = c
	o.indexCandidatesLocked(c)
	for a := range o.movedAt {
		if _, ok := c[a]; !ok {
			delete(o.movedAt, a)
		}
	}
	for a, cl := range o.lapsed {
		if !o.mayClaimLocked(a, cl.node) {
			delete(o.lapsed, a)
		}
	}
	for _, st := range o.streams {
		maps.DeleteFunc(st.refused, func(a netip.Addr, _ string) bool { _, ok := c[a]; return !ok })
	}
	if o.table != nil {
		o.table.Forget(func(a netip.Addr) bool { _, ok := c[a]; return ok })
	}
	o.assignLocked()
}

// claim is a node's lapsed lease on an address.
type claim struct {
	node  string
	epoch uint64
}

// Stream is one node's open Leases stream.
type Stream struct {
	o       *Owners
	node    string
	shared  bool // opened on a credential every node may hold
	lastAsk time.Time
	// refused are the addresses the node cannot answer for, and why.
	refused map[netip.Addr]string
	// answerable are the addresses the node says it can answer for, once
	// it said (knowsAnswerable; an older agent never does).
	answerable      map[netip.Addr]bool
	knowsAnswerable bool
	// stopping: the node said it is going away.
	stopping bool
	nudge    notify.Kick
	// nudges counts the requests to ask; the node echoes the last it
	// received (Asked.Nudged).
	nudges uint64
	done   chan struct{}
	closed bool
}

// ErrNodeHasItsOwn refuses a stream opened on a credential every node may
// hold while the node has one open on its own.
var ErrNodeHasItsOwn = errors.New("the node has a stream open on its own credential; a shared one may not replace it")

// Open starts node's stream; a newer stream of the same node ends the
// older one, except that a stream on a credential every node may hold
// (shared) never ends one the node opened on its own: that would let any
// holder of the shared credential move the node's addresses.
func (o *Owners) Open(node string, shared bool) (*Stream, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.table == nil {
		return nil, ErrNotLeading
	}
	if old := o.streams[node]; old != nil {
		if shared && !old.shared {
			return nil, ErrNodeHasItsOwn
		}
		o.setAnswerableLocked(node, old.answerable, nil)
		old.closeLocked()
	}
	s := &Stream{o: o, node: node, shared: shared, done: make(chan struct{})}
	o.streams[node] = s
	return s, nil
}

// refusedOf is why the stream's node cannot answer for addr, if it
// said so (nil-safe).
func (s *Stream) refusedOf(addr netip.Addr) (string, bool) {
	if s == nil {
		return "", false
	}
	why, ok := s.refused[addr]
	return why, ok
}

// canAnswer: the node said it can answer for addr (its applied state
// serves it), or never says (an older agent).
func (s *Stream) canAnswer(addr netip.Addr) bool { return !s.knowsAnswerable || s.answerable[addr] }

// Asked reports whether node has asked on an open stream.
func (o *Owners) Asked(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.streams[node]
	return st != nil && !st.lastAsk.IsZero()
}

// AskedChanged is closed when a node asks on its stream for the first
// time (Asked turns true); take it before calling Asked.
func (o *Owners) AskedChanged() <-chan struct{} { return o.asked.Changed() }

// Nudged is signalled when the node should ask at once.
func (s *Stream) Nudged() <-chan struct{} { return s.nudge.C() }

// NudgeNumber is the number of the latest request to ask, for the node
// to echo (Asked.Nudged).
func (s *Stream) NudgeNumber() uint64 {
	s.o.mu.Lock()
	defer s.o.mu.Unlock()
	return s.nudges
}

// Done is closed when the stream ends on the server's side (another
// stream of the node, or the end of the leadership).
func (s *Stream) Done() <-chan struct{} { return s.done }

// Close ends the stream: the node is no longer a candidate for new
// leases, and those it holds end when they expire.
func (s *Stream) Close() {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.streams[s.node] == s {
		delete(o.streams, s.node)
		o.setAnswerableLocked(s.node, s.answerable, nil)
		o.assignLocked()
	}
	s.closeLocked()
}

func (s *Stream) closeLocked() {
	if !s.closed {
		s.closed = true
		close(s.done)
	}
}

// Held is a lease a node reports, by address and epoch.
type Held struct {
	Addr  netip.Addr
	Epoch uint64
}

// Grant is a lease held on an address.
type Grant struct {
	Addr netip.Addr
	Lease
}

// Asked is what a node says when it asks for its leases.
type Asked struct {
	// Held are the leases it holds; Released those it gave up since its
	// last ask; Lapsed those that ended while no server answered it.
	Held, Released, Lapsed []Held
	// Refused are the addresses it cannot answer for, whole, and why.
	Refused map[netip.Addr]string
	// Answerable, when HasAnswerable, are all the addresses it can answer
	// for now; otherwise the last it said stand.
	Answerable    []netip.Addr
	HasAnswerable bool
	// Nudged is the last request to ask the node received (NudgeNumber).
	Nudged uint64
}

// Ask is the node asking for its leases. The answer is every lease it
// holds from now on; any other it must stop answering for. An address
// released is not granted back in the same answer: the node gave it up
// for a reason (it was not listed, it is stopping).
func (s *Stream) Ask(q Asked) []Grant {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if s.closed || o.table == nil {
		return nil
	}
	if s.stopping {
		o.releaseLocked(s.node, q.Released)
		return o.handingOverLocked(s.node, q.Released)
	}
	if s.lastAsk.IsZero() {
		defer o.asked.Broadcast()
	}
	reassign := o.noteAskLocked(s, q)
	o.releaseLocked(s.node, q.Released)
	claims, adopted := o.claimLocked(s.node, q)
	if !o.warm {
		return o.grantClaimedLocked(s.node, claims)
	}
	if reassign || adopted {
		o.assignLocked()
	}
	o.readyLocked(s, q)
	return o.grantOwnedLocked(s.node, q.Released)
}

// handover is a planned move of an address (its holder still answers: a
// drain, a stopping agent, a rebalance, a Local service's endpoint gone):
// from keeps answering until to has asked since the move was planned,
// listing the address as one it can answer for (ready); then from is told
// to give it up, and to is granted it as soon as from has. to is empty
// while no candidate can answer for the address yet.
type handover struct {
	from, to string
	since    time.Time
	// nudge is the request to ask sent to to when the move was planned:
	// an agent that echoes nudges is ready only once it echoes this one,
	// so that an ask it sent before, held up on the way, proves nothing.
	nudge uint64
	ready bool
}

// planHandoversLocked starts a handover for every address whose holder
// can still answer for it while the chosen node is another, or none (no
// candidate can answer for it yet: the holder keeps it meanwhile), and
// drops those that no longer apply. An address no node may own any more
// (its service gone, no endpoint left for a Local one) is not kept.
func (o *Owners) planHandoversLocked(owner map[netip.Addr]string) {
	for a := range o.handing {
		if len(o.candidates[a]) == 0 {
			delete(o.handing, a)
		}
	}
	for a, cs := range o.candidates {
		to := owner[a]
		l, held := o.table.Holder(a)
		if !held || l.Node == to || len(cs) == 0 || !o.answersLocked(a, l.Node) {
			delete(o.handing, a)
			continue
		}
		if h := o.handing[a]; h != nil && h.from == l.Node && h.to == to {
			continue
		}
		h := &handover{from: l.Node, to: to, since: o.clk.Now()}
		if s := o.streams[to]; s != nil {
			o.nudgeLocked(to)
			h.nudge = s.nudges
		}
		o.handing[a] = h
		o.log.Info("L2 handover planned: the holder answers until the chosen node can take over", "address", a, "from", l.Node, "to", to)
	}
	o.handingFrom, o.handingTo = map[string][]netip.Addr{}, map[string][]netip.Addr{}
	for _, a := range slices.SortedFunc(maps.Keys(o.handing), netip.Addr.Compare) {
		h := o.handing[a]
		o.handingFrom[h.from] = append(o.handingFrom[h.from], a)
		o.handingTo[h.to] = append(o.handingTo[h.to], a)
	}
}

// answersLocked: node's stream is open and asked within a lease's life
// (stopping or not), and node did not say it cannot answer for addr.
func (o *Owners) answersLocked(addr netip.Addr, node string) bool {
	s := o.streams[node]
	if s == nil || s.closed || s.lastAsk.IsZero() || o.clk.Since(s.lastAsk) >= o.ttl {
		return false
	}
	_, refused := s.refusedOf(addr)
	return !refused
}

// readyLocked marks ready the handovers to s's node that its ask q
// (just taken) shows it can take, and nudges each holder to give its
// address up. The ask must answer the request to ask sent when the move
// was planned (an older agent's: come after it).
func (o *Owners) readyLocked(s *Stream, q Asked) {
	for _, a := range o.handingTo[s.node] {
		h := o.handing[a]
		if h == nil || h.to != s.node || h.ready || !s.canAnswer(a) {
			continue
		}
		if s.knowsAnswerable && q.Nudged < h.nudge || !s.knowsAnswerable && s.lastAsk.Before(h.since) {
			continue
		}
		h.ready = true
		o.nudgeLocked(h.from)
	}
}

// handingOverLocked renews node's leases on the addresses it hands over
// and is still to answer for (their next owner is not ready), except
// those it has just released.
func (o *Owners) handingOverLocked(node string, released []Held) []Grant {
	var out []Grant
	for _, a := range o.handingFrom[node] {
		h := o.handing[a]
		if h == nil || h.from != node || h.ready || slices.ContainsFunc(released, func(r Held) bool { return r.Addr == a }) {
			continue
		}
		if l := o.table.leases[a]; l == nil || l.Node != node {
			continue // given up, or lapsed: never granted afresh here
		}
		if v, l := o.table.Request(a, node, node); v == Granted {
			out = append(out, Grant{Addr: a, Lease: l})
		}
	}
	return out
}

// noteAskLocked records that s asked, what it refuses and what it can
// answer for, and reports whether the owners must be chosen again: the
// node was not live, or refuses or can answer for other addresses than
// before. What a node
// refuses is kept only where the registry makes it matter: an address
// that is no L2 address is dropped here. What it can answer for is kept
// for the L2 addresses, and for at most MaxUnknownAnswerable others.
func (o *Owners) noteAskLocked(s *Stream, q Asked) bool {
	wasLive := o.liveLocked(s)
	s.lastAsk = o.clk.Now()
	refused := maps.Collect(func(yield func(netip.Addr, string) bool) {
		for a, why := range q.Refused {
			if _, l2 := o.candidates[a]; l2 && !yield(a, why) {
				return
			}
		}
	})
	answerableChanged := false
	if q.HasAnswerable {
		// The L2 addresses known now, and up to MaxUnknownAnswerable
		// others: the node may hear of a new address before this server
		// does, and says so only once; past that, what a node says
		// cannot grow what the server holds beyond the registry.
		answerable := make(map[netip.Addr]bool, min(len(q.Answerable), len(o.candidates)+MaxUnknownAnswerable))
		unknown := 0
		for _, a := range q.Answerable {
			if _, l2 := o.candidates[a]; !l2 {
				if unknown == MaxUnknownAnswerable {
					continue
				}
				unknown++
			}
			answerable[a] = true
		}
		answerableChanged = !s.knowsAnswerable || !maps.Equal(answerable, s.answerable)
		if answerableChanged {
			o.setAnswerableLocked(s.node, s.answerable, answerable)
		}
		s.knowsAnswerable, s.answerable = true, answerable
	}
	changed := !wasLive || answerableChanged || !maps.Equal(refused, s.refused)
	s.refused = refused
	return changed
}

// releaseLocked ends the leases node gave up, and wakes each address's
// next owner so that it takes the address without waiting for its next
// ask.
func (o *Owners) releaseLocked(node string, released []Held) {
	for _, r := range released {
		o.table.Release(r.Addr, node, r.Epoch)
		if next := o.owner[r.Addr]; next != "" && next != node {
			o.nudgeLocked(next)
		}
	}
}

// claimLocked takes what node says it holds where the table knows
// nothing of the address (a restart, a new leader): a running lease at
// once, since no other can run on its address; a lapsed one once no
// lease of an earlier server can still run (mayClaimLocked says which
// claims count). It returns the leases node claims as running, and
// whether any claim was taken.
func (o *Owners) claimLocked(node string, q Asked) (claims []Held, taken bool) {
	claims = q.Held
	if !o.table.Fencing() {
		claims = slices.Concat(q.Held, q.Lapsed)
	}
	for _, l := range q.Lapsed {
		if _, known := o.table.leases[l.Addr]; !known && l.Epoch > o.lapsed[l.Addr].epoch && o.mayClaimLocked(l.Addr, node) {
			o.lapsed[l.Addr] = claim{node: node, epoch: l.Epoch}
			taken = true
		}
	}
	for _, h := range claims {
		if _, known := o.table.leases[h.Addr]; !known && o.mayClaimLocked(h.Addr, node) {
			o.table.Adopt(h.Addr, node, h.Epoch)
			delete(o.lapsed, h.Addr)
			taken = true
		}
	}
	return claims, taken
}

// grantClaimedLocked renews, before the server has heard from the
// nodes, only what node holds already: no address moves yet.
func (o *Owners) grantClaimedLocked(node string, claims []Held) []Grant {
	var out []Grant
	for _, h := range claims {
		if l, ok := o.table.leases[h.Addr]; ok && l.Node == node {
			_, l := o.table.Request(h.Addr, node, node)
			out = append(out, Grant{Addr: h.Addr, Lease: l})
		}
	}
	return out
}

// grantOwnedLocked grants node a lease on every address it is the chosen
// owner of, except those it has just released, counting and logging each
// lease that is new.
func (o *Owners) grantOwnedLocked(node string, released []Held) []Grant {
	out := o.handingOverLocked(node, released)
	for _, a := range o.owned[node] {
		if slices.ContainsFunc(released, func(r Held) bool { return r.Addr == a }) {
			continue
		}
		prev := o.table.leases[a]
		v, l := o.table.Request(a, node, node)
		if v != Granted {
			continue
		}
		out = append(out, Grant{Addr: a, Lease: l})
		delete(o.lapsed, a)
		if prev == nil || prev.Epoch != l.Epoch {
			delete(o.handing, a)
			o.metrics.changes.Inc()
			if at, ok := o.movedAt[a]; ok {
				o.metrics.takeover.Observe(o.clk.Since(at).Seconds())
			}
			delete(o.movedAt, a)
			o.log.Info("L2 lease granted", "address", a, "node", node, "epoch", l.Epoch)
		}
	}
	return out
}

// mayClaimLocked reports whether node's claim on addr is taken: addr is
// an L2 address, and once the server has heard from the nodes, node is
// one of its candidates. Before then a node's candidacy is unknown (it
// rests on what the nodes report), so any node may keep what it holds on
// an L2 address, and the choice moves it later where needed.
func (o *Owners) mayClaimLocked(addr netip.Addr, node string) bool {
	candidates, l2 := o.candidates[addr]
	return l2 && (!o.warm || slices.Contains(candidates, node))
}

// Stop is the node going away (the agent stops): it is no candidate any
// more, so its addresses move. Each lease it still holds is handed over:
// the answer lists it until its next owner can take it, and the node
// gives it up (in q.Released) once it is no longer listed. A node may
// give everything up at once instead.
func (s *Stream) Stop(q Asked) []Grant {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if s.closed || o.table == nil {
		return nil
	}
	first := !s.stopping
	s.stopping = true
	s.lastAsk = o.clk.Now()
	for _, r := range q.Released {
		o.log.Info("L2 lease given up: the node is stopping", "address", r.Addr, "node", s.node, "epoch", r.Epoch)
	}
	o.releaseLocked(s.node, q.Released)
	if first {
		o.assignLocked()
	}
	return o.handingOverLocked(s.node, q.Released)
}

// liveLocked: the node asked within a lease's life on an open stream.
func (o *Owners) liveLocked(s *Stream) bool {
	return !s.closed && !s.stopping && !s.lastAsk.IsZero() && o.clk.Since(s.lastAsk) < o.ttl
}

// assignLocked chooses the owners among the live candidates, keeping the
// holders of leases where it can, and nudges every node that gains or
// loses an address.
func (o *Owners) assignLocked() {
	if o.table == nil || !o.warm {
		return
	}
	owner := o.chooseLocked()
	for a, n := range owner {
		if was := o.owner[a]; was != n {
			o.nudgeLocked(n)
			if was != "" {
				o.nudgeLocked(was)
				o.movedAt[a] = o.clk.Now()
			}
			o.log.Info("L2 owner chosen", "address", a, "node", n, "was", was)
		}
	}
	for a, was := range o.owner {
		if _, ok := owner[a]; !ok {
			o.nudgeLocked(was)
			o.log.Info("L2 address has no owner", "address", a, "was", was)
		}
	}
	o.owner = owner
	o.owned = map[string][]netip.Addr{}
	for a, n := range owner {
		o.owned[n] = append(o.owned[n], a)
	}
	for _, as := range o.owned {
		slices.SortFunc(as, netip.Addr.Compare)
	}
	o.planHandoversLocked(owner)
	o.poke()
}

// chooseLocked is the owner of every L2 address by Assign's rule, among
// its candidates that may own it now, keeping the holders of leases where
// it can. It changes nothing.
func (o *Owners) chooseLocked() map[netip.Addr]string {
	// Each address's candidates that may own it now: live (asking, not
	// stopping), able to answer for it (or an older agent, which never
	// says), and not refusing it. Sets of nodes, so that a failover's
	// choice over every address with every node stays within the lease's
	// margin at thousands of each.
	words := o.index.words()
	live, legacy := make(nodeSet, words), make(nodeSet, words)
	for n, s := range o.streams {
		if i, ok := o.index.of[n]; ok && o.liveLocked(s) {
			live.add(i)
			if !s.knowsAnswerable {
				legacy.add(i)
			}
		}
	}
	avail := make(map[netip.Addr]nodeSet, len(o.sets))
	buf := make([]uint64, len(o.sets)*words)
	for a, cs := range o.sets {
		set, able := nodeSet(buf[:words:words]), o.able[a]
		buf = buf[words:]
		for k := range set {
			set[k] = cs[k] & live[k] & (legacy[k] | able[k])
		}
		avail[a] = set
	}
	for n, s := range o.streams {
		if i, ok := o.index.of[n]; ok && live.has(i) {
			for a := range s.refused {
				if set, ok := avail[a]; ok {
					set.remove(i)
				}
			}
		}
	}
	// The holder (or the node with a lapsed claim) stays the owner where
	// it may; where it may not (it is stopping, drained), the node chosen
	// to take over stays chosen, so that a handover in progress is not
	// turned to a third node by another node becoming live.
	current := make(map[netip.Addr]int, len(avail))
	for a, n := range o.owner {
		if i, ok := o.index.of[n]; ok {
			current[a] = i
		}
	}
	for a, set := range avail {
		if l, ok := o.table.Holder(a); ok && set.has(o.indexOf(l.Node)) {
			current[a] = o.index.of[l.Node]
		} else if c, ok := o.lapsed[a]; ok && set.has(o.indexOf(c.node)) {
			current[a] = o.index.of[c.node]
		}
	}
	owner := make(map[netip.Addr]string, len(avail))
	for a, i := range assignSets(avail, words, current) {
		owner[a] = o.index.names[i]
	}
	return owner
}

// tickLocked reassigns when a node stopped asking, nudges the owners whose
// leases became free, and returns how long until it must look again.
func (o *Owners) tickLocked() time.Duration {
	if o.table == nil {
		return time.Hour
	}
	now := o.clk.Now()
	next := now.Add(time.Hour)
	for _, s := range o.streams {
		if s.lastAsk.IsZero() {
			continue
		}
		if end := s.lastAsk.Add(o.ttl); !now.Before(end) {
			if o.ownsAny(s.node) {
				o.assignLocked()
			}
		} else if end.Before(next) {
			next = end
		}
	}
	for a, n := range o.owner {
		if l, held := o.table.Holder(a); held && l.Node == n {
			continue
		}
		free := o.table.FreeAt(a, n)
		if !now.Before(free) {
			o.nudgeLocked(n)
			continue
		}
		if free.Before(next) {
			next = free
		}
	}
	return max(next.Sub(now), time.Millisecond)
}

// ownsAny reports whether node is chosen for some address.
func (o *Owners) ownsAny(node string) bool { return len(o.owned[node]) > 0 }

func (o *Owners) nudgeLocked(node string) {
	if s := o.streams[node]; s != nil {
		s.nudges++
		s.nudge.Kick()
	}
}

// poke has the timer loop look again.
func (o *Owners) poke() { o.wake.Kick() }

// Report is what the server knows of one address's owner.
type Report struct {
	// Deciding: this server decides the owners (Holder and Chosen are
	// known).
	Deciding bool
	Holder   Lease
	Held     bool
	Chosen   string
	// Refused are the nodes that said they cannot answer for the address,
	// with their reasons.
	Refused map[string]string
}

// ReportOn is what the server knows of addr's owner.
func (o *Owners) ReportOn(addr netip.Addr) Report {
	o.mu.Lock()
	defer o.mu.Unlock()
	r := Report{Deciding: o.table != nil, Chosen: o.owner[addr], Refused: map[string]string{}}
	if o.table != nil {
		r.Holder, r.Held = o.table.Holder(addr)
	}
	for n, s := range o.streams {
		if why, ok := s.refusedOf(addr); ok {
			r.Refused[n] = why
		}
	}
	return r
}

// Owned counts, per node, the addresses whose lease it holds now.
func (o *Owners) Owned() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	if o.table == nil {
		return out
	}
	for a := range o.table.leases {
		if l, ok := o.table.Holder(a); ok {
			out[l.Node]++
		}
	}
	return out
}

// indexOf is node's number in the index, or -1.
func (o *Owners) indexOf(node string) int {
	if i, ok := o.index.of[node]; ok {
		return i
	}
	return -1
}

// indexCandidatesLocked works out the sets of c's candidates. Most
// addresses share their candidates (every Cluster service of a pool):
// each distinct list is made a set once. The index is made again when a
// node is new to it, and with it what the nodes can answer for.
func (o *Owners) indexCandidatesLocked(c map[netip.Addr][]string) {
	type key struct {
		n           int
		first, last string
	}
	keyOf := func(cs []string) key {
		if len(cs) == 0 {
			return key{}
		}
		return key{len(cs), cs[0], cs[len(cs)-1]}
	}
	type distinct struct {
		list []string
		set  nodeSet
	}
	var lists []*distinct
	byKey := map[key][]*distinct{}
	of := make(map[netip.Addr]*distinct, len(c))
	for a, cs := range c {
		var d *distinct
		k := keyOf(cs)
		// A few lists per key are compared: past that (many lists alike
		// at both ends) a list is taken as its own.
		for _, e := range byKey[k][:min(len(byKey[k]), 4)] {
			if slices.Equal(e.list, cs) {
				d = e
				break
			}
		}
		if d == nil {
			d = &distinct{list: cs}
			lists = append(lists, d)
			byKey[k] = append(byKey[k], d)
		}
		of[a] = d
	}
	reindex := false
	for _, d := range lists {
		for _, n := range d.list {
			if _, ok := o.index.of[n]; !ok {
				reindex = true
			}
		}
	}
	if reindex {
		var names []string
		for _, d := range lists {
			names = append(names, d.list...)
		}
		o.index = newNodeIndex(names)
	}
	for _, d := range lists {
		d.set = o.index.setOf(d.list)
	}
	o.sets = make(map[netip.Addr]nodeSet, len(c))
	for a, d := range of {
		o.sets[a] = d.set
	}
	// What the nodes can answer for, over the new index or for the new
	// addresses.
	if reindex {
		o.able = map[netip.Addr]nodeSet{}
	}
	maps.DeleteFunc(o.able, func(a netip.Addr, _ nodeSet) bool { _, ok := c[a]; return !ok })
	var added []netip.Addr
	for a := range c {
		if _, ok := o.able[a]; !ok {
			o.able[a] = make(nodeSet, o.index.words())
			added = append(added, a)
		}
	}
	if len(added) == 0 {
		return
	}
	for n, s := range o.streams {
		i, ok := o.index.of[n]
		if !ok || !s.knowsAnswerable {
			continue
		}
		if reindex || len(added) > len(s.answerable) {
			for a := range s.answerable {
				if set, ok := o.able[a]; ok {
					set.add(i)
				}
			}
			continue
		}
		for _, a := range added {
			if s.answerable[a] {
				o.able[a].add(i)
			}
		}
	}
}

// setAnswerableLocked records that node's stream says it can answer for
// now (none, when the stream ends) instead of was.
func (o *Owners) setAnswerableLocked(node string, was, now map[netip.Addr]bool) {
	i, ok := o.index.of[node]
	if !ok {
		return
	}
	for a := range was {
		if set, ok := o.able[a]; ok && !now[a] {
			set.remove(i)
		}
	}
	for a := range now {
		if set, ok := o.able[a]; ok {
			set.add(i)
		}
	}
}
