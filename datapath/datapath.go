package datapath

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/knftables"
)

// Config is how a node's datapath is set up.
type Config struct {
	// NodePortAddresses restricts node ports to local addresses in these
	// CIDRs; empty means the node's own addresses (never loopback).
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pod networks of the whole cluster: with
	// LocalDetection ClusterCIDR, sources in them (or in the node's own pod
	// CIDRs) are local to the cluster.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are the ranges cluster IPs are allocated from: a new
	// connection to an address in them that no service holds is dropped
	// (kube-proxy's "unallocated ClusterIPs"), never routed out of the node.
	ServiceCIDRs []netip.Prefix
	// LocalDetection is how a packet's source is told to be a pod of the
	// cluster rather than outside it (kube-proxy's --detect-local-mode).
	// The zero value is ClusterCIDR.
	LocalDetection LocalDetection
	// MasqueradeMark is the packet-mark bit Weir uses for the connections
	// it DNATs, and the bit below it for those it masquerades; 0 means
	// DefaultMasqueradeMark.
	MasqueradeMark uint32
	// Masquerade chooses which DNAT'ed connections leave with the node's
	// address as their source; the zero value is kube-proxy's choice.
	Masquerade MasqueradeMode
	// MasqueradeAll masquerades every connection to a cluster IP too, from
	// any source (kube-proxy's --masquerade-all).
	MasqueradeAll bool
	// ControlMark is the packet-mark bit of the agent's own connections to
	// weir-server (it sets it on their sockets): no rule of the table
	// DNATs, rejects or drops a packet that carries it, whatever the
	// state says, so no state can cut a node off its server. 0 means
	// DefaultControlMark.
	ControlMark uint32
	// ProtectedPorts are the node's own TCP ports (the agent's /healthz
	// and metrics): on the node's addresses, no service takes or refuses
	// them, whatever the state says.
	ProtectedPorts []uint16
	// Flows, when set, passes the packets of established connections that
	// a router moved to this node on to the node that holds them, instead
	// of to a local endpoint that would refuse them (see flowChains).
	// agent/flows owns the interface and the routes.
	Flows *FlowRedirect
	// Conntrack clears stale UDP entries after a change; nil leaves them.
	Conntrack Conntrack
	// Log receives what the datapath cannot return as an error; nil discards.
	Log *slog.Logger
	// ElementsOverNft commits element changes through nft too, instead of
	// the netlink socket NewForNode keeps open for them: how every change
	// went before, kept to measure against (test/bench/datapath).
	ElementsOverNft bool
}

// FlowRedirect is where moved connections' packets go.
type FlowRedirect struct {
	// Interface is the device they leave by and arrive through.
	Interface string
	// Mark is the packet-mark bit that routes a packet to Interface; 0
	// means DefaultFlowMark.
	Mark uint32
}

// MasqueradeMode is a policy for the source address an endpoint sees.
type MasqueradeMode string

const (
	// MasqueradeKubeProxy is kube-proxy's: connections to node ports,
	// external IPs and load-balancer IPs of externalTrafficPolicy Cluster
	// services are masqueraded whatever their source; so are connections
	// to cluster IPs from outside the cluster CIDRs, connections from the
	// node itself to a Local service's external addresses, and a pod
	// reaching itself. The source an endpoint sees does not depend on the
	// node a connection happened to enter.
	MasqueradeKubeProxy MasqueradeMode = ""
	// MasqueradePreserveLocal keeps the client's address wherever the
	// reply comes back through the same node: only a pod reaching itself,
	// and a source outside the cluster sent to an endpoint on another
	// node, are masqueraded (as Cilium does). An endpoint then sees the
	// client's address or the node's depending on where it runs.
	MasqueradePreserveLocal MasqueradeMode = "preserve-local"
)

// LocalDetection is how the datapath tells traffic from the cluster's pods.
// Pods reaching a load-balancer, external IP or node port are sent to
// every endpoint (not only this node's, for a Local service), and, with
// kube-proxy's masquerading, keep their address to cluster IPs, where a
// source outside the cluster is masqueraded.
type LocalDetection struct {
	Mode LocalDetectionMode
	// Interface is the bridge (BridgeInterface) or the name prefix of the
	// pods' interfaces (InterfaceNamePrefix).
	Interface string
}

// LocalDetectionMode names kube-proxy's --detect-local-mode values.
type LocalDetectionMode string

