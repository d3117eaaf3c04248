package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/weirlb/weir/datapath/internal/nfwire"
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
}

// FlowRedirect is where moved connections' packets go.
type FlowRedirect struct {
	// Interface is the device they leave by and arrive through.
	Interface string
	// Mark is the packet-mark bit that routes a packet to Interface; 0
	// means DefaultFlowMark.
	Mark uint32
	// Port is the UDP port the nodes' devices exchange packets on: only
	// the nodes that pass packets to this one (NodeInfo.FlowSenders) may
	// send to it. 0 means DefaultFlowPort.
	Port uint16
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
	// The first also lists object names, over netlink where it can (see
	// NewForNode), because nft reads every element of the table to list
	// even just the names.
	nft map[*family][]knftables.Interface
	// elements commits the transactions of elements alone over netlink
	// (see elementWriter); nil to use nft for everything.
	elements *elementWriter
	// chunk is how many elements a full sync loads through nft at once.
	chunk int

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
	live liveSet
	// owned are the chains and sets each service has to itself.
	owned map[ServiceKey][]ownedObject
	// pending is a state adopted whose live elements, owned objects and
	// picks' counts are yet to be worked out (see settle).
	pending *NodeState
}

// tableState is what this Datapath knows of one family's table.
type tableState struct {
	// known is set while the table holds exactly what this Datapath
	// made; until then the next full sync lists the table's objects and
	// reads which generation its chains use.
	known bool
	gen   generation // the generation the chains read
	// marker is the name of the generation's marker chain, which carries
	// digest: the whole table, summed up (see adopt.go).
	marker string
	digest digest
	// adopted: the last full sync found the table holding the state, and
	// took it as it was (see adopt.go).
	adopted bool
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
	if le, ok := d.live.get(id); ok {
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
		if fl.Port == 0 {
			fl.Port = DefaultFlowPort
		}
		cfg.Flows = &fl
	}
	if cfg.LocalDetection.Mode == "" {
		cfg.LocalDetection.Mode = DetectClusterCIDR
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	d := &Datapath{cfg: cfg, nft: map[*family][]knftables.Interface{},
		tables: map[*family]*tableState{}, needFull: true, chunk: FullSyncChunk}
	if nftIPv4 != nil {
		d.nft[&ipv4] = []knftables.Interface{nftIPv4}
		d.tables[&ipv4] = &tableState{}
	}
	if nftIPv6 != nil {
		d.nft[&ipv6] = []knftables.Interface{nftIPv6}
		d.tables[&ipv6] = &tableState{}
	}
	return d
}

// NewForNode opens the real nftables tables of the current network
// namespace. Opening one costs two nft runs (knftables checks the binary
// and the kernel), which run in the background: the first apply lists the
// table, creates its sets and loads its elements over netlink meanwhile,
// and whatever needs nft waits for them (see opening). The first interface
// of each family, which lists objects over netlink where it can, also runs
// every transaction; without the element writer, a full sync loads through
// nft, with one process per CPU. NewForNode fails only when there is no
// nft to run; an interface that fails to open fails the calls on it, each
// of which tries to open it again.
func NewForNode(cfg Config) (*Datapath, error) { return newForNode(cfg, false) }

// newForNode is NewForNode; elementsOverNft commits element changes
// through nft too, instead of the netlink socket it keeps open for them:
// how every change went before, kept to measure against (package
// benchhook, for test/bench/datapath).
func newForNode(cfg Config, elementsOverNft bool) (*Datapath, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	if cfg.Conntrack == nil {
		cfg.Conntrack = &ConntrackTool{}
	}
	d := New(nil, nil, cfg)
	loaders := 1
	if elementsOverNft {
		loaders = max(2, min(runtime.NumCPU(), 4))
	}
	for _, f := range families {
		d.nft[f] = make([]knftables.Interface, loaders)
		for j := range loaders {
			d.nft[f][j] = startOpening(f, func() (knftables.Interface, error) {
				if j == 0 {
					// Listing over netlink where the kernel allows it;
					// through nft where it does not.
					if nft, err := knftables.New(f.nft, TableName, knftables.UseNetlink); err == nil {
						return nft, nil
					}
				}
				nft, err := knftables.New(f.nft, TableName)
				if err != nil {
					return nil, fmt.Errorf("nftables for %s: %w", f, err)
				}
				return nft, nil
			})
		}
		d.tables[f] = &tableState{}
	}
	if !elementsOverNft {
		d.elements = newElementWriter()
	}
	return d, nil
}

// opening is a knftables interface opened in the background: each call
// waits for it. When opening fails, the call fails, and the next call
// tries again.
type opening struct {
	done   chan struct{} // closed when the first attempt ends
	family *family
	open   func() (knftables.Interface, error)

	mu  sync.Mutex
	nft knftables.Interface
	err error
}

func startOpening(f *family, open func() (knftables.Interface, error)) *opening {
	o := &opening{done: make(chan struct{}), family: f, open: open}
	go func() {
		defer close(o.done)
		nft, err := open()
		o.mu.Lock()
		o.nft, o.err = nft, err
		o.mu.Unlock()
	}()
	return o
}

// get is the interface, once open.
func (o *opening) get(ctx context.Context) (knftables.Interface, error) {
	select {
	case <-o.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.nft != nil {
		return o.nft, nil
	}
	err := o.err
	if o.nft, o.err = o.open(); o.err == nil {
		return o.nft, nil
	}
	return nil, err
}

// NewTransaction makes a transaction for the family's table; when the
// interface does not open, one that Run refuses.
func (o *opening) NewTransaction() *knftables.Transaction {
	nft, err := o.get(context.Background())
	if err != nil {
		return knftables.NewFake(o.family.nft, TableName).NewTransaction()
	}
	return nft.NewTransaction()
}

func (o *opening) Run(ctx context.Context, tx *knftables.Transaction) error {
	nft, err := o.get(ctx)
	if err != nil {
		return err
	}
	return nft.Run(ctx, tx)
}

func (o *opening) Check(ctx context.Context, tx *knftables.Transaction) error {
	nft, err := o.get(ctx)
	if err != nil {
		return err
	}
	return nft.Check(ctx, tx)
}

func (o *opening) ListAll(ctx context.Context) (map[string][]string, error) {
	nft, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return nft.ListAll(ctx)
}

func (o *opening) List(ctx context.Context, objectType string) ([]string, error) {
	nft, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return nft.List(ctx, objectType)
}

func (o *opening) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	nft, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return nft.ListRules(ctx, chain)
}

func (o *opening) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	nft, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return nft.ListElements(ctx, objectType, name)
}

