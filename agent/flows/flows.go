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
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

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
	cfg Config

	mu     sync.Mutex
	local  netip.Addr // the device's outer address
	next   datapath.FlowPeer
	routed [2]bool // per family (IPv4, IPv6): a route to the next node
	// node is the last node Set was given, to choose again when a peer
	// stops or starts answering.
	node datapath.NodeInfo
	// Probing (see Run): when each peer's address last answered, and
	// which peers are passed over; started is when probing began, before
	// which every peer counts as alive.
	answers map[netip.Addr]time.Time
	dead    map[string]bool
	started time.Time
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
	return &Flows{cfg: cfg}
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
	local, ok := outer(node.Addresses)
	var next datapath.FlowPeer
	var nextOuter netip.Addr
	if ok {
		// The first alive peer; the first reachable one when none is.
		for _, p := range node.FlowPeers {
			if a, ok := outer(p.Addresses); ok && a.Is4() == local.Is4() {
				if !nextOuter.IsValid() || f.dead[next.Name] && !f.dead[p.Name] {
					next, nextOuter = p, a
				}
			}
		}
	}
	if node.FlowRing < 2 || !nextOuter.IsValid() {
		if f.local.IsValid() || f.next.Name != "" {
			f.cfg.Log.Info("no node to pass moved connections to", "ring", node.FlowRing)
		}
		node.FlowRing, node.FlowPeers = 0, nil
		f.local, f.next = netip.Addr{}, datapath.FlowPeer{}
		return node, f.removeRoutes()
	}
	own4, _ := datapath.NextHop(node.Addresses, false)
	link, err := f.device(local, own4)
	if err != nil {
		node.FlowRing, node.FlowPeers = 0, nil
		return node, err
	}
	// Every next node the probes ask must be reachable through the
	// device, not only the one packets go to now: without a forwarding
	// entry the device drops the probe, and a live node would be
	// passed over for good.
	for _, p := range node.FlowPeers {
		if a, ok := outer(p.Addresses); ok && a.Is4() == local.Is4() {
			if err := f.forwardTo(link, a); err != nil {
				node.FlowRing, node.FlowPeers = 0, nil
				return node, err
			}
		}
	}
	var routed [2]bool
	for fam, is6 := range []bool{false, true} {
		gw, ok := datapath.NextHop(next.Addresses, is6)
		if !ok {
			continue
		}
		if is6 {
			// The kernel refuses an IPv6 gateway that the main table
			// reaches by another device; a link-local one is the
			// device's own.
			gw = linkLocal(MAC(nextOuter))
		}
		if err := f.route(link, gw, MAC(nextOuter), nextOuter); err != nil {
			node.FlowRing, node.FlowPeers = 0, nil
			return node, err
		}
		routed[fam] = true
	}
	for fam, is6 := range []bool{false, true} {
		if !routed[fam] {
			f.removeRoute(is6)
		}
	}
	if err := f.rules(); err != nil {
		node.FlowRing, node.FlowPeers = 0, nil
		return node, err
	}
	if f.next.Name != next.Name || f.local != local {
		var passed []string
		for _, p := range node.FlowPeers {
			if f.dead[p.Name] {
				passed = append(passed, p.Name)
			}
		}
		f.cfg.Log.Info("moved connections go to the next node", "next", next.Name, "via", nextOuter, "ring", node.FlowRing, "not_answering", passed)
	}
	f.local, f.next, f.routed = local, next, routed
	// The datapath marks only packets of a family with a route.
	node.FlowPeers = []datapath.FlowPeer{{Name: next.Name, Addresses: slices.DeleteFunc(slices.Clone(next.Addresses), func(a netip.Addr) bool {
		return !routed[boolIndex(a.Is6())]
	})}}
	return node, nil
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// device returns the VXLAN device, made or remade for the outer address.
func (f *Flows) device(local, own4 netip.Addr) (netlink.Link, error) {
	mac := MAC(local)
	if link, err := netlink.LinkByName(f.cfg.Interface); err == nil {
		vx, ok := link.(*netlink.Vxlan)
		if ok && vx.VxlanId == f.cfg.VNI && vx.Port == f.cfg.Port && vx.SrcAddr.Equal(local.AsSlice()) &&
			!vx.Learning && vx.HardwareAddr.String() == mac.String() {
			if vx.Flags&net.FlagUp == 0 {
				if err := netlink.LinkSetUp(link); err != nil {
					return nil, fmt.Errorf("flows: %s up: %w", f.cfg.Interface, err)
				}
			}
			return link, f.address(link, own4)
		}
		if err := netlink.LinkDel(link); err != nil {
			return nil, fmt.Errorf("flows: replacing %s: %w", f.cfg.Interface, err)
		}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = f.cfg.Interface
	attrs.HardwareAddr = mac
	// The packets are the clients' own, at the size they came in: the
	// outer packet is fragmented when it must be, rather than the
	// client told to send smaller.
	attrs.MTU = 1500
	vx := &netlink.Vxlan{LinkAttrs: attrs, VxlanId: f.cfg.VNI, SrcAddr: local.AsSlice(), Port: f.cfg.Port, Learning: false}
	if err := netlink.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("flows: adding %s (VXLAN): %w", f.cfg.Interface, err)
	}
	link, err := netlink.LinkByName(f.cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("flows: %s: %w", f.cfg.Interface, err)
	}
	// A peer's packet comes in with the client's source, which the node
	// reaches by another interface: strict reverse-path filtering would
	// drop it.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+f.cfg.Interface+"/rp_filter", []byte("2"), 0); err != nil {
		return nil, fmt.Errorf("flows: loose reverse-path filter on %s: %w", f.cfg.Interface, err)
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+f.cfg.Interface+"/forwarding", []byte("1"), 0)
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("flows: %s up: %w", f.cfg.Interface, err)
	}
	return link, f.address(link, own4)
}

