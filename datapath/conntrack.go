package datapath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conntrack deletes stale connection-tracking entries: the seam to the
// kernel's conntrack table. UDP has no connection teardown, so an entry
// made before a change keeps steering a client's packets to the old place
// until it expires; TCP and SCTP entries are left alone, as in kube-proxy.
type Conntrack interface {
	ClearUDP(ctx context.Context, flow UDPFlow) error
	// NotDNATedUDP lists the UDP entries whose replies come from their
	// original destination: datagrams no DNAT rule caught, as flows
	// (Endpoint is the destination itself).
	NotDNATedUDP(ctx context.Context) ([]UDPFlow, error)
}

// UDPFlow selects UDP entries by their original destination and, when
// Endpoint is valid, by the endpoint they were DNAT'ed to (and its port,
// when EndpointPort is not 0).
type UDPFlow struct {
	IPv6 bool
	// Dst is the frontend address; invalid for a node port (any local address).
	Dst          netip.Addr
	Port         uint16
	Endpoint     netip.Addr
	EndpointPort uint16
}

func (f UDPFlow) String() string {
	dst := "*"
	if f.Dst.IsValid() {
		dst = f.Dst.String()
	}
	s := fmt.Sprintf("udp to %s port %d", dst, f.Port)
	if f.Endpoint.IsValid() {
		s += " via " + f.Endpoint.String()
		if f.EndpointPort != 0 {
			s += fmt.Sprintf(" port %d", f.EndpointPort)
		}
	}
	return s
}

// ConntrackTool is the real Conntrack: it lists the kernel's entries over
// a netlink socket it keeps open, and deletes them with the conntrack(8)
// program. Its zero value is ready.
//
// Why a socket that stays open: a full sync lists the entries right after
// its switch, whose rules the kernel frees in the background, and any
// process closing a netfilter socket (the conntrack program listing) waits
// for that, 10-30 ms per run (see elementWriter).
type ConntrackTool struct {
	mu    sync.Mutex
	conns [2]*netlink.Conn // per family; nil until first used, and after an error
}

// ClearUDP runs conntrack -D for the flow.
func (*ConntrackTool) ClearUDP(ctx context.Context, f UDPFlow) error {
	args := []string{"-D", "-p", "udp", "--orig-port-dst", strconv.Itoa(int(f.Port))}
	if f.IPv6 {
		args = append(args, "-f", "ipv6")
	}
	if f.Dst.IsValid() {
		args = append(args, "--orig-dst", f.Dst.String())
	}
	if f.Endpoint.IsValid() {
		args = append(args, "--reply-src", f.Endpoint.String())
	}
	if f.EndpointPort != 0 {
		args = append(args, "--reply-port-src", strconv.Itoa(int(f.EndpointPort)))
	}
	out, err := exec.CommandContext(ctx, "conntrack", args...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), " 0 flow entries") {
		return fmt.Errorf("conntrack %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ctnetlink's numbers (linux/netfilter/nfnetlink_conntrack.h), which
// x/sys/unix does not name.
const (
	nfnlSubsysCtnetlink = 1
	ipctnlMsgCtGet      = 1

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaFilter     = 25

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	ctaProtoNum   = 1
	ctaProtoSrc   = 2
	ctaProtoDst   = 3

	ctaFilterOrigFlags = 1
	ctaFilterProtoNum  = 1 << 3 // CTA_FILTER_F_CTA_PROTO_NUM
)

// NotDNATedUDP lists the table's UDP entries, both families, and keeps
// those whose reply source is their original destination. The kernel
// lists only UDP entries (a filter kernels before 5.8 ignore; the others
// are skipped here).
func (c *ConntrackTool) NotDNATedUDP(ctx context.Context) ([]UDPFlow, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A dump per family, which the kernel's filter needs, at once: each
	// walks every bucket of the table's hash, however few entries it holds.
	var flows [2][]UDPFlow
	var errs [2]error
	var wg sync.WaitGroup
	for i, fam := range []byte{unix.AF_INET, unix.AF_INET6} {
		wg.Go(func() { flows[i], errs[i] = c.notDNATed(i, fam) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return append(flows[0], flows[1]...), nil
}

// notDNATed dumps one family's UDP entries on the i-th socket.
func (c *ConntrackTool) notDNATed(i int, fam byte) ([]UDPFlow, error) {
	if c.conns[i] == nil {
		conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return nil, fmt.Errorf("conntrack: %w", err)
		}
		c.conns[i] = conn
	}
	msgs, err := c.conns[i].Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysCtnetlink<<8 | ipctnlMsgCtGet), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{fam, unix.NFNETLINK_V0, 0, 0}, udpFilter...),
	})
	if err != nil {
		c.conns[i].Close()
		c.conns[i] = nil
		return nil, fmt.Errorf("listing conntrack entries: %w", err)
	}
	var out []UDPFlow
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		if f, ok := notDNATedEntry(m.Data[4:]); ok {
			out = append(out, f)
		}
	}
	return out, nil
}

