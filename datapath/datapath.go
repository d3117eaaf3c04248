package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"
)

// Config is how a node's datapath is set up.
type Config struct {
	// NodePortAddresses restricts node ports to local addresses in these
	// CIDRs; empty means the node's own addresses (never loopback).
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pod networks of the whole cluster. Connections
	// from them keep their source address even to other nodes' endpoints.
	// The node's own pod CIDRs are always included.
	ClusterCIDRs []netip.Prefix
	// MasqueradeMark is the packet-mark bit Weir uses; 0 means DefaultMasqueradeMark.
	MasqueradeMark uint32
	// Conntrack clears stale UDP entries after a change; nil leaves them.
	Conntrack Conntrack
	// Log receives what the datapath cannot return as an error; nil discards.
	Log *slog.Logger
}

// Datapath programs one node's Weir tables (one per family). It keeps what
// it has programmed in memory, so that a change costs a transaction of the
// elements that changed, never a listing of the table.
type Datapath struct {
	cfg Config
	nft map[*family]knftables.Interface

	mu sync.Mutex // guards everything below
	// needFull is set until a full sync succeeds: at start, and after any
	// failed transaction, when the kernel's state is no longer known here.
	needFull bool
	node     NodeInfo
	services map[ServiceKey]*Service
	// contrib is what each service (and, under the zero key, the node)
	// contributes; live counts contributions per element, since a local
	// endpoint may back several services.
	contrib map[ServiceKey][]element
	live    map[elemID]*liveElement
	chains  map[*family]map[string]bool // pick chains that exist
	// owned are the chains and sets each service has to itself.
	owned map[ServiceKey][]ownedObject
}

type liveElement struct {
	value string
	refs  int
}

// nodeKey holds the node's own contribution in Datapath.contrib.
var nodeKey = ServiceKey{}

// New returns a Datapath programming the given per-family interfaces, which
// must be for TableName. Either may be nil to leave that family alone.
func New(nftIPv4, nftIPv6 knftables.Interface, cfg Config) *Datapath {
	if cfg.MasqueradeMark == 0 {
		cfg.MasqueradeMark = DefaultMasqueradeMark
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	d := &Datapath{cfg: cfg, nft: map[*family]knftables.Interface{}, needFull: true}
	if nftIPv4 != nil {
		d.nft[&ipv4] = nftIPv4
	}
	if nftIPv6 != nil {
		d.nft[&ipv6] = nftIPv6
	}
	return d
}

// NewForNode opens the real nftables tables of the current network namespace.
func NewForNode(cfg Config) (*Datapath, error) {
	v4, err := knftables.New(knftables.IPv4Family, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables for IPv4: %w", err)
	}
	v6, err := knftables.New(knftables.IPv6Family, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables for IPv6: %w", err)
	}
	if cfg.Conntrack == nil {
		cfg.Conntrack = ConntrackTool{}
	}
	return New(v4, v6, cfg), nil
}

// Apply makes the kernel forward exactly what state describes. Services are
// compared by pointer: a caller that replaces only changed *Service values
// gets a transaction proportional to the change. On error the kernel keeps
// forwarding on the last state applied successfully.
func (d *Datapath) Apply(ctx context.Context, state NodeState) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.needFull {
		return d.fullSync(ctx, state)
	}
	return d.partialSync(ctx, state)
}

// Resync rewrites the whole table from the last state given to Apply,
// repairing anything someone else changed or deleted.
func (d *Datapath) Resync(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fullSync(ctx, NodeState{Node: d.node, Services: d.services})
}

