// Package flows carries the packets of moved connections from node to node.
// When a router moves an established connection to a node that holds no
// entry for it, the datapath marks the packet (datapath.FlowRedirect); the
// routes here send marked packets, unchanged, through a VXLAN device to the
// next node of the ring (nodestate.FlowRing), whose own device hands them
// to its datapath. VXLAN keeps the load-balancer IP as the destination
// across any network between the nodes, and the device a packet arrives
// by tells a node that a peer sent it.
package flows

import (
	"context"
	"hash/fnv"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/weirlb/weir/datapath"
)

// Defaults of Config.
const (
	DefaultInterface = "weir-flows"
	DefaultPort      = datapath.DefaultFlowPort
	DefaultVNI       = 7449
	// DefaultTable is the routing table of marked packets; the rules
	// that pick it have priorities DefaultTable-1 and DefaultTable.
	DefaultTable = 7449
)

// Config says where moved packets go.
type Config struct {
	Interface string
	Port      int
	VNI       int
	Table     int
	// Mark is the datapath's FlowRedirect.Mark.
	Mark uint32
	Log  *slog.Logger
}

// Flows owns the device, its forwarding and neighbour entries, the table of
// marked packets and the two rules that select it. Set is idempotent and
// repairs what it finds wrong.
type Flows struct {
	cfg    Config
	kernel kernel // programs what Set decides: netlink, or a fake in tests

	mu     sync.Mutex
	local  netip.Addr // the device's outer address
	next   datapath.FlowPeer
	routed [2]bool // per family (IPv4, IPv6): a route to the next node
	// node is the last node Set was given, to choose again when a peer
	// stops or starts answering.
	node datapath.NodeInfo
	// Probing (see Run): when each peer's address last answered, when
	// its table last marked an answer as its own (a peer whose table
	// never did runs an agent that predates the mark), and which peers
	// are passed over; started is when probing began, before which every
	// peer counts as alive.
	answers, tableAnswers map[netip.Addr]time.Time
	dead                  map[string]bool
	started               time.Time
	// deaf: the last judgement heard no peer at all, and left the
	// verdicts before it in place.
	deaf bool
}

// New returns Flows for cfg, with defaults for zero fields.
func New(cfg Config) *Flows {
	if cfg.Interface == "" {
		cfg.Interface = DefaultInterface
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.VNI == 0 {
		cfg.VNI = DefaultVNI
	}
	if cfg.Table == 0 {
		cfg.Table = DefaultTable
	}
	if cfg.Mark == 0 {
		cfg.Mark = datapath.DefaultFlowMark
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Flows{cfg: cfg, kernel: netlinkKernel{cfg: cfg}}
}

// Redirect is what the datapath needs to know of the device: its name, the
// mark that routes to it, and the port its peers send to (which the
// datapath closes to all but them).
func (f *Flows) Redirect() *datapath.FlowRedirect {
	return &datapath.FlowRedirect{Interface: f.cfg.Interface, Mark: f.cfg.Mark, Port: uint16(f.cfg.Port)}
}

// MAC is the hardware address of a node's device whose outer address is
// addr: every node works out its peers' without asking them.
func MAC(addr netip.Addr) net.HardwareAddr {
	h := fnv.New32a()
	h.Write(addr.AsSlice())
	s := h.Sum32()
	// Locally administered, unicast.
	return net.HardwareAddr{0x02, 0x77, byte(s >> 24), byte(s >> 16), byte(s >> 8), byte(s)}
}

// linkLocal is the IPv6 link-local address that names a peer's device as
// a gateway on this node's device (the modified EUI-64 of its MAC).
func linkLocal(mac net.HardwareAddr) netip.Addr {
	return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 8: mac[0] ^ 0x02, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]})
}

// outer is the address a node's device sends and receives on: its IPv4
// next hop, or its IPv6 one without.
func outer(addrs []netip.Addr) (netip.Addr, bool) {
	if a, ok := datapath.NextHop(addrs, false); ok {
		return a, true
	}
	return datapath.NextHop(addrs, true)
}

// Set makes the node send marked packets to the first of its ring's next
// peers that it can reach with the node's outer family, and returns the
// node as the datapath must program it: without a ring (FlowRing 0) when
// nothing can be sent, so that no packet is marked for a route that does
// not exist.
func (f *Flows) Set(node datapath.NodeInfo) (datapath.NodeInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node = node
	return f.setLocked(node)
}

func (f *Flows) setLocked(node datapath.NodeInfo) (datapath.NodeInfo, error) {
	p, ok := f.choose(node)
	if !ok {
		return f.stop(node)
	}
	routed, err := f.program(p)
	if err != nil {
		node.FlowRing, node.FlowPeers = 0, nil
		return node, err
	}
	if f.next.Name != p.next.Name || f.local != p.local {
		f.cfg.Log.Info("moved connections go to the next node", "next", p.next.Name, "via", p.nextOuter, "ring", node.FlowRing, "not_answering", f.passedOver(node))
	}
	f.local, f.next, f.routed = p.local, p.next, routed
	// The datapath marks only packets of a family with a route.
	node.FlowPeers = []datapath.FlowPeer{{Name: p.next.Name, Addresses: slices.DeleteFunc(slices.Clone(p.next.Addresses), func(a netip.Addr) bool {
		return !routed[boolIndex(a.Is6())]
	})}}
	return node, nil
}

