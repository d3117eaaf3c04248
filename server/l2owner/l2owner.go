// Package l2owner decides which node answers ARP and NDP for each
// address of an L2 pool, and fences the decision with a lease, so that
// two nodes never answer for one address at once.
//
// The choice (Assign): among the address's candidates (the nodes that may
// own it now: for externalTrafficPolicy Local only those with a ready
// local endpoint; never a drained, deleting or unhealthy node), in name
// order, with loads bounded so that addresses spread evenly, and owners
// kept where they are.
//
// The fence: a node answers for an address only while it holds a lease
// of the address's current epoch. A node asks for its lease, and counts
// it from the moment it asked, by its own clock; the server counts it
// from the moment it granted, which is later. The server gives the
// address to another node only once the lease has expired by the
// server's clock plus Margin (for the two clocks' rates), or once the
// holder released it. So whatever the delays between them, the old
// owner has stopped before the new one starts.
//
// The controller (Leader): while the server leads, it gives Owners each
// address's candidates again at every change of the registry or of a
// node's status, once it has heard from every node.
package l2owner

import (
	"net/netip"
	"time"

	"k8s.io/utils/clock"
)

// Assign chooses the owner of every address among its candidates
// (none when it has none), keeping the owners in current where it can.
// Ranks are the candidates' name order (whatever order they are given
// in), so every replica and restart agrees. Loads are balanced: with m addresses over n candidate nodes, every address
// without an owner goes where it keeps each node at m/n, and m%n nodes at
// one more, as far as the candidates allow (an address's best-ranked
// candidate takes it past that bound when all its candidates are full).
//
// Owners stay put: a current owner keeps its addresses up to its share,
// ⌈m/n⌉, plus a quarter of that share (at least one more), so a node that
// goes moves only the addresses it owned, and one that comes (back) takes
// nothing until another node holds more than that. A move is a
// disruption for every host that cached the address's MAC: it is made
// for a failure, a node leaving, or an imbalance past the threshold
// (Keep), never to restore a ranking.
//
// Where candidates are few, one round of that can leave an address to a
// node that the next round would move; Assign repeats the round until
// nothing moves (two or three rounds at most in practice), so that asking
// again with the answer moves nothing.
func Assign(candidates map[netip.Addr][]string, current map[netip.Addr]string) map[netip.Addr]string {
	var names []string
	for _, cs := range candidates {
		names = append(names, cs...)
	}
	ix := newNodeIndex(names)
	sets := make(map[netip.Addr]nodeSet, len(candidates))
	for a, cs := range candidates {
		sets[a] = ix.setOf(cs)
	}
	cur := make(map[netip.Addr]int, len(current))
	for a, n := range current {
		if i, ok := ix.of[n]; ok {
			cur[a] = i
		}
	}
	owner := make(map[netip.Addr]string, len(candidates))
	for a, i := range assignSets(sets, ix.words(), cur) {
		owner[a] = ix.names[i]
	}
	return owner
}

// Keep is how many addresses a node keeps of those it owns, with m
// addresses over n nodes: its share, ⌈m/n⌉, and a quarter more (at least
// one). Past that the imbalance is worth a move.
func Keep(m, n int) int {
	if n == 0 {
		return 0
	}
	share := (m + n - 1) / n
	return share + max(1, (share+3)/4)
}

// Lease is a node's right to answer for an address.
type Lease struct {
	Node string
	// Epoch grows with every new owner of the address; a node's answer
	// to a grant names it, so a stale renewal never extends a newer
	// owner's lease.
	Epoch uint64
	// Since is when this owner's first grant was made; Expires is when
	// the lease ends by the server's clock, unless renewed.
	Since, Expires time.Time
}

// Table holds the leases of every L2 address. It is not safe for
// concurrent use: its owner serialises calls.
type Table struct {
	clk clock.PassiveClock
	// TTL is how long a grant lasts; Margin how much longer the server
	// waits after a lease's end before it grants the address to another
	// node.
	ttl, margin time.Duration
	leases      map[netip.Addr]*Lease
	epoch       uint64    // the last epoch given, for every address
	started     time.Time // when the table began knowing the leases
}