const (
	// DetectClusterCIDR: sources in Config.ClusterCIDRs or the node's pod
	// CIDRs. Without either, nothing is local.
	DetectClusterCIDR LocalDetectionMode = "ClusterCIDR"
	// DetectNodeCIDR: sources in the node's own pod CIDRs.
	DetectNodeCIDR LocalDetectionMode = "NodeCIDR"
	// DetectBridgeInterface: packets that came in on the pods' bridge.
	DetectBridgeInterface LocalDetectionMode = "BridgeInterface"
	// DetectInterfaceNamePrefix: packets that came in on an interface
	// whose name starts with the prefix (veth pairs, one per pod).
	DetectInterfaceNamePrefix LocalDetectionMode = "InterfaceNamePrefix"
	// DetectNone: no source is local to the cluster.
	DetectNone LocalDetectionMode = "None"
)

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
	// elements commits the transactions of elements alone over netlink
	// (see elementWriter); nil to use nft for everything.
	elements *elementWriter

	mu sync.Mutex // guards everything below
	// needFull is set until a full sync succeeds: at start, and after any
	// failed transaction, when the kernel's state is no longer known here.
	needFull bool
	// tables is what is known of each family's table. The families are
	// committed in separate transactions, so one may move on while the
	// other fails: each keeps its own generation.
	tables   map[*family]*tableState
	node     NodeInfo
	services map[ServiceKey]*Service
	// live is every element of the tables, with how many services (and
	// the node) contribute it: a local endpoint may back several services.
	live map[elemID]liveElement
	// owned are the chains and sets each service has to itself.
	owned map[ServiceKey][]ownedObject
}

// tableState is what this Datapath knows of one family's table.
type tableState struct {
	// known is set while the table holds exactly what this Datapath
	// made; until then the next full sync lists the table's objects and
	// reads which generation its chains use.
	known bool
	gen   generation // the generation the chains read
	// picks counts, per pick that exists, the frontends in its set; a
	// pick goes in the transaction that drops its last one.
	picks map[pick]int
	// rebuild is set after a full sync of the family failed: the next one
	// replaces the whole table in one transaction, which no leftover,
	// damaged or foreign object can block.
	rebuild bool
}

type liveElement struct {
	value elemValue
	pick  pick // the pick whose set holds a frontend, if any
	refs  int32
}

// liveAt is a copy of the live element id, or nil.
func (d *Datapath) liveAt(id elemID) *liveElement {
	if le, ok := d.live[id]; ok {
		return &le
	}
	return nil
}

// sameAs: the element is written the same way as o.
func (e *liveElement) sameAs(o *liveElement) bool { return e.value == o.value && e.pick == o.pick }

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
	if cfg.MasqueradeMark&(cfg.MasqueradeMark-1) != 0 || cfg.MasqueradeMark < 2 {
		// One bit, with a free bit below it: Options.Validate says so to
		// the operator; a caller that skipped it gets the default.
		cfg.MasqueradeMark = DefaultMasqueradeMark
	}
	if cfg.ControlMark == 0 || cfg.ControlMark&(cfg.ControlMark-1) != 0 || cfg.ControlMark&(cfg.MasqueradeMark|cfg.MasqueradeMark>>1) != 0 {
		cfg.ControlMark = DefaultControlMark
	}
	if cfg.Flows != nil {
		fl := *cfg.Flows
		if fl.Mark == 0 || fl.Mark&(fl.Mark-1) != 0 || fl.Mark&(cfg.MasqueradeMark|cfg.MasqueradeMark>>1|cfg.ControlMark) != 0 {
			fl.Mark = DefaultFlowMark
		}
		cfg.Flows = &fl
	}
	if cfg.LocalDetection.Mode == "" {
		cfg.LocalDetection.Mode = DetectClusterCIDR
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	d := &Datapath{cfg: cfg, nft: map[*family][]knftables.Interface{}, lister: map[*family]knftables.Interface{},
		tables: map[*family]*tableState{}, needFull: true}
	if nftIPv4 != nil {
		d.nft[&ipv4] = []knftables.Interface{nftIPv4}
		d.lister[&ipv4] = nftIPv4
		d.tables[&ipv4] = &tableState{}
	}
	if nftIPv6 != nil {
		d.nft[&ipv6] = []knftables.Interface{nftIPv6}
		d.lister[&ipv6] = nftIPv6
		d.tables[&ipv6] = &tableState{}
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
		d.tables[f] = &tableState{}
	}
	if !cfg.ElementsOverNft {
		d.elements = newElementWriter()
	}
	return d, nil
}

