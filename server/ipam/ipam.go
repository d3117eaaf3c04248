// Package ipam assigns load-balancer addresses to LoadBalancer services
// from address pools, with MetalLB's rules: a requested address if it is in
// a pool and free, else the first free address of the service's pool (or of
// any pool that is not manual-only), one per family of the service; an
// address may be shared by services that name the same sharing key and use
// distinct ports. An address no load-balancer IP may be (a node's or the
// server's own, one in a service range: registry.Reserved) is never
// assigned, and one assigned before it became so is replaced. Assignments live in the services' status, so they survive
// restarts and stay put; addresses outside every pool are an outside load
// balancer's, and are left alone, as are the services another controller
// handles (their addresses are taken, never shared).
package ipam

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/weirlb/weir/internal/notify"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// Reasons an address could not be assigned.
const (
	ReasonPoolExhausted = "PoolExhausted"
	ReasonAddressTaken  = "AddressTaken"
	ReasonNotInAnyPool  = "NotInAnyPool"
	ReasonNoPool        = "NoPool"
	// ReasonNotAllowed: the address asked for is in a pool scoped to
	// other services (its service_allocation), or is one no load-balancer
	// IP may be (registry.Reserved).
	ReasonNotAllowed = "NotAllowed"
)

// Writer records a service's assignment where its source keeps status.
type Writer interface {
	WriteStatus(ctx context.Context, svc *model.Service, ips []netip.Addr, reason, message string) error
}

// Allocator keeps every LoadBalancer service's addresses assigned.
type Allocator struct {
	reg     *registry.Registry
	log     *slog.Logger
	writers map[string]Writer
	wake    notify.Kick
}

// New returns an allocator over reg; Run does the work.
func New(reg *registry.Registry, writers map[string]Writer, log *slog.Logger) *Allocator {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Allocator{reg: reg, log: log, writers: writers}
	reg.OnChange(func(ch registry.Change) {
		// Allocations follow the services' own objects and the pools,
		// never endpoints: an endpoint slice's change wakes nothing. A
		// node or a service range that comes to hold a service's address
		// makes it reserved (the write lists the service).
		hosts := (len(ch.Nodes) > 0 || len(ch.ServiceCIDRs) > 0) && len(ch.Services) > 0
		if len(ch.ServiceObjects) > 0 || len(ch.Pools) > 0 || hosts {
			a.wake.Kick()
		}
	})
	return a
}

// Run assigns after every change to a service object or a pool, until
// ctx ends.
// It may run again after it stopped (a replica leading again).
func (a *Allocator) Run(ctx context.Context) {
	a.wake.Kick() // a first round, unless one is due already
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake.C():
		}
		for _, w := range a.Plan() {
			writer := a.writers[w.Service.Source]
			if writer == nil {
				continue
			}
			if err := writer.WriteStatus(ctx, w.Service, w.IPs, w.Reason, w.Message); err != nil {
				a.log.Warn("writing a load-balancer address failed", "service", w.Service.Key(), "error", err)
			}
		}
		// Writes come back as changes; let them settle before the next round.
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Write is one service's new status.
type Write struct {
	Service *model.Service
	IPs     []netip.Addr
	Reason  string
	Message string
}

// Plan computes the status writes that bring every LoadBalancer service to
// its assignment: first what already holds stays put, then the rest are
// assigned, oldest first, and only the services whose status changes are
// written.
func (a *Allocator) Plan() []Write {
	p, svcs := a.snapshot()
	svcs = p.setAsideOtherControllers(svcs)
	wants := make([]*want, 0, len(svcs))
	var pending []*want
	for _, s := range svcs {
		w := &want{svc: s}
		wants = append(wants, w)
		if !p.keepHeld(w) {
			pending = append(pending, w)
		}
	}
	for _, w := range pending {
		if len(w.svc.RequestedLoadBalancerIPs) > 0 {
			p.assignRequested(w)
		} else {
			p.assignFromPools(w)
		}
		p.take(w.svc, w.ips)
	}
	return changedStatus(wants)
}

// want is the status a round decides for one service.
type want struct {
	svc     *model.Service
	ips     []netip.Addr
	reason  string
	message string
}

// planner is one round's state: the pools in allocation order, the
// addresses no service may take, and the services using each address so
// far.
type planner struct {
	pools    []*model.AddressPool
	reserved registry.Reserved
	used     map[netip.Addr][]*model.Service
}

