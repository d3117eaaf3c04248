package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime"
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
	// nft holds, per family, the interface for ordinary transactions and,
	// after it, any more that a full sync may load through in parallel.
	nft map[*family][]knftables.Interface
	// lister lists object names; over netlink where it can, because nft
	// reads every element of the table to list even just the names.
	lister map[*family]knftables.Interface

	mu sync.Mutex // guards everything below
	// needFull is set until a full sync succeeds: at start, and after any
	// failed transaction, when the kernel's state is no longer known here.
	needFull bool
	// listed is set once the table's objects were listed: after that this
	// Datapath knows every object it made.
	listed   bool
	gen      generation // the generation the chains read
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

// FullSyncChunk is how many elements one transaction of a full sync loads:
// nft's memory grows with the size of what it parses, about 2.5 KB per
// element.
const FullSyncChunk = 10000

// New returns a Datapath programming the given per-family interfaces, which
// must be for TableName. Either may be nil to leave that family alone.
func New(nftIPv4, nftIPv6 knftables.Interface, cfg Config) *Datapath {
	if cfg.MasqueradeMark == 0 {
		cfg.MasqueradeMark = DefaultMasqueradeMark
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	d := &Datapath{cfg: cfg, nft: map[*family][]knftables.Interface{}, lister: map[*family]knftables.Interface{}, needFull: true, gen: genB}
	if nftIPv4 != nil {
		d.nft[&ipv4] = []knftables.Interface{nftIPv4}
		d.lister[&ipv4] = nftIPv4
	}
	if nftIPv6 != nil {
		d.nft[&ipv6] = []knftables.Interface{nftIPv6}
		d.lister[&ipv6] = nftIPv6
	}
	return d
}

// NewForNode opens the real nftables tables of the current network
// namespace, with one loader per CPU for full syncs.
func NewForNode(cfg Config) (*Datapath, error) {
	if cfg.Conntrack == nil {
		cfg.Conntrack = ConntrackTool{}
	}
	d := New(nil, nil, cfg)
	for _, f := range []*family{&ipv4, &ipv6} {
		for range max(2, min(runtime.NumCPU(), 4)) {
			nft, err := knftables.New(f.nft, TableName)
			if err != nil {
				return nil, fmt.Errorf("nftables for %s: %w", f, err)
			}
			d.nft[f] = append(d.nft[f], nft)
		}
		d.lister[f] = d.nft[f][0]
		if nl, err := knftables.New(f.nft, TableName, knftables.UseNetlink); err == nil {
			d.lister[f] = nl
		}
	}
	return d, nil
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

// fullSync loads state into a fresh generation and switches to it:
//  1. one transaction creates the table, the new generation's empty sets
//     and maps, any missing chain, and the services' own objects;
//  2. the elements load in chunks, in parallel, while the old generation
//     still forwards;
//  3. one transaction points every chain at the new generation and deletes
//     the old one and anything else the table holds that is not Weir's now.
//
// A failure before step 3 leaves the old generation forwarding.
func (d *Datapath) fullSync(ctx context.Context, state NodeState) error {
	d.needFull = true
	existing, err := d.existingObjects(ctx)
	if err != nil {
		return err
	}
	// A table left by an earlier agent forwards with one generation; load
	// the other.
	for _, objs := range existing {
		if slices.Contains(objs.maps, genA.of(ipKind.frontends)) {
			d.gen = genA
		} else if slices.Contains(objs.maps, genB.of(ipKind.frontends)) {
			d.gen = genB
		}
	}
	next := d.gen.other()

	// Sized for the usual dozen elements a service contributes.
	contrib := make(map[ServiceKey][]element, len(state.Services)+1)
	live := make(map[elemID]*liveElement, 12*len(state.Services))
	owned := map[ServiceKey][]ownedObject{}
	elems := make([]element, 0, 12*len(state.Services))
	var allOwned []ownedObject
	collect := func(key ServiceKey, es []element) {
		contrib[key] = es
		for _, e := range es {
			if le := live[e.id()]; le != nil {
				le.refs++
				continue
			}
			live[e.id()] = &liveElement{value: e.value, refs: 1}
			elems = append(elems, e)
		}
	}
	collect(nodeKey, nodeElements(state.Node, d.cfg))
	for key, svc := range state.Services {
		c := serviceContribution(svc, state.Node, d.cfg.MasqueradeMark)
		collect(key, c.elems)
		if len(c.owned) > 0 {
			owned[key] = c.owned
			allOwned = append(allOwned, c.owned...)
		}
	}
	pickChains := map[*family]map[string]bool{}
	for f := range d.nft {
		pickChains[f] = map[string]bool{}
	}
	for _, e := range elems {
		if chain, ok := strings.CutPrefix(e.value, "goto "); ok {
			if _, _, _, isPick := kindOfChain(chain); isPick && pickChains[e.family] != nil {
				pickChains[e.family][chain] = true
			}
		}
	}

	// 1. Prepare.
	txs := map[*family]*knftables.Transaction{}
	for f := range d.nft {
		tx := d.tx(txs, f)
		tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules for Kubernetes-style services, owned by weir-agent")})
		for _, obj := range tableSets(*f, next) {
			// Fresh, even if a failed sync left one behind.
			tx.Add(obj)
			tx.Delete(obj)
			tx.Add(obj)
		}
		for _, c := range tableChains(*f, d.cfg.MasqueradeMark, next) {
			tx.Add(c.chain)
			if c.base() {
				// Base chains only jump to fixed chains: rewriting them
				// here changes nothing for packets.
				tx.Flush(c.chain)
				for _, r := range c.rules {
					tx.Add(&knftables.Rule{Chain: c.chain.Name, Rule: r})
				}
			}
		}
		for chain := range pickChains[f] {
			tx.Add(&knftables.Chain{Name: chain})
		}
	}
	d.changeOwned(txs, nil, allOwned)
	if err := d.run(ctx, txs); err != nil {
		d.listed = false // what the table holds is no longer known
		return err
	}

	// 2. Load.
	if err := d.load(ctx, elems, next); err != nil {
		d.listed = false
		return err
	}

	// 3. Switch.
	txs = map[*family]*knftables.Transaction{}
	for f := range d.nft {
		tx := d.tx(txs, f)
		keep := map[string]bool{}
		for _, c := range tableChains(*f, d.cfg.MasqueradeMark, next) {
			keep[c.chain.Name] = true
			if c.base() {
				continue
			}
			tx.Flush(c.chain)
			for _, r := range c.rules {
				tx.Add(&knftables.Rule{Chain: c.chain.Name, Rule: r})
			}
		}
		for chain := range pickChains[f] {
			keep[chain] = true
			k, p, n, _ := kindOfChain(chain)
			tx.Flush(&knftables.Chain{Name: chain})
			tx.Add(&knftables.Rule{Chain: chain, Rule: k.pickChainRule(*f, d.cfg.MasqueradeMark, p, n, next)})
		}
		for _, obj := range tableSets(*f, next) {
			keep[setName(obj)] = true
		}
		for _, o := range allOwned {
			if o.family == f {
				keep[o.name] = true
			}
		}
		// Whatever else the table holds goes: the old generation, pick
		// chains no service needs, and objects of older layouts. Chains
		// are flushed first, since they may refer to each other.
		for _, name := range existing[f].chains {
			if !keep[name] {
				tx.Flush(&knftables.Chain{Name: name})
			}
		}
		for _, name := range existing[f].chains {
			if !keep[name] {
				tx.Delete(&knftables.Chain{Name: name})
			}
		}
		// Anonymous sets and maps ("__map0") belong to rules and go with them.
		for _, name := range existing[f].maps {
			if !keep[name] && !strings.HasPrefix(name, "__") {
				tx.Delete(&knftables.Map{Name: name})
			}
		}
		for _, name := range existing[f].sets {
			if !keep[name] && !strings.HasPrefix(name, "__") {
				tx.Delete(&knftables.Set{Name: name})
			}
		}
	}
	if err := d.run(ctx, txs); err != nil {
		d.listed = false
		return err
	}
	d.needFull = false
	d.listed = true
	d.gen = next
	d.contrib, d.live, d.owned, d.chains = contrib, live, owned, pickChains
	d.node, d.services = state.Node, maps.Clone(state.Services)
	return nil
}

// tableObjects names what a family's table holds.
type tableObjects struct{ chains, sets, maps []string }

// existingObjects names what the table holds: listed the first time (an
// older agent or layout may have left anything), known from then on.
func (d *Datapath) existingObjects(ctx context.Context) (map[*family]tableObjects, error) {
	if !d.listed {
		return d.listObjects(ctx)
	}
	out := map[*family]tableObjects{}
	for f := range d.nft {
		var objs tableObjects
		for _, c := range tableChains(*f, d.cfg.MasqueradeMark, d.gen) {
			objs.chains = append(objs.chains, c.chain.Name)
		}
		for chain := range d.chains[f] {
			objs.chains = append(objs.chains, chain)
		}
		for _, obj := range tableSets(*f, d.gen) {
			if m, ok := obj.(*knftables.Map); ok {
				objs.maps = append(objs.maps, m.Name)
			} else {
				objs.sets = append(objs.sets, setName(obj))
			}
		}
		for _, os := range d.owned {
			for _, o := range os {
				switch {
				case o.family != f:
				case o.set != nil:
					objs.sets = append(objs.sets, o.name)
				default:
					objs.chains = append(objs.chains, o.name)
				}
			}
		}
		out[f] = objs
	}
	return out, nil
}

// listObjects lists the names of the table's objects (never their
// contents, which is what makes a listing slow).
func (d *Datapath) listObjects(ctx context.Context) (map[*family]tableObjects, error) {
	out := map[*family]tableObjects{}
	for f := range d.nft {
		var objs tableObjects
		for _, l := range []struct {
			kind string
			into *[]string
		}{{"chain", &objs.chains}, {"set", &objs.sets}, {"map", &objs.maps}} {
			names, err := d.lister[f].List(ctx, l.kind)
			if err != nil && !knftables.IsNotFound(err) {
				return nil, fmt.Errorf("listing %s %ss: %w", f, l.kind, err)
			}
			*l.into = names
			if len(objs.chains) == 0 {
				// No chains: no table of ours (Weir's always has chains),
				// and the netlink lister fails on sets of a missing table.
				break
			}
		}
		out[f] = objs
	}
	return out, nil
}

func setName(obj knftables.Object) string {
	switch o := obj.(type) {
	case *knftables.Set:
		return o.Name
	case *knftables.Map:
		return o.Name
	}
	return ""
}

// load adds elements to generation g in chunks, spread over the family's
// interfaces so that several nft processes parse at once.
func (d *Datapath) load(ctx context.Context, elems []element, g generation) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for f, nfts := range d.nft {
		chunks := make(chan []element)
		for _, nft := range nfts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := range chunks {
					tx := nft.NewTransaction()
					for _, e := range c {
						tx.Add(elementObject(e, g))
					}
					if err := nft.Run(ctx, tx); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("loading %s table %q: %w", f, TableName, err))
						mu.Unlock()
					}
				}
			}()
		}
		chunk := make([]element, 0, FullSyncChunk)
		for _, e := range elems {
			if e.family != f {
				continue
			}
			if chunk = append(chunk, e); len(chunk) == FullSyncChunk {
				chunks <- chunk
				chunk = make([]element, 0, FullSyncChunk)
			}
		}
		if len(chunk) > 0 {
			chunks <- chunk
		}
		close(chunks)
	}
	wg.Wait()
	return errors.Join(errs...)
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
			tx.Delete(elementObject(element{family: id.family, set: id.set, key: id.key, value: was.value}, d.gen))
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
		d.needFull, d.listed = true, false
		return err
	}
	// Our own copy, kept in step key by key: the caller may change its map
	// for the next Apply, and cloning it whole costs more than the change.
	d.node = state.Node
	for key := range d.services {
		if _, ok := state.Services[key]; !ok {
			delete(d.services, key)
		}
	}
	for key, svc := range state.Services {
		if d.services[key] != svc {
			d.services[key] = svc
		}
	}
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
			// Owned chains are made by changeOwned; pick chains here.
			if k, p, n, isPick := kindOfChain(chain); isPick {
				tx.Add(&knftables.Chain{Name: chain})
				tx.Flush(&knftables.Chain{Name: chain})
				tx.Add(&knftables.Rule{Chain: chain, Rule: k.pickChainRule(*e.family, d.cfg.MasqueradeMark, p, n, d.gen)})
				d.chains[e.family][chain] = true
			}
		}
		tx.Add(elementObject(e, d.gen))
	}
}

func (d *Datapath) tx(txs map[*family]*knftables.Transaction, f *family) *knftables.Transaction {
	if tx := txs[f]; tx != nil {
		return tx
	}
	tx := d.nft[f][0].NewTransaction()
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
		if err := d.nft[f][0].Run(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("programming %s table %q: %w", f, TableName, err))
		}
	}
	return errors.Join(errs...)
}

// elementObject renders an element of generation g.
func elementObject(e element, g generation) *knftables.Element {
	el := &knftables.Element{Key: []string{e.key}}
	if e.value == "" {
		el.Set = g.of(e.set)
	} else {
		el.Map = g.of(e.set)
		el.Value = []string{e.value}
	}
	return el
}

func nodeInfoEqual(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Zone == b.Zone && a.Deleting == b.Deleting && a.Drained == b.Drained && a.Registered == b.Registered &&
		slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.PodCIDRs, b.PodCIDRs) && slices.Equal(a.BGPPeers, b.BGPPeers) &&
		slices.EqualFunc(a.Advertisements, b.Advertisements, BGPAdvertisement.Equal)
}