func (o *opening) ListCounters(ctx context.Context) ([]*knftables.Counter, error) {
	nft, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return nft.ListCounters(ctx)
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
		return d.fullSync(ctx, state, true)
	}
	d.settle()
	if d.needFull {
		return d.fullSync(ctx, state, false)
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
	return d.fullSync(ctx, NodeState{Node: d.node, Services: d.services}, false)
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
		if chains, err := d.nft[f][0].List(ctx, "chain"); err == nil {
			if _, ok := liveMarker(chains); ok {
				return true
			}
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

func nodeInfoEqual(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Zone == b.Zone && a.Deleting == b.Deleting && a.Drained == b.Drained && a.DrainDeadline.Equal(b.DrainDeadline) && a.Excluded == b.Excluded && a.Registered == b.Registered &&
		slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.PodCIDRs, b.PodCIDRs) && slices.EqualFunc(a.BGPPeers, b.BGPPeers, BGPPeer.Equal) &&
		slices.EqualFunc(a.Advertisements, b.Advertisements, BGPAdvertisement.Equal) && slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs) &&
		slices.EqualFunc(a.L2Pools, b.L2Pools, L2Pool.Equal) && a.FlowRing == b.FlowRing &&
		slices.EqualFunc(a.FlowPeers, b.FlowPeers, FlowPeer.Equal) && slices.EqualFunc(a.FlowSenders, b.FlowSenders, FlowPeer.Equal)
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
	// RefusedNotAPeer reached the tunnel's UDP port from an address that
	// is none of FlowSenders'; RefusedNotPassedOn came through the tunnel
	// but are nothing a peer passes on. Both were dropped.
	RefusedNotAPeer, RefusedNotPassedOn uint64
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
		counterUnowned: &out.UnownedPackets, counterRefusedNotAPeer: &out.RefusedNotAPeer, counterRefusedNotPassedOn: &out.RefusedNotPassedOn,
	}
	for _, f := range d.families() {
		packets, err := d.counters(ctx, f)
		if err != nil {
			return FlowCounts{}, fmt.Errorf("counters of the %s table: %w", f, err)
		}
		for name, n := range packets {
			if p := slot[name]; p != nil {
				*p += n
			}
		}
	}
	return out, nil
}

// counters are the packets each named counter of f's table counted (none
// when there is no table). Over netlink when the node has it: nft lists
// the whole table to print a counter, seconds of CPU at 10,000 services.
func (d *Datapath) counters(ctx context.Context, f *family) (map[string]uint64, error) {
	packets := map[string]uint64{}
	if d.elements != nil {
		rd, err := nfwire.NewReader()
		if err != nil {
			return nil, err
		}
		defer rd.Close()
		counters, err := rd.Counters(f.wire, TableName)
		if err != nil {
			return nil, err
		}
		for name, c := range counters {
			packets[name] = c.Packets
		}
		return packets, nil
	}
	counters, err := d.nft[f][0].ListCounters(ctx)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, err
	}
	for _, c := range counters {
		if c != nil && c.Packets != nil { // knftables' Fake lists nil ones
			packets[c.Name] = *c.Packets
		}
	}
	return packets, nil
}

// chainNames are the names of f's table's chains (none when there is no
// table): over netlink when the node has it, as nft would list them but
// without starting nft, which costs more the bigger the table.
func (d *Datapath) chainNames(ctx context.Context, f *family) ([]string, error) {
	if d.elements != nil {
		if objs, ok, err := d.elements.list(f); ok {
			return objs.chains, err
		}
	}
	chains, err := d.nft[f][0].List(ctx, "chain")
	if knftables.IsNotFound(err) {
		return nil, nil
	}
	return chains, err
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
		chains, err := d.chainNames(ctx, f)
		if err != nil {
			return false, fmt.Errorf("listing the %s table: %w", f, err)
		}
		if !slices.Contains(chains, t.marker) {
			gone = append(gone, f.String())
		}
	}
	if len(gone) == 0 {
		return false, nil
	}
	d.cfg.Log.Warn("the table is gone (someone flushed the ruleset?): rewriting it from the last state", "families", gone)
	d.forget()
	return true, d.fullSync(ctx, NodeState{Node: d.node, Services: d.services}, false)
}
