package flows

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernel is the OS seam Flows programs: the VXLAN device, its forwarding
// and neighbour entries, the table of marked packets and the rules that
// select it. netlinkKernel is the real one; tests use a recording fake.
type kernel interface {
	// device returns the device, made or remade for the outer address
	// local, holding the node's own IPv4 address own4.
	device(local, own4 netip.Addr) (netlink.Link, error)
	// forwardTo makes the device send frames for the device of the peer
	// whose outer address is outer to that address.
	forwardTo(link netlink.Link, outer netip.Addr) error
	// route sends the family of gw's marked packets to gw, a peer's
	// address whose device has mac and listens on outer.
	route(link netlink.Link, gw netip.Addr, mac net.HardwareAddr, outer netip.Addr) error
	// removeRoute removes the family's route to a next node.
	removeRoute(is6 bool)
	// removeRoutes removes both families' routes to a next node.
	removeRoutes() error
	// rules makes marked packets take the table, which ends in a drop.
	rules() error
	// removeAll removes everything: device, routes, drops and rules.
	removeAll() error
}

// netlinkKernel programs the node's kernel over netlink.
type netlinkKernel struct{ cfg Config }

// device returns the VXLAN device, made or remade for the outer address.
func (k netlinkKernel) device(local, own4 netip.Addr) (netlink.Link, error) {
	mac := MAC(local)
	if link, err := netlink.LinkByName(k.cfg.Interface); err == nil {
		vx, ok := link.(*netlink.Vxlan)
		if ok && vx.VxlanId == k.cfg.VNI && vx.Port == k.cfg.Port && vx.SrcAddr.Equal(local.AsSlice()) &&
			!vx.Learning && vx.HardwareAddr.String() == mac.String() {
			if vx.Flags&net.FlagUp == 0 {
				if err := netlink.LinkSetUp(link); err != nil {
					return nil, fmt.Errorf("flows: %s up: %w", k.cfg.Interface, err)
				}
			}
			return link, k.address(link, own4)
		}
		if err := netlink.LinkDel(link); err != nil {
			return nil, fmt.Errorf("flows: replacing %s: %w", k.cfg.Interface, err)
		}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = k.cfg.Interface
	attrs.HardwareAddr = mac
	// The packets are the clients' own, at the size they came in: the
	// outer packet is fragmented when it must be, rather than the
	// client told to send smaller.
	attrs.MTU = 1500
	vx := &netlink.Vxlan{LinkAttrs: attrs, VxlanId: k.cfg.VNI, SrcAddr: local.AsSlice(), Port: k.cfg.Port, Learning: false}
	if err := netlink.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("flows: adding %s (VXLAN): %w", k.cfg.Interface, err)
	}
	link, err := netlink.LinkByName(k.cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("flows: %s: %w", k.cfg.Interface, err)
	}
	// A peer's packet comes in with the client's source, which the node
	// reaches by another interface: strict reverse-path filtering would
	// drop it.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k.cfg.Interface+"/rp_filter", []byte("2"), 0); err != nil {
		return nil, fmt.Errorf("flows: loose reverse-path filter on %s: %w", k.cfg.Interface, err)
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+k.cfg.Interface+"/forwarding", []byte("1"), 0)
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("flows: %s up: %w", k.cfg.Interface, err)
	}
	return link, k.address(link, own4)
}

// address gives the device the node's own IPv4 address, as a host address
// with no route: the kernel's reverse-path check, loose or strict, drops
// every packet that arrives by an interface with no IPv4 address.
func (k netlinkKernel) address(link netlink.Link, own4 netip.Addr) error {
	addrs, err := netlink.AddrList(link, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("flows: addresses of %s: %w", k.cfg.Interface, err)
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
		return fmt.Errorf("flows: address of %s: %w", k.cfg.Interface, err)
	}
	return nil
}

// route sends the family of gw's marked packets to gw, a peer's address
// whose device has mac and listens on outerAddr.
func (k netlinkKernel) route(link netlink.Link, gw netip.Addr, mac net.HardwareAddr, outerAddr netip.Addr) error {
	idx := link.Attrs().Index
	if err := k.forwardTo(link, outerAddr); err != nil {
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
	r := &netlink.Route{LinkIndex: idx, Dst: dst, Gw: gw.AsSlice(), Table: k.cfg.Table, Family: fam}
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
func (k netlinkKernel) forwardTo(link netlink.Link, outerAddr netip.Addr) error {
	fdb := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, Flags: netlink.NTF_SELF,
		IP: outerAddr.AsSlice(), HardwareAddr: MAC(outerAddr)}
	if err := netlink.NeighSet(fdb); err != nil {
		return fmt.Errorf("flows: forwarding entry of %s: %w", outerAddr, err)
	}
	return nil
}

// removeRoute removes the family's route to a next node; the blackhole
// stays.
func (k netlinkKernel) removeRoute(is6 bool) { k.deleteRoutes(is6, false) }

// deleteRoutes deletes the family's routes of the table, and the blackhole
// too when all is set.
func (k netlinkKernel) deleteRoutes(is6, all bool) {
	fam := unix.AF_INET
	if is6 {
		fam = unix.AF_INET6
	}
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: k.cfg.Table}, netlink.RT_FILTER_TABLE)
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
func (k netlinkKernel) blackholes() error {
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if fam == unix.AF_INET6 {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		r := &netlink.Route{Table: k.cfg.Table, Type: unix.RTN_BLACKHOLE, Dst: dst, Priority: math.MaxUint32, Family: fam}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("flows: blackhole of table %d: %w", k.cfg.Table, err)
		}
	}
	return nil
}

// rules: marked packets the node forwards take the table; the device's own
// outer packets, which keep the mark, take the main table.
func (k netlinkKernel) rules() error {
	if err := k.blackholes(); err != nil {
		return err
	}
	mask := k.cfg.Mark
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		want := []*netlink.Rule{k.rule(fam, k.cfg.Table-1, unix.RT_TABLE_MAIN, "lo", &mask), k.rule(fam, k.cfg.Table, k.cfg.Table, "", &mask)}
		have, err := netlink.RuleListFiltered(fam, &netlink.Rule{Priority: k.cfg.Table - 1}, netlink.RT_FILTER_PRIORITY)
		if err != nil {
			return fmt.Errorf("flows: listing rules: %w", err)
		}
		have2, err := netlink.RuleListFiltered(fam, &netlink.Rule{Priority: k.cfg.Table}, netlink.RT_FILTER_PRIORITY)
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

func (k netlinkKernel) rule(fam, prio, table int, iif string, mask *uint32) *netlink.Rule {
	r := netlink.NewRule()
	r.Family, r.Priority, r.Table, r.Mark, r.Mask, r.IifName = fam, prio, table, k.cfg.Mark, mask, iif
	return r
}

func sameRule(a, b netlink.Rule) bool {
	return a.Priority == b.Priority && a.Table == b.Table && a.Mark == b.Mark && a.Mask != nil && b.Mask != nil && *a.Mask == *b.Mask && a.IifName == b.IifName
}

func (k netlinkKernel) removeRoutes() error {
	k.removeRoute(false)
	k.removeRoute(true)
	return nil
}

// removeAll removes the device, the table's routes and the rules that
// select it.
func (k netlinkKernel) removeAll() error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for _, prio := range []int{k.cfg.Table - 1, k.cfg.Table} {
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
	k.deleteRoutes(false, true)
	k.deleteRoutes(true, true)
	if link, err := netlink.LinkByName(k.cfg.Interface); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