func (d *Datapath) fullSync(ctx context.Context, state NodeState) error {
	d.needFull = true
	d.contrib = map[ServiceKey][]element{}
	d.live = map[elemID]*liveElement{}
	d.chains = map[*family]map[string]bool{}
	d.owned = map[ServiceKey][]ownedObject{}
	txs := map[*family]*knftables.Transaction{}
	for f, nft := range d.nft {
		tx := nft.NewTransaction()
		// Delete and recreate in one transaction: atomic for packets, and
		// it leaves nothing behind from an older layout. Connections in
		// flight keep their NAT bindings, which live in conntrack.
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
		tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules for Kubernetes-style services, owned by weir-agent")})
		for _, obj := range staticObjects(*f, d.cfg.MasqueradeMark) {
			tx.Add(obj)
		}
		txs[f] = tx
		d.chains[f] = map[string]bool{}
	}
	var adds []element
	set := func(key ServiceKey, elems []element) {
		d.contrib[key] = elems
		for _, e := range elems {
			if le := d.live[e.id()]; le != nil {
				le.refs++
				continue
			}
			d.live[e.id()] = &liveElement{value: e.value, refs: 1}
			adds = append(adds, e)
		}
	}
	set(nodeKey, nodeElements(state.Node, d.cfg))
	var owned []ownedObject
	for key, svc := range state.Services {
		c := serviceContribution(svc, state.Node, d.cfg.MasqueradeMark)
		set(key, c.elems)
		if len(c.owned) > 0 {
			d.owned[key] = c.owned
			owned = append(owned, c.owned...)
		}
	}
	d.changeOwned(txs, nil, owned)
	d.addElements(txs, adds)
	if err := d.run(ctx, txs); err != nil {
		return err
	}
	d.needFull = false
	d.node, d.services = state.Node, maps.Clone(state.Services)
	return nil
}

func (d *Datapath) partialSync(ctx context.Context, state NodeState) error {
	before := map[elemID]*liveElement{} // the touched elements as they were
	change := func(key ServiceKey, elems []element) {
		for _, e := range d.contrib[key] {
			id := e.id()
			le := d.live[id]
			if _, ok := before[id]; !ok {
				before[id] = &liveElement{value: le.value, refs: le.refs}
			}
			if le.refs--; le.refs == 0 {
				delete(d.live, id)
			}
		}
		for _, e := range elems {
			id := e.id()
			if _, ok := before[id]; !ok {
				if le := d.live[id]; le != nil {
					before[id] = &liveElement{value: le.value, refs: le.refs}
				} else {
					before[id] = nil
				}
			}
			if le := d.live[id]; le != nil {
				le.refs++
			} else {
				d.live[id] = &liveElement{value: e.value, refs: 1}
			}
		}
		if elems == nil {
			delete(d.contrib, key)
		} else {
			d.contrib[key] = elems
		}
	}
	var oldOwned, newOwned []ownedObject
	changeService := func(key ServiceKey, c contribution) {
		change(key, c.elems)
		oldOwned = append(oldOwned, d.owned[key]...)
		newOwned = append(newOwned, c.owned...)
		if len(c.owned) > 0 {
			d.owned[key] = c.owned
		} else {
			delete(d.owned, key)
		}
	}
	nodeChanged := !nodeInfoEqual(state.Node, d.node)
	if nodeChanged {
		change(nodeKey, nodeElements(state.Node, d.cfg))
	}
	for key, svc := range state.Services {
		// The node's zone and addresses shape every service's elements.
		if nodeChanged || d.services[key] != svc {
			changeService(key, serviceContribution(svc, state.Node, d.cfg.MasqueradeMark))
		}
	}
	for key := range d.services {
		if _, ok := state.Services[key]; !ok {
			changeService(key, contribution{})
		}
	}

	txs := map[*family]*knftables.Transaction{}
	var adds []element
	for id, was := range before {
		now := d.live[id]
		if was != nil && (now == nil || now.value != was.value) {
			tx := d.tx(txs, id.family)
			tx.Delete(elementObject(element{family: id.family, set: id.set, key: id.key, value: was.value}))
		}
		if now != nil && (was == nil || now.value != was.value) {
			adds = append(adds, element{family: id.family, set: id.set, key: id.key, value: now.value})
		}
	}
	// After the element deletes (which drop references to chains that
	// go), before the adds (which refer to chains that come).
	d.changeOwned(txs, oldOwned, newOwned)
	d.addElements(txs, adds)
	if err := d.run(ctx, txs); err != nil {
		d.needFull = true
		return err
	}
	// A copy: the caller may change its map for the next Apply.
	d.node, d.services = state.Node, maps.Clone(state.Services)
	// Only after the new rules are in: a flow cleared earlier could be
	// re-created on the old path.
	if d.cfg.Conntrack != nil {
		for _, flow := range d.staleUDPFlows(before) {
			if err := d.cfg.Conntrack.ClearUDP(ctx, flow); err != nil {
				d.cfg.Log.Warn("stale UDP conntrack entries not cleared", "flow", flow.String(), "error", err)
			}
		}
	}
	return nil
}