// snapshot reads the pools, the reserved addresses and the LoadBalancer
// services under one registry read, the services oldest first: older
// services keep priority over newer ones for the same address.
func (a *Allocator) snapshot() (*planner, []*model.Service) {
	p := &planner{used: map[netip.Addr][]*model.Service{}}
	var svcs []*model.Service
	a.reg.Read(func(v registry.View) {
		p.pools = AllocationOrder(v.Pools())
		p.reserved = v.LoadBalancerReserved()
		for _, k := range v.ServiceKeys() {
			if s := v.Service(k); s.Type == model.LoadBalancer {
				svcs = append(svcs, s)
			}
		}
	})
	slices.SortFunc(svcs, func(x, y *model.Service) int { return registry.CompareAge(x, y) })
	return p, svcs
}

// setAsideOtherControllers drops another controller's services, which
// are not Weir's to write, and takes the addresses they hold.
func (p *planner) setAsideOtherControllers(svcs []*model.Service) []*model.Service {
	return slices.DeleteFunc(svcs, func(s *model.Service) bool {
		if s.OtherController {
			p.take(s, s.LoadBalancerIPs)
		}
		return s.OtherController
	})
}

// SetOutside reports whether another load balancer set the service's
// addresses although its class is Weir's (a class-less service, with
// Weir the default, that another controller addressed): it holds
// addresses, one is in none of pools, and it asks for none. They are not
// Weir's to change, nor to report on: Weir writes nothing to it.
func SetOutside(s *model.Service, pools []*model.AddressPool) bool {
	return len(s.LoadBalancerIPs) > 0 && len(s.RequestedLoadBalancerIPs) == 0 &&
		slices.ContainsFunc(s.LoadBalancerIPs, func(ip netip.Addr) bool { return inPool(pools, ip) == nil })
}

// keepHeld keeps what already holds, and reports whether it did: the
// addresses an outside load balancer set, and valid addresses of Weir's
// pools in status (the ones asked for, if any), free of conflicts.
func (p *planner) keepHeld(w *want) bool {
	s := w.svc
	if SetOutside(s, p.pools) {
		w.ips, w.reason, w.message = s.LoadBalancerIPs, s.AddressReason, s.AddressMessage
		return true
	}
	managed := len(s.LoadBalancerIPs) > 0 && !slices.ContainsFunc(s.LoadBalancerIPs, func(ip netip.Addr) bool { return inPool(p.pools, ip) == nil })
	keep := managed && (len(s.RequestedLoadBalancerIPs) == 0 || sameAddrs(s.RequestedLoadBalancerIPs, s.LoadBalancerIPs))
	for _, ip := range s.LoadBalancerIPs {
		// .0 and .255 of a pool that avoids them (turned on since) are
		// given back, as MetalLB does.
		if keep && (!p.shareable(ip, s) || p.reserved.Why(ip) != "" || p.inPool(ip).Avoids(ip)) {
			keep = false
		}
	}
	if keep {
		w.ips = s.LoadBalancerIPs
		p.take(s, w.ips)
	}
	return keep
}

// assignRequested gives the service the addresses it asks for, or none
// with the reason of the last one it may not have.
func (p *planner) assignRequested(w *want) {
	s := w.svc
	ok := true
	for _, ip := range s.RequestedLoadBalancerIPs {
		switch pool := p.inPool(ip); {
		case p.reserved.Why(ip) != "":
			w.reason, w.message, ok = ReasonNotAllowed, p.reserved.Why(ip), false
		case pool == nil:
			w.reason, w.message, ok = ReasonNotInAnyPool, fmt.Sprintf("%s is in no address pool", ip), false
		case s.AddressPool != "" && pool.Name != s.AddressPool:
			w.reason, w.message, ok = ReasonNotInAnyPool, fmt.Sprintf("%s is not in pool %s", ip, s.AddressPool), false
		case pool.Avoids(ip):
			w.reason, w.message, ok = ReasonNotAllowed, fmt.Sprintf("%s ends in .0 or .255, which pool %s does not give out (avoid_buggy_ips)", ip, pool.Name), false
		case !pool.Allows(s):
			w.reason, w.message, ok = ReasonNotAllowed, fmt.Sprintf("%s is in pool %s, which is for %s", ip, pool.Name, pool.Allocation.Scope()), false
		case !p.shareable(ip, s):
			w.reason, w.message, ok = ReasonAddressTaken, fmt.Sprintf("%s is assigned to %s", ip, p.used[ip][0].Key()), false
		}
	}
	if ok {
		w.ips = s.RequestedLoadBalancerIPs
	}
}

// assignFromPools gives the service one address of each of its families
// from the pools: all or nothing when a pool is full, the families pools
// have for a dual-stack service.
func (p *planner) assignFromPools(w *want) {
	s := w.svc
	for _, is6 := range families(s) {
		ip, reason, msg := p.pick(s, is6)
		switch {
		case reason == ReasonNoPool && len(families(s)) > 1:
			// A dual-stack service gets the families pools have.
		case reason != "":
			w.reason, w.message = reason, msg
		default:
			w.ips = append(w.ips, ip)
		}
	}
	if w.reason != "" && w.reason != ReasonNoPool {
		w.ips = nil // all or nothing when a pool is full
	}
	if len(w.ips) == 0 && w.reason == "" {
		w.reason, w.message = ReasonNoPool, "no address pool has addresses for this service"
	}
}