// address gives the device the node's own IPv4 address, as a host address
// with no route: the kernel's reverse-path check, loose or strict, drops
// every packet that arrives by an interface with no IPv4 address.
func (f *Flows) address(link netlink.Link, own4 netip.Addr) error {
	addrs, err := netlink.AddrList(link, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("flows: addresses of %s: %w", f.cfg.Interface, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == own4 {
			continue
		}
		_ = netlink.AddrDel(link, &a)
	}
	if !own4.IsValid() || slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(own4.AsSlice()) }) {
		return nil
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: own4.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: unix.RT_SCOPE_HOST, Flags: unix.IFA_F_NOPREFIXROUTE}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("flows: address of %s: %w", f.cfg.Interface, err)
	}
	return nil
}

// route sends the family of gw's marked packets to gw, a peer's address
// whose device has mac and listens on outerAddr.
func (f *Flows) route(link netlink.Link, gw netip.Addr, mac net.HardwareAddr, outerAddr netip.Addr) error {
	idx := link.Attrs().Index
	if err := f.forwardTo(link, outerAddr); err != nil {
		return err
	}
	fam := unix.AF_INET
	dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	if gw.Is6() {
		fam = unix.AF_INET6
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	neigh := &netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: mac}
	if err := netlink.NeighSet(neigh); err != nil {
		return fmt.Errorf("flows: neighbour %s: %w", gw, err)
	}
	r := &netlink.Route{LinkIndex: idx, Dst: dst, Gw: gw.AsSlice(), Table: f.cfg.Table, Family: fam}
	if gw.Is4() {
		// The peer's address is the main table's, reached by the LAN.
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("flows: route to %s: %w", gw, err)
	}
	return nil
}

// forwardTo makes the device send frames for the device of the peer whose
// outer address is outerAddr to that address.
func (f *Flows) forwardTo(link netlink.Link, outerAddr netip.Addr) error {
	fdb := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, Flags: netlink.NTF_SELF,
		IP: outerAddr.AsSlice(), HardwareAddr: MAC(outerAddr)}
	if err := netlink.NeighSet(fdb); err != nil {
		return fmt.Errorf("flows: forwarding entry of %s: %w", outerAddr, err)
	}
	return nil
}

// removeRoute removes the family's route to a next node; the blackhole
// stays.
func (f *Flows) removeRoute(is6 bool) { f.deleteRoutes(is6, false) }

// deleteRoutes deletes the family's routes of the table, and the blackhole
// too when all is set.
func (f *Flows) deleteRoutes(is6, all bool) {
	fam := unix.AF_INET
	if is6 {
		fam = unix.AF_INET6
	}
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: f.cfg.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return
	}
	for _, r := range routes {
		if r.Type == unix.RTN_BLACKHOLE && !all {
			continue
		}
		_ = netlink.RouteDel(&r)
	}
}