// path is where moved packets go: from the node's outer address (and its
// own IPv4 address, which the device holds) to the next peer's device.
type path struct {
	local, own4 netip.Addr
	next        datapath.FlowPeer
	nextOuter   netip.Addr
	// probed are the outer addresses of every peer the probes ask.
	probed []netip.Addr
}

// choose picks the first alive peer of the ring that the node's outer
// family reaches, the first reachable one when none is alive. It is false
// when nothing can be sent: no ring, or no peer of the family.
func (f *Flows) choose(node datapath.NodeInfo) (path, bool) {
	local, ok := outer(node.Addresses)
	if !ok || node.FlowRing < 2 {
		return path{}, false
	}
	p := path{local: local}
	p.own4, _ = datapath.NextHop(node.Addresses, false)
	for _, peer := range node.FlowPeers {
		a, ok := outer(peer.Addresses)
		if !ok || a.Is4() != local.Is4() {
			continue
		}
		p.probed = append(p.probed, a)
		if !p.nextOuter.IsValid() || f.dead[p.next.Name] && !f.dead[peer.Name] {
			p.next, p.nextOuter = peer, a
		}
	}
	return p, p.nextOuter.IsValid()
}

// gateway is the family's gateway to the next peer's device: its address
// for IPv4; for IPv6 the link-local address of its device, because the
// kernel refuses an IPv6 gateway that the main table reaches by another
// device.
func (p path) gateway(is6 bool) (netip.Addr, bool) {
	gw, ok := datapath.NextHop(p.next.Addresses, is6)
	if ok && is6 {
		gw = linkLocal(MAC(p.nextOuter))
	}
	return gw, ok
}

// program makes the kernel send marked packets along p, and says which
// families have a route.
func (f *Flows) program(p path) (routed [2]bool, err error) {
	link, err := f.kernel.device(p.local, p.own4)
	if err != nil {
		return routed, err
	}
	// Every next node the probes ask must be reachable through the
	// device, not only the one packets go to now: without a forwarding
	// entry the device drops the probe, and a live node would be
	// passed over for good.
	for _, a := range p.probed {
		if err := f.kernel.forwardTo(link, a); err != nil {
			return routed, err
		}
	}
	for fam, is6 := range []bool{false, true} {
		gw, ok := p.gateway(is6)
		if !ok {
			continue
		}
		if err := f.kernel.route(link, gw, MAC(p.nextOuter), p.nextOuter); err != nil {
			return routed, err
		}
		routed[fam] = true
	}
	for fam, is6 := range []bool{false, true} {
		if !routed[fam] {
			f.kernel.removeRoute(is6)
		}
	}
	return routed, f.kernel.rules()
}

// stop removes the routes to a next node and returns node without a ring.
func (f *Flows) stop(node datapath.NodeInfo) (datapath.NodeInfo, error) {
	if f.local.IsValid() || f.next.Name != "" {
		f.cfg.Log.Info("no node to pass moved connections to", "ring", node.FlowRing)
	}
	node.FlowRing, node.FlowPeers = 0, nil
	f.local, f.next = netip.Addr{}, datapath.FlowPeer{}
	return node, f.kernel.removeRoutes()
}

// passedOver are the node's peers that do not answer.
func (f *Flows) passedOver(node datapath.NodeInfo) []string {
	var passed []string
	for _, p := range node.FlowPeers {
		if f.dead[p.Name] {
			passed = append(passed, p.Name)
		}
	}
	return passed
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Close removes everything Flows made: the device, its routes and rules.
// The agent calls it only when told to clean up; a stopping agent leaves
// them, so that moved connections keep being passed on while it is away.
func (f *Flows) Close(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.kernel.removeAll()
	f.local, f.next = netip.Addr{}, datapath.FlowPeer{}
	return err
}

// Datapath is what Applier programs after the routes.
type Datapath interface {
	Apply(context.Context, datapath.NodeState) error
	Resync(context.Context) error
}

// Applier sets the routes of moved connections before each state reaches
// the datapath, so that no packet is marked for a route that does not
// exist yet. A route that cannot be set is logged and leaves the node
// without redirection (as before it), not without forwarding.
type Applier struct {
	Flows    *Flows
	Datapath Datapath

	mu      sync.Mutex
	node    datapath.NodeInfo
	lastErr string
}

// Apply sets the routes for st.Node, then applies st.
func (a *Applier) Apply(ctx context.Context, st datapath.NodeState) error {
	st.Node = a.set(st.Node)
	return a.Datapath.Apply(ctx, st)
}

// Resync repairs the routes as well as the table.
func (a *Applier) Resync(ctx context.Context) error {
	a.mu.Lock()
	node := a.node
	a.mu.Unlock()
	if node.Name != "" {
		a.set(node)
	}
	return a.Datapath.Resync(ctx)
}

func (a *Applier) set(node datapath.NodeInfo) datapath.NodeInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node = node
	out, err := a.Flows.Set(node)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != a.lastErr {
		if err != nil {
			a.Flows.cfg.Log.Warn("moved connections are not passed on: they are refused where they arrive", "error", err)
		} else if a.lastErr != "" {
			a.Flows.cfg.Log.Info("moved connections are passed on again")
		}
		a.lastErr = msg
	}
	return out
}