// changeOwned turns the owned chains and sets from old into new: new and
// changed ones are (re)written, vanished ones deleted. Chains are created
// empty first, so that rules may refer to any of them.
func (d *Datapath) changeOwned(txs map[*family]*knftables.Transaction, old, new []ownedObject) {
	oldByID := map[objID]ownedObject{}
	for _, o := range old {
		oldByID[o.id()] = o
	}
	newByID := map[objID]bool{}
	var rewrite []ownedObject
	for _, o := range new {
		newByID[o.id()] = true
		was, existed := oldByID[o.id()]
		if existed && was.definition() == o.definition() {
			continue
		}
		// Sets never change definition (their names carry it), so an
		// existing one is left as it is, with its clients.
		d.tx(txs, o.family).Add(o.create())
		rewrite = append(rewrite, o)
	}
	for _, o := range rewrite {
		if o.set != nil {
			continue
		}
		tx := d.tx(txs, o.family)
		tx.Flush(&knftables.Chain{Name: o.name})
		for _, r := range o.rules {
			tx.Add(&knftables.Rule{Chain: o.name, Rule: r})
		}
	}
	// Vanished: flush chains first (their rules may refer to each other
	// and to sets), then delete chains, then sets.
	var gone []ownedObject
	for id, o := range oldByID {
		if !newByID[id] {
			gone = append(gone, o)
		}
	}
	for _, o := range gone {
		if o.set == nil {
			d.tx(txs, o.family).Flush(&knftables.Chain{Name: o.name})
		}
	}
	for _, o := range gone {
		if o.set == nil {
			d.tx(txs, o.family).Delete(&knftables.Chain{Name: o.name})
		}
	}
	for _, o := range gone {
		if o.set != nil {
			d.tx(txs, o.family).Delete(&knftables.Set{Name: o.name})
		}
	}
}

// addElements adds elements to their family's transaction, creating first
// any pick chain a verdict refers to.
func (d *Datapath) addElements(txs map[*family]*knftables.Transaction, adds []element) {
	// Sorted for transactions that read the same every time.
	slices.SortFunc(adds, func(a, b element) int {
		if c := strings.Compare(a.set, b.set); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	for _, e := range adds {
		if _, ok := d.nft[e.family]; !ok {
			continue
		}
		tx := d.tx(txs, e.family)
		if chain, ok := strings.CutPrefix(e.value, "goto "); ok && !d.chains[e.family][chain] {
			k, p, n, ok := kindOfChain(chain)
			if !ok {
				// A chain a service owns, created by changeOwned.
				tx.Add(elementObject(e))
				continue
			}
			for _, obj := range k.pickChainObjects(*e.family, d.cfg.MasqueradeMark, p, n) {
				tx.Add(obj)
			}
			d.chains[e.family][chain] = true
		}
		tx.Add(elementObject(e))
	}
}

func (d *Datapath) tx(txs map[*family]*knftables.Transaction, f *family) *knftables.Transaction {
	if tx := txs[f]; tx != nil {
		return tx
	}
	tx := d.nft[f].NewTransaction()
	txs[f] = tx
	return tx
}

// run commits the transactions, IPv4 first. Each is atomic on its own.
func (d *Datapath) run(ctx context.Context, txs map[*family]*knftables.Transaction) error {
	var errs []error
	for _, f := range []*family{&ipv4, &ipv6} {
		tx := txs[f]
		if tx == nil || tx.NumOperations() == 0 {
			continue
		}
		if err := d.nft[f].Run(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("programming %s table %q: %w", f, TableName, err))
		}
	}
	return errors.Join(errs...)
}

func elementObject(e element) *knftables.Element {
	el := &knftables.Element{Key: []string{e.key}}
	if e.value == "" {
		el.Set = e.set
	} else {
		el.Map = e.set
		el.Value = []string{e.value}
	}
	return el
}

func nodeInfoEqual(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Zone == b.Zone && a.Deleting == b.Deleting && a.Registered == b.Registered &&
		slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}