// Apply makes the kernel forward exactly what state describes. Services are
// compared by pointer: a caller that replaces only changed *Service values
// gets a transaction proportional to the change. Apply keeps the *Service
// values and later works out again from them what each contributed, so a
// caller must never change a Service after handing it over. On error the
// kernel keeps forwarding on the last state applied successfully.
func (d *Datapath) Apply(ctx context.Context, state NodeState) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.needFull {
		return d.fullSync(ctx, state)
	}
	return d.partialSync(ctx, state)
}

// Resync rewrites the whole table from the last state given to Apply,
// repairing anything someone else changed, added or deleted: the table is
// listed again first.
func (d *Datapath) Resync(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.forget()
	return d.fullSync(ctx, NodeState{Node: d.node, Services: d.services})
}

// Cleanup deletes both tables and everything in them, as kube-proxy's
// --cleanup does; a missing table is no error.
func (d *Datapath) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.needFull = true
	d.forget()
	var errs []error
	for _, f := range d.families() {
		tx := d.nft[f][0].NewTransaction()
		// Adding first makes the delete work whether or not it exists.
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
		if err := d.nft[f][0].Run(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s table %q: %w", f, TableName, err))
		}
	}
	return errors.Join(errs...)
}

// Forwarding reports whether a table that forwards is in place (an earlier
// agent's), read from the kernel: what a restarting BGP speaker tells its
// routers as its forwarding state. Call it before the first Apply.
func (d *Datapath) Forwarding(ctx context.Context) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.families() {
		if chains, err := d.lister[f].List(ctx, "chain"); err == nil && liveGeneration(chains) != "" {
			return true
		}
	}
	return false
}

// forget marks every table as unknown: the next full sync lists it.
func (d *Datapath) forget() {
	for _, t := range d.tables {
		t.known = false
	}
}

// families are the families this Datapath programs, IPv4 first.
func (d *Datapath) families() []*family {
	var out []*family
	for _, f := range []*family{&ipv4, &ipv6} {
		if d.nft[f] != nil {
			out = append(out, f)
		}
	}
	return out
}

// desired is a whole state as elements and objects, per family.
type desired struct {
	live    map[elemID]liveElement
	owned   map[ServiceKey][]ownedObject
	objects map[*family][]ownedObject
	picks   map[*family]map[pick]int // picks, with the frontends of each
	counts  map[*family]int          // elements, per family
}

// elements yields f's elements, made again from the live ones.
func (w *desired) elements(f *family) iter.Seq[element] {
	return func(yield func(element) bool) {
		for id, le := range w.live {
			if id.fam == f.index && !yield(element{elemID: id, value: le.value, pick: le.pick}) {
				return
			}
		}
	}
}

func (d *Datapath) desire(state NodeState) *desired {
	// Sized for the usual dozen elements a service contributes.
	w := &desired{
		live:    make(map[elemID]liveElement, 12*len(state.Services)),
		owned:   map[ServiceKey][]ownedObject{},
		objects: map[*family][]ownedObject{},
		picks:   map[*family]map[pick]int{},
		counts:  map[*family]int{},
	}
	for _, f := range d.families() {
		w.picks[f] = map[pick]int{}
	}
	collect := func(es []element) {
		for _, e := range es {
			if le, ok := w.live[e.elemID]; ok {
				le.refs++
				w.live[e.elemID] = le
				continue
			}
			w.live[e.elemID] = liveElement{value: e.value, pick: e.pick, refs: 1}
			f := e.family()
			w.counts[f]++
			if e.pick.exists() && w.picks[f] != nil {
				w.picks[f][e.pick]++
			}
		}
	}
	collect(nodeElements(state.Node, d.cfg))
	for key, svc := range state.Services {
		c := serviceContribution(svc, state.Node, d.cfg.MasqueradeMark)
		collect(c.elems)
		if len(c.owned) > 0 {
			w.owned[key] = c.owned
			for _, o := range c.owned {
				w.objects[o.family] = append(w.objects[o.family], o)
			}
		}
	}
	return w
}