// changedStatus are the writes of the services whose status changes.
func changedStatus(wants []*want) []Write {
	var out []Write
	for _, w := range wants {
		s := w.svc
		if sameAddrs(w.ips, s.LoadBalancerIPs) && w.reason == s.AddressReason && w.message == s.AddressMessage {
			continue
		}
		out = append(out, Write{Service: s, IPs: w.ips, Reason: w.reason, Message: w.message})
	}
	return out
}

// inPool is the pool holding ip, or nil.
func (p *planner) inPool(ip netip.Addr) *model.AddressPool { return inPool(p.pools, ip) }

// inPool is the first of pools that holds ip, or nil.
func inPool(pools []*model.AddressPool, ip netip.Addr) *model.AddressPool {
	for _, pool := range pools {
		for _, r := range pool.Ranges {
			if r.Contains(ip) {
				return pool
			}
		}
	}
	return nil
}

// shareable reports whether s may use ip beside the services using it so
// far: all under s's sharing key, on other ports, and Weir's.
func (p *planner) shareable(ip netip.Addr, s *model.Service) bool {
	for _, o := range p.used[ip] {
		if o.Key() == s.Key() {
			continue
		}
		if s.AllowSharedIP == "" || o.AllowSharedIP != s.AllowSharedIP || portsOverlap(o, s) || o.OtherController {
			return false
		}
	}
	return true
}

// take records that s uses ips.
func (p *planner) take(s *model.Service, ips []netip.Addr) {
	for _, ip := range ips {
		p.used[ip] = append(p.used[ip], s)
	}
}

// pick finds the first free address of the family in the pools s may use,
// in allocation order, leaving out the reserved ones.
func (p *planner) pick(s *model.Service, is6 bool) (netip.Addr, string, string) {
	eligible, scopedOut := 0, ""
	for _, pool := range p.pools {
		if (s.AddressPool != "" && pool.Name != s.AddressPool) || (s.AddressPool == "" && pool.ManualOnly) {
			continue
		}
		if !pool.Allows(s) {
			scopedOut = fmt.Sprintf(" (pool %s is for %s)", pool.Name, pool.Allocation.Scope())
			continue
		}
		for _, r := range pool.Ranges {
			if r.First.Is6() != is6 {
				continue
			}
			eligible++
			// Sharing first: an address already used under the same key.
			for ip := r.First; ip.IsValid() && ip.Compare(r.Last) <= 0; ip = ip.Next() {
				if p.reserved.Why(ip) != "" || pool.Avoids(ip) {
					continue
				}
				if len(p.used[ip]) > 0 && s.AllowSharedIP != "" && p.shareable(ip, s) {
					return ip, "", ""
				}
				if len(p.used[ip]) == 0 {
					return ip, "", ""
				}
			}
		}
	}
	fam := "IPv4"
	if is6 {
		fam = "IPv6"
	}
	if eligible == 0 {
		return netip.Addr{}, ReasonNoPool, fmt.Sprintf("no address pool has %s addresses for this service%s", fam, scopedOut)
	}
	return netip.Addr{}, ReasonPoolExhausted, fmt.Sprintf("every %s address of the pools this service may use is assigned", fam)
}

// families are the address families the service needs, from its cluster IPs.
func families(s *model.Service) []bool {
	var out []bool
	for _, ip := range s.ClusterIPs {
		out = append(out, ip.Is6())
	}
	return out
}

func portsOverlap(a, b *model.Service) bool {
	for _, p := range a.Ports {
		for _, q := range b.Ports {
			if p.Port == q.Port && p.Protocol == q.Protocol {
				return true
			}
		}
	}
	return false
}

func sameAddrs(a, b []netip.Addr) bool { return slices.Equal(a, b) }

// AllocationOrder is the order pools are tried in for a service that
// names none: the scoped pools (service_allocation) first, by priority (1
// first, 0 last), then the others; by name among equals.
func AllocationOrder(pools []*model.AddressPool) []*model.AddressPool {
	rank := func(p *model.AddressPool) (int, int) {
		if p.Allocation == nil {
			return 1, 0
		}
		if p.Allocation.Priority == 0 {
			return 0, math.MaxInt
		}
		return 0, p.Allocation.Priority
	}
	out := slices.Clone(pools)
	slices.SortStableFunc(out, func(a, b *model.AddressPool) int {
		sa, pa := rank(a)
		sb, pb := rank(b)
		return cmp.Or(cmp.Compare(sa, sb), cmp.Compare(pa, pb), cmp.Compare(a.Name, b.Name))
	})
	return out
}
