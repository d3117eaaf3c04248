package l2

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weirlb/weir/datapath"
)

// Where an address is answered: the pool's interfaces, each of which must
// exist, or else every interface whose subnet holds it; otherwise the
// reason, which the server shows as CannotAnswer.
func TestInterfacesFor(t *testing.T) {
	links := []localLink{
		{name: "eth0", subnets: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8:2::/64")}},
		{name: "eth1", subnets: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
		{name: "bond0", subnets: []netip.Prefix{netip.MustParsePrefix("192.0.2.128/25")}},
	}
	for _, c := range []struct {
		addr  string
		named []string
		want  []string
		why   string
	}{
		{"192.0.2.200", nil, []string{"eth0", "bond0"}, ""},
		{"2001:db8:2::200", nil, []string{"eth0"}, ""},
		{"203.0.113.5", nil, nil, "no interface of the node has a subnet that holds 203.0.113.5"},
		{"203.0.113.5", []string{"eth1"}, []string{"eth1"}, ""},
		{"192.0.2.200", []string{"eth0", "eth9"}, nil, `the node has no interface "eth9"`},
	} {
		got, why := interfacesFor(netip.MustParseAddr(c.addr), c.named, links, nil)
		if !slices.Equal(got, c.want) || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
			t.Errorf("%s on %v: %v, %q; want %v, %q", c.addr, c.named, got, why, c.want, c.why)
		}
	}
	if _, why := interfacesFor(netip.MustParseAddr("192.0.2.200"), nil, nil, errors.New("netlink: no")); !strings.Contains(why, "netlink: no") {
		t.Errorf("a failed listing: %q", why)
	}
}

// TestAskerFollowsChangesAsAWholeStateWould: over random states handed
// over as changes (Changed naming the services that differ), with L2
// pools that change now and then, the addresses the Asker asks leases
// for are those of the whole state at every step, and once the state is
// applied, those it can take over are those it serves (a Local
// service's only with a ready endpoint on the node, of the address's
// family).
func TestAskerFollowsChangesAsAWholeStateWould(t *testing.T) {
	serves := func(st datapath.NodeState) map[netip.Addr]bool {
		out := map[netip.Addr]bool{}
		for _, svc := range st.Services {
			if svc.OtherController {
				continue
			}
			local := false
			for _, p := range svc.Ports {
				for _, ep := range p.Endpoints {
					local = local || (ep.Local && ep.Ready)
				}
			}
			for _, vip := range svc.LoadBalancerIPs {
				if _, ok := st.Node.L2PoolOf(vip); ok && (svc.ExternalTrafficPolicy == datapath.Cluster || local) {
					out[vip] = true
				}
			}
		}
		return out
	}
	// wanted is the whole state's L2 addresses, sorted.
	wanted := func(st datapath.NodeState) []netip.Addr {
		var out []netip.Addr
		for _, svc := range st.Services {
			if svc.OtherController {
				continue
			}
			for _, vip := range svc.LoadBalancerIPs {
				if _, ok := st.Node.L2PoolOf(vip); ok {
					out = append(out, vip)
				}
			}
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return slices.Compact(out)
	}
	pools := func(rng *rand.Rand) []datapath.L2Pool {
		last := byte(rng.IntN(8))
		return []datapath.L2Pool{{Ranges: []datapath.AddressRange{{First: netip.AddrFrom4([4]byte{192, 0, 2, 0}), Last: netip.AddrFrom4([4]byte{192, 0, 2, last})}}}}
	}
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 2))
		a := NewAsker(nil, "node1", nil, nil, slog.New(slog.DiscardHandler))
		st := datapath.NodeState{Node: datapath.NodeInfo{L2Pools: pools(rng)}, Services: map[datapath.ServiceKey]*datapath.Service{}}
		for step := range 300 {
			next := datapath.NodeState{Node: st.Node, Services: maps.Clone(st.Services), Changed: []datapath.ServiceKey{}}
			if rng.IntN(10) == 0 {
				next.Node.L2Pools = pools(rng)
			}
			for range rng.IntN(4) {
				key := datapath.ServiceKey{Namespace: "default", Name: fmt.Sprintf("s%d", rng.IntN(12))}
				next.Changed = append(next.Changed, key)
				if rng.IntN(4) == 0 {
					delete(next.Services, key)
					continue
				}
				svc := &datapath.Service{Key: key, OtherController: rng.IntN(10) == 0}
				for range rng.IntN(3) {
					svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.AddrFrom4([4]byte{192, 0, byte(2 + rng.IntN(2)), byte(rng.IntN(10))}))
				}
				if rng.IntN(2) == 0 {
					svc.ExternalTrafficPolicy = datapath.Local
				}
				port := datapath.ServicePort{Port: 80}
				for range rng.IntN(3) {
					port.Endpoints = append(port.Endpoints, datapath.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(9))}),
						Local: rng.IntN(2) == 0, Ready: rng.IntN(3) > 0})
				}
				svc.Ports = []datapath.ServicePort{port}
				next.Services[key] = svc
			}
			if rng.IntN(20) == 0 {
				next.Changed = nil
			}
			a.Received(next)
			a.mu.Lock()
			got := a.addrs
			a.mu.Unlock()
			if want := wanted(next); !slices.Equal(got, want) {
				t.Fatalf("seed %d, step %d: asks for %v, want %v", seed, step, got, want)
			}
			a.Applied(0)
			a.mu.Lock()
			applied := maps.Clone(a.applied)
			a.mu.Unlock()
			if want := serves(next); !maps.Equal(applied, want) {
				t.Fatalf("seed %d, step %d: can take over %v, want %v", seed, step, applied, want)
			}
			st = next
		}
	}
}