// NewTable is a table with no lease, counting time on clk. Since it
// knows of no lease it may not have given (a restart), it grants no
// address before ttl+margin has passed: a lease given before then has
// ended by then.
func NewTable(clk clock.PassiveClock, ttl, margin time.Duration) *Table {
	// Epochs start from the clock, so that a restarted server never
	// gives an epoch an agent may still hold.
	return &Table{clk: clk, ttl: ttl, margin: margin, leases: map[netip.Addr]*Lease{}, started: clk.Now(),
		epoch: uint64(clk.Now().UnixNano())}
}

// Verdict is the answer to a node's request for an address.
type Verdict int

const (
	// Granted: the node holds the lease until it ends by its own count.
	Granted Verdict = iota
	// NotChosen: another node should own the address, or none may.
	NotChosen
	// Fenced: the node is the choice, but the address's previous lease
	// has not surely ended: the node asks again later.
	Fenced
)

// Request is node asking to hold addr (or to renew its hold), where
// chosen is the node that should own it now (Assign). It answers with
// the verdict and, when granted, the lease.
func (t *Table) Request(addr netip.Addr, node, chosen string) (Verdict, Lease) {
	now := t.clk.Now()
	if node != chosen {
		return NotChosen, Lease{}
	}
	l := t.leases[addr]
	switch {
	case l != nil && l.Node == node:
		// A renewal (or a node asking again before it heard the grant).
		l.Expires = now.Add(t.ttl)
		return Granted, *l
	case l != nil && now.Before(l.Expires.Add(t.margin)):
		return Fenced, Lease{}
	case l == nil && now.Before(t.started.Add(t.ttl+t.margin)):
		return Fenced, Lease{}
	}
	t.epoch++
	l = &Lease{Node: node, Epoch: t.epoch, Since: now, Expires: now.Add(t.ttl)}
	t.leases[addr] = l
	return Granted, *l
}

// Release is node giving up addr's lease of epoch (it stopped
// answering): the next owner need not wait for the lease to end.
func (t *Table) Release(addr netip.Addr, node string, epoch uint64) {
	if l := t.leases[addr]; l != nil && l.Node == node && l.Epoch == epoch {
		delete(t.leases, addr)
	}
}

// Holder is the lease on addr, and whether one is held now.
func (t *Table) Holder(addr netip.Addr) (Lease, bool) {
	l := t.leases[addr]
	if l == nil || !t.clk.Now().Before(l.Expires) {
		return Lease{}, false
	}
	return *l, true
}

// Forget drops the leases of addresses no longer in an L2 pool that have
// ended past the margin; a lease still running stays until then, so that
// an address back in a pool soon is fenced as before.
func (t *Table) Forget(keep func(netip.Addr) bool) {
	now := t.clk.Now()
	for a, l := range t.leases {
		if !keep(a) && !now.Before(l.Expires.Add(t.margin)) {
			delete(t.leases, a)
		}
	}
}

// Adopt takes as this table's a lease that node says it holds on addr
// (granted by a server before a restart, or by an earlier leader), when
// the table knows no lease on addr: the node keeps answering without a
// gap, and no other node is given the address before that lease ends
// here. The lease gets a new epoch, above the one claimed and every one
// given: the newest holder of an address always has its highest epoch,
// which is how claims on it compare.
func (t *Table) Adopt(addr netip.Addr, node string, epoch uint64) {
	if t.leases[addr] != nil {
		return
	}
	now := t.clk.Now()
	t.epoch = max(t.epoch, epoch) + 1
	t.leases[addr] = &Lease{Node: node, Epoch: t.epoch, Since: now, Expires: now.Add(t.ttl)}
}

// Fencing reports whether a lease given before the table began may still
// run.
func (t *Table) Fencing() bool { return t.clk.Now().Before(t.started.Add(t.ttl + t.margin)) }

// FreeAt is when addr may be granted to node: now or earlier when it may
// be at once.
func (t *Table) FreeAt(addr netip.Addr, node string) time.Time {
	l := t.leases[addr]
	switch {
	case l != nil && l.Node == node:
		return time.Time{}
	case l != nil:
		return l.Expires.Add(t.margin)
	}
	return t.started.Add(t.ttl + t.margin)
}