// udpFilter is a dump's filter on the original direction's protocol: UDP.
var udpFilter = func() []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctaTupleOrig, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(ctaTupleProto, func(ae *netlink.AttributeEncoder) error {
			ae.Uint8(ctaProtoNum, unix.IPPROTO_UDP)
			return nil
		})
		return nil
	})
	ae.Nested(ctaFilter, func(ae *netlink.AttributeEncoder) error {
		ae.Uint32(ctaFilterOrigFlags, ctaFilterProtoNum)
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		panic(err)
	}
	return b
}()

// ctTuple is one direction of a conntrack entry.
type ctTuple struct {
	src, dst         netip.Addr
	proto            uint8
	srcPort, dstPort uint16
}

// notDNATedEntry reads one entry's attributes and returns its flow when it
// is UDP and its reply comes from its original destination.
func notDNATedEntry(attrs []byte) (UDPFlow, bool) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return UDPFlow{}, false
	}
	var orig, reply ctTuple
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			ad.Nested(func(nad *netlink.AttributeDecoder) error { orig = readTuple(nad); return nil })
		case ctaTupleReply:
			ad.Nested(func(nad *netlink.AttributeDecoder) error { reply = readTuple(nad); return nil })
		}
	}
	if ad.Err() != nil || orig.proto != unix.IPPROTO_UDP || !orig.dst.IsValid() ||
		reply.src != orig.dst || reply.srcPort != orig.dstPort {
		return UDPFlow{}, false
	}
	return UDPFlow{IPv6: orig.dst.Is6(), Dst: orig.dst, Port: orig.dstPort, Endpoint: orig.dst}, true
}

func readTuple(ad *netlink.AttributeDecoder) ctTuple {
	var t ctTuple
	addr := func(b []byte) netip.Addr {
		a, _ := netip.AddrFromSlice(b)
		return a
	}
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(func(ad *netlink.AttributeDecoder) error {
				for ad.Next() {
					switch ad.Type() {
					case ctaIPv4Src, ctaIPv6Src:
						t.src = addr(ad.Bytes())
					case ctaIPv4Dst, ctaIPv6Dst:
						t.dst = addr(ad.Bytes())
					}
				}
				return nil
			})
		case ctaTupleProto:
			ad.Nested(func(ad *netlink.AttributeDecoder) error {
				for ad.Next() {
					switch ad.Type() {
					case ctaProtoNum:
						t.proto = ad.Uint8()
					case ctaProtoSrc:
						t.srcPort = binary.BigEndian.Uint16(ad.Bytes())
					case ctaProtoDst:
						t.dstPort = binary.BigEndian.Uint16(ad.Bytes())
					}
				}
				return nil
			})
		}
	}
	return t
}

// FakeConntrack records what it was asked to clear, and lists NotDNATed.
type FakeConntrack struct {
	mu        sync.Mutex
	Cleared   []UDPFlow
	NotDNATed []UDPFlow
	Listings  int // calls of NotDNATedUDP
}