// probeTargets are the node's outer address and device MAC, and the next
// nodes to probe at now, at their outer addresses of the same family. A
// peer probed at an address for the first time (it joined the ring, or
// the node's outer family changed) has a whole deadline to answer, as
// every peer has when probing begins.
func (f *Flows) probeTargets(now time.Time) (netip.Addr, net.HardwareAddr, []probeTarget) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.local.IsValid() {
		return netip.Addr{}, nil, nil
	}
	if f.started.IsZero() {
		f.started = now
	}
	if f.answers == nil {
		f.answers, f.tableAnswers = map[netip.Addr]time.Time{}, map[netip.Addr]time.Time{}
	}
	var out []probeTarget
	for _, p := range f.node.FlowPeers {
		if a, ok := f.probedAddrLocked(p); ok {
			if _, seen := f.answers[a]; !seen {
				f.answers[a] = now
			}
			out = append(out, probeTarget{name: p.Name, addr: a, mac: MAC(a)})
		}
	}
	return f.local, MAC(f.local), out
}

// probedAddrLocked is the address a peer is probed at: its outer address,
// when it is of the node's outer family.
func (f *Flows) probedAddrLocked(p datapath.FlowPeer) (netip.Addr, bool) {
	a, ok := outer(p.Addresses)
	if !ok || !f.local.IsValid() || a.Is4() != f.local.Is4() {
		return netip.Addr{}, false
	}
	return a, true
}

// restartClock gives every peer a full deadline from now: the prober
// itself was late.
func (f *Flows) restartClock(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = now
	for a := range f.answers {
		f.answers[a] = now
	}
	for a := range f.tableAnswers {
		f.tableAnswers[a] = now
	}
}

// answered records a peer's answer, and whether its table marked it as
// its own (byTable). Judgements wait for the next tick, when every answer
// read by then counts: judging at each answer, with the others still
// queued, passed over live peers on a busy machine.
func (f *Flows) answered(a netip.Addr, byTable bool, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answers == nil {
		f.answers, f.tableAnswers = map[netip.Addr]time.Time{}, map[netip.Addr]time.Time{}
	}
	f.answers[a] = at
	if byTable {
		f.tableAnswers[a] = at
	}
}

// judge passes over the peers that stopped answering and takes back
// those that answer again, moving the route if the first alive one
// changed.
func (f *Flows) judge(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.judgeLocked(now)
}

func (f *Flows) judgeLocked(now time.Time) {
	if now.Sub(f.started) < probeDeadline {
		return
	}
	dead := map[string]bool{}
	rulesGone := map[string]bool{} // of dead: its kernel answers, its table does not
	heard := false
	for _, p := range f.node.FlowPeers {
		a, ok := f.probedAddrLocked(p)
		if !ok {
			continue
		}
		if now.Sub(f.answers[a]) > probeDeadline {
			dead[p.Name] = true
			continue
		}
		heard = true
		// A peer whose table marked answers before and no longer does
		// lost its rules (flushed while its agent was away): what it is
		// passed it would serve as new, and refuse.
		if t, marked := f.tableAnswers[a]; marked && now.Sub(t) > probeDeadline {
			dead[p.Name], rulesGone[p.Name] = true, true
		}
	}
	if !heard && len(dead) > 0 {
		// Not one next node answered: this node cannot tell (its
		// own link is down, or it is too busy to read the answers),
		// and every peer at once is the unlikely verdict. What it
		// knew stays as it was.
		if !f.deaf {
			f.cfg.Log.Warn("no next node answers: moved connections keep their route until one does", "next", f.next.Name)
		}
		f.deaf = true
		return
	}
	f.deaf = false
	if maps.Equal(dead, f.dead) {
		return
	}
	for name := range dead {
		switch {
		case f.dead[name]:
		case rulesGone[name]:
			f.cfg.Log.Warn("a next node answers without its rules (they were flushed, or it was rebooted without them): moved connections pass it over", "peer", name)
		default:
			f.cfg.Log.Warn("a next node does not answer: moved connections pass it over", "peer", name)
		}
	}
	for name := range f.dead {
		if !dead[name] {
			f.cfg.Log.Info("a next node answers again", "peer", name)
		}
	}
	f.dead = dead
	if f.node.Name == "" {
		return
	}
	if _, err := f.setLocked(f.node); err != nil {
		f.cfg.Log.Warn("moving the route of moved connections", "error", err)
	}
}