// blackholes make the table end in a drop for each family. A marked packet
// with no route to a next node (its device being replaced or deleted, the
// route removed before the datapath stops marking) would otherwise take
// the main table, back to the router that sent it, which sends it to a
// node that passes it round the ring again: for ever, each first node
// giving it a fresh TTL.
func (f *Flows) blackholes() error {
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if fam == unix.AF_INET6 {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		r := &netlink.Route{Table: f.cfg.Table, Type: unix.RTN_BLACKHOLE, Dst: dst, Priority: math.MaxUint32, Family: fam}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("flows: blackhole of table %d: %w", f.cfg.Table, err)
		}
	}
	return nil
}

// rules: marked packets the node forwards take the table; the device's own
// outer packets, which keep the mark, take the main table.
func (f *Flows) rules() error {
	if err := f.blackholes(); err != nil {
		return err
	}
	mask := f.cfg.Mark
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		want := []*netlink.Rule{f.rule(fam, f.cfg.Table-1, unix.RT_TABLE_MAIN, "lo", &mask), f.rule(fam, f.cfg.Table, f.cfg.Table, "", &mask)}
		have, err := netlink.RuleListFiltered(fam, &netlink.Rule{Priority: f.cfg.Table - 1}, netlink.RT_FILTER_PRIORITY)
		if err != nil {
			return fmt.Errorf("flows: listing rules: %w", err)
		}
		have2, err := netlink.RuleListFiltered(fam, &netlink.Rule{Priority: f.cfg.Table}, netlink.RT_FILTER_PRIORITY)
		if err != nil {
			return fmt.Errorf("flows: listing rules: %w", err)
		}
		have = append(have, have2...)
		for _, w := range want {
			if slices.ContainsFunc(have, func(h netlink.Rule) bool { return sameRule(h, *w) }) {
				continue
			}
			if err := netlink.RuleAdd(w); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("flows: rule %v: %w", w, err)
			}
		}
	}
	return nil
}

func (f *Flows) rule(fam, prio, table int, iif string, mask *uint32) *netlink.Rule {
	r := netlink.NewRule()
	r.Family, r.Priority, r.Table, r.Mark, r.Mask, r.IifName = fam, prio, table, f.cfg.Mark, mask, iif
	return r
}

func sameRule(a, b netlink.Rule) bool {
	return a.Priority == b.Priority && a.Table == b.Table && a.Mark == b.Mark && a.Mask != nil && b.Mask != nil && *a.Mask == *b.Mask && a.IifName == b.IifName
}

func (f *Flows) removeRoutes() error {
	f.removeRoute(false)
	f.removeRoute(true)
	return nil
}

// Close removes everything Flows made: the device, its routes and rules.
// The agent calls it only when told to clean up; a stopping agent leaves
// them, so that moved connections keep being passed on while it is away.
func (f *Flows) Close(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for _, prio := range []int{f.cfg.Table - 1, f.cfg.Table} {
			rules, err := netlink.RuleListFiltered(fam, &netlink.Rule{Priority: prio}, netlink.RT_FILTER_PRIORITY)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, r := range rules {
				if err := netlink.RuleDel(&r); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	f.deleteRoutes(false, true)
	f.deleteRoutes(true, true)
	if link, err := netlink.LinkByName(f.cfg.Interface); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, err)
		}
	}
	f.local, f.next = netip.Addr{}, datapath.FlowPeer{}
	return errors.Join(errs...)
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

// probeTargets are the node's IPv4 address and device MAC, and the next
// nodes to probe.
func (f *Flows) probeTargets() (netip.Addr, net.HardwareAddr, []probeTarget) {
	f.mu.Lock()
	defer f.mu.Unlock()
	own4, ok := datapath.NextHop(f.node.Addresses, false)
	if !ok || !f.local.Is4() {
		return netip.Addr{}, nil, nil
	}
	if f.started.IsZero() {
		f.started = time.Now()
	}
	var out []probeTarget
	for _, p := range f.node.FlowPeers {
		if a, ok := datapath.NextHop(p.Addresses, false); ok {
			out = append(out, probeTarget{name: p.Name, addr: a, mac: MAC(a)})
		}
	}
	return own4, MAC(f.local), out
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
}

// answered records a peer's answer. Judgements wait for the next tick,
// when every answer read by then counts: judging at each answer, with
// the others still queued, passed over live peers on a busy machine.
func (f *Flows) answered(a netip.Addr, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answers == nil {
		f.answers = map[netip.Addr]time.Time{}
	}
	f.answers[a] = at
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
	heard := false
	for _, p := range f.node.FlowPeers {
		a, ok := datapath.NextHop(p.Addresses, false)
		if !ok {
			continue
		}
		if now.Sub(f.answers[a]) > probeDeadline {
			dead[p.Name] = true
		} else {
			heard = true
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
		if !f.dead[name] {
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
