package bgp

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/weirlb/weir/agent/health"
	"github.com/weirlb/weir/datapath"
)

// Announcer decides what the node announces: each load-balancer IP of a
// service, with the node as next hop, while the node is healthy, not
// drained or going away, and (for externalTrafficPolicy Local) has a ready
// local endpoint. It withdraws as soon as a new state says so, and
// announces only once the state's rules are applied.
type Announcer struct {
	sp           Speaker
	proxyHealthy func() bool
	log          *slog.Logger

	mu        sync.Mutex // guards the fields below
	state     datapath.NodeState
	announced map[netip.Prefix]netip.Addr // prefix -> next hop
}

// NewAnnouncer announces through sp.
func NewAnnouncer(sp Speaker, proxyHealthy func() bool, log *slog.Logger) *Announcer {
	return &Announcer{sp: sp, proxyHealthy: proxyHealthy, log: log, announced: map[netip.Prefix]netip.Addr{}}
}

// Received withdraws what st says the node should no longer attract.
func (a *Announcer) Received(st datapath.NodeState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state = st
	a.sync(false)
}

// Applied announces what the applied state says the node should attract.
func (a *Announcer) Applied(time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sync(true)
}

// Report has nothing to report yet: announcements show in the routers.
func (a *Announcer) Report(bool) *health.Report { return nil }

// Announced lists what is announced now.
func (a *Announcer) Announced() map[netip.Prefix]netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[netip.Prefix]netip.Addr, len(a.announced))
	for p, h := range a.announced {
		out[p] = h
	}
	return out
}

// sync withdraws what is not wanted and, when rise, announces what is.
// Called with mu held.
func (a *Announcer) sync(rise bool) {
	ctx := context.Background()
	want := Wanted(a.state, a.proxyHealthy())
	for p, hop := range a.announced {
		if w, ok := want[p]; !ok || w != hop {
			if err := a.sp.Withdraw(ctx, p, hop); err != nil {
				a.log.Error("BGP withdraw failed", "prefix", p, "error", err)
				continue
			}
			delete(a.announced, p)
		}
	}
	if !rise {
		return
	}
	for p, hop := range want {
		if _, ok := a.announced[p]; ok {
			continue
		}
		if err := a.sp.Announce(ctx, p, hop); err != nil {
			a.log.Error("BGP announce failed", "prefix", p, "error", err)
			continue
		}
		a.announced[p] = hop
	}
}

// Wanted is what a node in state st should announce: every load-balancer
// IP, as a host prefix, with the node's address of that family as next
// hop, unless the node should not attract the service's traffic.
func Wanted(st datapath.NodeState, proxyHealthy bool) map[netip.Prefix]netip.Addr {
	want := map[netip.Prefix]netip.Addr{}
	if st.Node.Deleting || st.Node.Drained || !proxyHealthy {
		return want
	}
	for _, svc := range st.Services {
		for _, vip := range svc.LoadBalancerIPs {
			hop, ok := nodeAddr(st.Node.Addresses, vip.Is6())
			if !ok {
				continue
			}
			if svc.ExternalTrafficPolicy == datapath.Local && !hasReadyLocal(svc, vip.Is6()) {
				continue
			}
			want[netip.PrefixFrom(vip, vip.BitLen())] = hop
		}
	}
	return want
}

func nodeAddr(addrs []netip.Addr, is6 bool) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Is6() == is6 && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func hasReadyLocal(svc *datapath.Service, is6 bool) bool {
	for _, p := range svc.Ports {
		for _, ep := range p.Endpoints {
			if ep.Local && ep.Ready && ep.Addr.Is6() == is6 {
				return true
			}
		}
	}
	return false
}