// fullSync makes each family's table hold exactly state, whatever it held
// before: an older agent's generation, an older layout, a half-finished
// sync, foreign or damaged objects. The families go in parallel, each on
// its own; the state counts as applied only when both succeed.
func (d *Datapath) fullSync(ctx context.Context, state NodeState) error {
	d.needFull = true
	// What the last state was is not needed for a whole one: let it go
	// before the new one takes the same memory again.
	d.live, d.owned = nil, nil
	start := time.Now()
	w := d.desire(state)
	d.cfg.Log.Debug("whole state worked out", "services", len(state.Services), "elements", len(w.live), "took", time.Since(start))
	fams := d.families()
	errs := make([]error, len(fams))
	var wg sync.WaitGroup
	for i, f := range fams {
		wg.Go(func() { errs[i] = d.syncFamily(ctx, f, w) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.needFull = false
	d.live, d.owned = w.live, w.owned
	d.node, d.services = state.Node, maps.Clone(state.Services)
	// Only after the rules are in: a flow cleared earlier could be
	// re-created on the old path.
	d.clearNotDNATedUDP(ctx)
	return nil
}

// syncFamily is one family's full sync: a generation switch, or when that
// fails (or failed last time) a rebuild. It records the outcome in the
// family's tableState.
func (d *Datapath) syncFamily(ctx context.Context, f *family, w *desired) error {
	t := d.tables[f]
	var err error
	if !t.rebuild {
		err = d.switchGeneration(ctx, f, w)
	}
	if t.rebuild || (err != nil && ctx.Err() == nil) {
		// The table holds something the switch could not get past
		// (errTableUnknown, an object in the way): replace it whole.
		if err != nil {
			d.cfg.Log.Warn("generation switch failed; replacing the table", "family", f.String(), "error", err)
		}
		err = d.rebuild(ctx, f, w)
	}
	if err != nil {
		t.known = false
		t.rebuild = ctx.Err() == nil
		return err
	}
	t.known, t.rebuild, t.picks = true, false, w.picks[f]
	return nil
}

// switchGeneration loads w into the generation the table's chains do not
// use, while that one keeps forwarding, and switches over:
//  1. one transaction creates the table, the new generation's empty sets
//     and maps, any missing chain, and the services' own objects;
//  2. the elements load in chunks, in parallel;
//  3. one transaction points every chain at the new generation and empties
//     every chain that is not Weir's now;
//  4. a last transaction deletes the old generation and whatever else is
//     not Weir's now: objects that are no longer referenced only after the
//     switch, as kube-proxy deletes stale chains a sync after flushing them.
//
// A failure before step 3 leaves the old generation forwarding; a failure
// of step 4 leaves forwarding right and only litter, retried later.
func (d *Datapath) switchGeneration(ctx context.Context, f *family, w *desired) error {
	t := d.tables[f]
	start := time.Now()
	existing, err := d.existingObjects(ctx, f)
	if err != nil {
		return err
	}
	listed := time.Since(start)
	next := t.gen.other()
	picks := w.picks[f]

	// 1. Prepare.
	tx := d.nft[f][0].NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules for Kubernetes-style services, owned by weir-agent")})
	for _, obj := range tableSets(*f, next) {
		// Fresh, even if a failed sync left one behind.
		tx.Add(obj)
		tx.Delete(obj)
		tx.Add(obj)
	}
	for _, c := range flowCounters(d.cfg) {
		tx.Add(c) // an existing counter keeps its count
	}
	for p := range picks {
		obj := p.object(*f, next)
		tx.Add(obj)
		tx.Delete(obj)
		tx.Add(obj)
	}
	for _, c := range tableChains(*f, d.cfg, next, picks) {
		tx.Add(c.chain)
		if c.base() {
			// Base chains only jump to fixed chains: rewriting them
			// here changes nothing for packets.
			writeChain(tx, c, next)
		}
	}
	if c := planOwned(nil, w.objects[f])[f]; c != nil {
		c.render(tx)
	}
	if err := d.run(ctx, f, tx); err != nil {
		return err
	}

	prepared := time.Since(start)

	// 2. Load.
	if err := d.load(ctx, f, w.elements(f), next); err != nil {
		return err
	}
	loaded := time.Since(start)

	// 3. Switch.
	tx = d.nft[f][0].NewTransaction()
	keep := map[string]bool{}
	for _, c := range tableChains(*f, d.cfg, next, picks) {
		keep[c.chain.Name] = true
		if !c.base() {
			writeChain(tx, c, next)
		}
	}
	for _, obj := range tableSets(*f, next) {
		keep[setName(obj)] = true
	}
	for p := range picks {
		keep[next.of(p.set())] = true
	}
	for _, o := range w.objects[f] {
		keep[o.name] = true
	}
	tx.Add(&knftables.Chain{Name: next.marker()})
	keep[next.marker()] = true
	if slices.Contains(existing.chains, next.other().marker()) {
		tx.Delete(&knftables.Chain{Name: next.other().marker()})
		existing.chains = slices.DeleteFunc(existing.chains, func(c string) bool { return c == next.other().marker() })
	}
	// Emptied now, so that nothing they hold refers to what goes next.
	for _, name := range existing.chains {
		if !keep[name] {
			tx.Flush(&knftables.Chain{Name: name})
		}
	}
	if err := d.nft[f][0].Run(ctx, tx); err != nil {
		return fmt.Errorf("programming %s table %q: %w", f, TableName, err)
	}
	t.gen = next
	switched := time.Since(start)

	// 4. Delete: maps first (an older layout's verdict maps jump to
	// chains that may go), then sets, then chains. Anonymous sets and
	// maps ("__map0") belong to rules and go with them.
	var gone []knftables.Object
	for _, name := range existing.maps {
		if !keep[name] && !strings.HasPrefix(name, "__") {
			gone = append(gone, &knftables.Map{Name: name})
		}
	}
	for _, name := range existing.sets {
		if !keep[name] && !strings.HasPrefix(name, "__") {
			gone = append(gone, &knftables.Set{Name: name})
		}
	}
	for _, name := range existing.chains {
		if !keep[name] {
			gone = append(gone, &knftables.Chain{Name: name})
		}
	}
	d.deleteObjects(ctx, f, gone)
	d.cfg.Log.Debug("generation switched", "family", f.String(), "generation", string(next), "elements", w.counts[f],
		"listed", listed, "prepared", prepared, "loaded", loaded, "switched", switched, "deleted", time.Since(start))
	return nil
}

// deleteObjects deletes what the table no longer needs, in one transaction
// or, when that fails, one by one: an object something unexpected still
// refers to stays, logged, and the table is listed again at the next full
// sync. Forwarding is right either way.
func (d *Datapath) deleteObjects(ctx context.Context, f *family, objs []knftables.Object) {
	if len(objs) == 0 {
		return
	}
	nft := d.nft[f][0]
	tx := nft.NewTransaction()
	for _, o := range objs {
		tx.Delete(o)
	}
	if nft.Run(ctx, tx) == nil {
		return
	}
	for _, o := range objs {
		tx := nft.NewTransaction()
		tx.Delete(o)
		if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
			d.cfg.Log.Warn("a stale object of the table could not be deleted; retried at the next full sync",
				"family", f.String(), "object", fmt.Sprintf("%T %s", o, objectName(o)), "error", err)
			d.tables[f].known = false
		}
	}
}

// rebuild replaces the family's table in one transaction: delete it with
// everything in it, create it with w. Atomic for packets (and conntrack
// keeps every established flow), but nft parses the whole state at once,
// so it is the way out of a table the generation switch could not handle,
// not the usual way.
func (d *Datapath) rebuild(ctx context.Context, f *family, w *desired) error {
	const g = genA
	nft := d.nft[f][0]
	tx := nft.NewTransaction()
	table := &knftables.Table{Comment: knftables.PtrTo("rules for Kubernetes-style services, owned by weir-agent")}
	tx.Add(table)
	tx.Delete(table)
	tx.Add(table)
	for _, obj := range tableSets(*f, g) {
		tx.Add(obj)
	}
	for p := range w.picks[f] {
		tx.Add(p.object(*f, g))
	}
	for _, c := range flowCounters(d.cfg) {
		tx.Add(c)
	}
	chains := tableChains(*f, d.cfg, g, w.picks[f])
	for _, c := range chains {
		tx.Add(c.chain)
	}
	tx.Add(&knftables.Chain{Name: g.marker()})
	if c := planOwned(nil, w.objects[f])[f]; c != nil {
		c.render(tx)
	}
	for _, c := range chains {
		writeChain(tx, c, g)
	}
	for e := range w.elements(f) {
		tx.Add(e.object(g))
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("replacing %s table %q: %w", f, TableName, err)
	}
	d.tables[f].gen = g
	return nil
}

// writeChain (re)writes a fixed chain's rules. The rules of the chains
// that read a generation carry its name as their comment, for whoever
// reads the ruleset.
func writeChain(tx *knftables.Transaction, c chainSpec, g generation) {
	tx.Flush(c.chain)
	for _, r := range c.rules {
		rule := &knftables.Rule{Chain: c.chain.Name, Rule: r}
		if !c.base() {
			rule.Comment = knftables.PtrTo(g.comment())
		}
		tx.Add(rule)
	}
}

// tableObjects names what a family's table holds.
type tableObjects struct{ chains, sets, maps []string }

// existingObjects names what the family's table holds: listed while the
// table is not known (an older agent, an older layout or someone else may
// have left anything), from memory otherwise.
func (d *Datapath) existingObjects(ctx context.Context, f *family) (tableObjects, error) {
	t := d.tables[f]
	if !t.known {
		return d.listObjects(ctx, f)
	}
	objs := tableObjects{chains: []string{t.gen.marker()}}
	for _, c := range tableChains(*f, d.cfg, t.gen, nil) {
		objs.chains = append(objs.chains, c.chain.Name)
	}
	for p := range t.picks {
		objs.sets = append(objs.sets, t.gen.of(p.set()))
	}
	for _, obj := range tableSets(*f, t.gen) {
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
	return objs, nil
}

// listObjects lists the names of the family's objects (never their
// contents, which is what makes a listing slow) and learns from them which
// generation forwards, into the family's tableState, or fails with
// errTableUnknown.
func (d *Datapath) listObjects(ctx context.Context, f *family) (tableObjects, error) {
	var objs tableObjects
	for _, l := range []struct {
		kind string
		into *[]string
	}{{"chain", &objs.chains}, {"set", &objs.sets}, {"map", &objs.maps}} {
		names, err := d.lister[f].List(ctx, l.kind)
		if err != nil && !knftables.IsNotFound(err) {
			return objs, fmt.Errorf("listing %s %ss: %w", f, l.kind, err)
		}
		*l.into = names
		if len(objs.chains) == 0 {
			// No chains: no table of ours (Weir's always has chains),
			// and the netlink lister fails on sets of a missing table.
			break
		}
	}
	t := d.tables[f]
	if len(objs.chains) == 0 {
		t.gen = genB // nothing forwards: load generation a
		return objs, nil
	}
	g := liveGeneration(objs.chains)
	if g == "" {
		return objs, errTableUnknown
	}
	t.gen = g
	return objs, nil
}

// errTableUnknown: the table has no single generation marker (an older
// agent's table, or one someone changed), so the switch cannot tell which
// generation to leave alone; the table is rebuilt instead.
var errTableUnknown = errors.New("the table names no live generation")

// liveGeneration is the generation whose marker chain is among chains, or
// "" when neither or both are.
func liveGeneration(chains []string) generation {
	a, b := slices.Contains(chains, genA.marker()), slices.Contains(chains, genB.marker())
	switch {
	case a && !b:
		return genA
	case b && !a:
		return genB
	}
	return ""
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

func objectName(obj knftables.Object) string {
	if c, ok := obj.(*knftables.Chain); ok {
		return c.Name
	}
	return setName(obj)
}

// load adds a family's elements to generation g: over the element
// writer's netlink socket when the Datapath has one (all but the interval
// sets' few), else through nft in chunks, spread over the family's
// interfaces so that several nft processes parse at once.
func (d *Datapath) load(ctx context.Context, f *family, elems iter.Seq[element], g generation) error {
	if d.elements != nil {
		rest, ok, err := d.elements.load(f, g, elems)
		if err != nil {
			return fmt.Errorf("loading %s table %q: %w", f, TableName, err)
		}
		if ok {
			elems = slices.Values(rest)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	chunks := make(chan []element)
	for _, nft := range d.nft[f] {
		wg.Go(func() {
			for c := range chunks {
				tx := nft.NewTransaction()
				for _, e := range c {
					tx.Add(e.object(g))
				}
				if err := nft.Run(ctx, tx); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("loading %s table %q: %w", f, TableName, err))
					mu.Unlock()
				}
			}
		})
	}
	var chunk []element
	for e := range elems {
		if chunk = append(chunk, e); len(chunk) == FullSyncChunk {
			chunks <- chunk
			chunk = nil
		}
	}
	if len(chunk) > 0 {
		chunks <- chunk
	}
	close(chunks)
	wg.Wait()
	return errors.Join(errs...)
}

// run commits one family's transaction, atomically.
func (d *Datapath) run(ctx context.Context, f *family, tx *knftables.Transaction) error {
	if err := d.nft[f][0].Run(ctx, tx); err != nil {
		return fmt.Errorf("programming %s table %q: %w", f, TableName, err)
	}
	return nil
}

func nodeInfoEqual(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Zone == b.Zone && a.Deleting == b.Deleting && a.Drained == b.Drained && a.DrainDeadline.Equal(b.DrainDeadline) && a.Excluded == b.Excluded && a.Registered == b.Registered &&
		slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.PodCIDRs, b.PodCIDRs) && slices.Equal(a.BGPPeers, b.BGPPeers) &&
		slices.EqualFunc(a.Advertisements, b.Advertisements, BGPAdvertisement.Equal) && slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs) &&
		slices.EqualFunc(a.L2Pools, b.L2Pools, L2Pool.Equal) && a.FlowRing == b.FlowRing &&
		slices.EqualFunc(a.FlowPeers, b.FlowPeers, FlowPeer.Equal)
}

// FlowCounts is what the rules of moved connections counted on this node,
// both families together, since its table was made.
type FlowCounts struct {
	// PassedPackets and PassedConnections were passed on to the next
	// node of the ring.
	PassedPackets, PassedConnections uint64
	// TakenPackets were passed here by peers and served here, the node
	// holding their connection: by how many nodes they crossed, 1, 2, 3,
	// and 4 or more.
	TakenPackets [4]uint64
	// UnownedPackets went round the ring (or found no ring) and were
	// served here as new: their endpoint refuses them.
	UnownedPackets uint64
}

// FlowCounts reads the counters of moved connections. It does not wait
// for an apply in progress: the counters are read from the kernel.
func (d *Datapath) FlowCounts(ctx context.Context) (FlowCounts, error) {
	var out FlowCounts
	if d.cfg.Flows == nil {
		return out, nil
	}
	slot := map[string]*uint64{
		counterPassedPackets: &out.PassedPackets, counterPassedConnections: &out.PassedConnections,
		counterTaken1: &out.TakenPackets[0], counterTaken2: &out.TakenPackets[1], counterTaken3: &out.TakenPackets[2], counterTakenMore: &out.TakenPackets[3],
		counterUnowned: &out.UnownedPackets,
	}
	for _, f := range d.families() {
		counters, err := d.nft[f][0].ListCounters(ctx)
		if err != nil && !knftables.IsNotFound(err) {
			return FlowCounts{}, fmt.Errorf("counters of the %s table: %w", f, err)
		}
		for _, c := range counters {
			if c == nil {
				continue // knftables' Fake lists some
			}
			if p := slot[c.Name]; p != nil && c.Packets != nil {
				*p += *c.Packets
			}
		}
	}
	return out, nil
}

// RepairIfGone rewrites the whole table from the last state applied when
// a family's table, or the marker of the generation its chains read, is
// no longer there: someone flushed the ruleset (an nftables service
// reloading, `nft flush ruleset` by hand) and the node forwards nothing it
// should until the next resync. It reports whether it rewrote anything;
// before the first successful apply it checks nothing.
func (d *Datapath) RepairIfGone(ctx context.Context) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.needFull {
		return false, nil
	}
	var gone []string
	for _, f := range d.families() {
		t := d.tables[f]
		if !t.known || t.gen == "" {
			return false, nil
		}
		chains, err := d.lister[f].List(ctx, "chain")
		if err != nil && !knftables.IsNotFound(err) {
			return false, fmt.Errorf("listing the %s table: %w", f, err)
		}
		if !slices.Contains(chains, t.gen.marker()) {
			gone = append(gone, f.String())
		}
	}
	if len(gone) == 0 {
		return false, nil
	}
	d.cfg.Log.Warn("the table is gone (someone flushed the ruleset?): rewriting it from the last state", "families", gone)
	d.forget()
	return true, d.fullSync(ctx, NodeState{Node: d.node, Services: d.services})
}