// NotDNATedUDP returns c.NotDNATed.
func (c *FakeConntrack) NotDNATedUDP(context.Context) ([]UDPFlow, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Listings++
	return slices.Clone(c.NotDNATed), nil
}

// ClearUDP records f.
func (c *FakeConntrack) ClearUDP(_ context.Context, f UDPFlow) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Cleared = append(c.Cleared, f)
	return nil
}

// staleUDPFlows finds the UDP conntrack entries a partial sync left
// pointing the wrong way, as kube-proxy judges them: flows to an endpoint
// of a changed service that served before and no longer does (gone, or
// not serving), and flows cached while a frontend had no endpoint
// (rejected or dropped) that now has one, and flows to an address frontend
// that did not exist yet and were never DNAT'ed. An endpoint that leaves a
// frontend's backends but still serves (terminating, or out of this
// node's topology or traffic-policy choice) keeps its flows: that is what
// lets a UDP service drain gracefully. replaced holds the changed
// services as they were (nil when new); d.services is already the new
// state.
func (d *Datapath) staleUDPFlows(before map[elemID]*liveElement, replaced map[ServiceKey]*Service) []UDPFlow {
	stale := udpFlows{seen: map[UDPFlow]bool{}}
	for key, old := range replaced {
		if old != nil {
			d.endpointsLeft(&stale, key, old)
		}
	}
	for id, was := range before {
		if flow, ok := d.frontendFlow(before, id, was); ok {
			stale.add(flow)
		}
	}
	return stale.flows
}

// udpFlows are flows in the order found, each once.
type udpFlows struct {
	flows []UDPFlow
	seen  map[UDPFlow]bool
}

func (u *udpFlows) add(f UDPFlow) {
	if !u.seen[f] {
		u.seen[f] = true
		u.flows = append(u.flows, f)
	}
}

// endpointsLeft adds the flows to the endpoints that served the service
// key as it was (old) and no longer serve it: gone, not serving, or
// serving on another port.
func (d *Datapath) endpointsLeft(stale *udpFlows, key ServiceKey, old *Service) {
	was := servingUDPEndpoints(map[ServiceKey]*Service{key: old})
	var now servingUDP
	if svc := d.services[key]; svc != nil {
		now = servingUDPEndpoints(map[ServiceKey]*Service{key: svc})
	}
	for frontend, eps := range was {
		for ep := range eps {
			if !now[frontend][ep] {
				flow := frontend
				flow.Endpoint, flow.EndpointPort = ep.Addr(), ep.Port()
				stale.add(flow)
			}
		}
	}
}

// frontendFlow is the flow of the element id (was before the sync) that
// the change of the element made stale, if any: a frontend that dropped,
// rejected or did not exist, and now has endpoints.
func (d *Datapath) frontendFlow(before map[elemID]*liveElement, id elemID, was *liveElement) (UDPFlow, bool) {
	now := d.liveAt(id)
	switch k, isBackends := kindOfSet(id.set); {
	case k != nil && !isBackends:
		switch {
		case now == nil || now.pick.drops():
		case was != nil && was.pick.drops():
			// drop -> endpoints: flows cached while dropping are stale.
			return udpFlow(id, k.nodePort)
		case was == nil && !k.nodePort && !d.wasFrontend(before, id):
			// A new frontend: datagrams sent before it existed were
			// routed as they were, and their entries, whose replies
			// come from the frontend itself, would keep the client's
			// flow off the endpoints for as long as it keeps sending.
			flow, ok := udpFlow(id, false)
			flow.Endpoint = flow.Dst
			return flow, ok
		}
	case id.set == sets.noEndpointFrontends || id.set == sets.noEndpointNodePorts:
		// The first endpoint arrived: flows cached while rejecting are stale.
		if was != nil && now == nil {
			return udpFlow(id, id.set == sets.noEndpointNodePorts)
		}
	}
	return UDPFlow{}, false
}

// wasFrontend says whether id's frontend was already served before the
// change, through another kind's map or as one with no endpoint: flows to
// it then went where the rules said, and any that are stale are found
// from what changed there.
func (d *Datapath) wasFrontend(before map[elemID]*liveElement, id elemID) bool {
	for _, set := range []setID{ipKind.frontendsSet, externalIPKind.frontendsSet, sets.noEndpointFrontends} {
		other := elemID{id.fam, set, id.key}
		if other == id {
			continue
		}
		was, touched := before[other]
		if (touched && was != nil) || (!touched && d.liveAt(other) != nil) {
			return true
		}
	}
	return false
}

// clearNotDNATedUDP clears, after a whole table was written, the entries
// of datagrams that reached a UDP address frontend with endpoints without
// being DNAT'ed: sent while its rules were not in place yet (the agent
// starting, a service arriving with its first state), they would keep the
// client's flow off the endpoints for as long as it keeps sending.
func (d *Datapath) clearNotDNATedUDP(ctx context.Context) {
	served := servingUDPEndpoints(d.services)
	if d.cfg.Conntrack == nil || len(served) == 0 {
		return // no UDP endpoint a flow could be cleared for
	}
	entries, err := d.cfg.Conntrack.NotDNATedUDP(ctx)
	if err != nil {
		d.cfg.Log.Warn("UDP conntrack entries not listed; those made before the rules were in place stay", "error", err)
		return
	}
	for _, e := range entries {
		if len(served[UDPFlow{IPv6: e.IPv6, Dst: e.Dst, Port: e.Port}]) == 0 {
			continue
		}
		if err := d.cfg.Conntrack.ClearUDP(ctx, e); err != nil {
			d.cfg.Log.Warn("stale UDP conntrack entries not cleared", "flow", e.String(), "error", err)
		}
	}
}

// servingUDP is, per UDP frontend (an address and port, or a node port
// with no address), the endpoints (address and port) serving it.
type servingUDP map[UDPFlow]map[netip.AddrPort]bool

// servingUDPEndpoints reads the serving endpoints of every UDP service
// port, whatever this node's topology or traffic policies pick.
func servingUDPEndpoints(services map[ServiceKey]*Service) servingUDP {
	out := servingUDP{}
	add := func(f UDPFlow, ep netip.AddrPort) {
		if out[f] == nil {
			out[f] = map[netip.AddrPort]bool{}
		}
		out[f][ep] = true
	}
	for _, svc := range services {
		frontends := slices.Concat(svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs)
		for _, sp := range svc.Ports {
			if sp.Protocol != UDP {
				continue
			}
			for _, ep := range sp.Endpoints {
				if !ep.Serving && !ep.Ready {
					continue
				}
				is6, at := ep.Addr.Is6(), netip.AddrPortFrom(ep.Addr, ep.Port)
				for _, a := range frontends {
					if a.Is6() == is6 {
						add(UDPFlow{IPv6: is6, Dst: a, Port: sp.Port}, at)
					}
				}
				if sp.NodePort != 0 {
					add(UDPFlow{IPv6: is6, Port: sp.NodePort}, at)
				}
			}
		}
	}
	return out
}

// udpFlow reads a UDP frontend's key (address . proto . port, or proto .
// port for a node port).
func udpFlow(id elemID, nodePort bool) (UDPFlow, bool) {
	b := id.key.bytes()
	f := id.family()
	var dst netip.Addr
	if !nodePort {
		n := 4
		if f.is6 {
			n = 16
		}
		if len(b) < n {
			return UDPFlow{}, false
		}
		dst, _ = netip.AddrFromSlice(b[:n])
		b = b[n:]
	}
	if len(b) != 8 || protocolOfNumber(b[0]) != UDP {
		return UDPFlow{}, false
	}
	return UDPFlow{IPv6: f.is6, Dst: dst, Port: binary.BigEndian.Uint16(b[4:])}, true
}

// kindOfSet finds the frontend kind a map belongs to, and whether it is one
// of the kind's backends maps.
func kindOfSet(set setID) (k *frontendKind, isBackends bool) {
	for _, k := range frontendKinds {
		if k.frontendsSet == set {
			return k, false
		}
		if slices.Contains(k.backendsSet[:], set) {
			return k, true
		}
	}
	return nil, false
}
