package ipam

import (
	"math"
	"math/big"
	"net/netip"

	"github.com/weirlb/weir/internal/iprange"
	"github.com/weirlb/weir/server/model"
)

// Usage is how much of a pool services hold, per family: addresses
// assigned, and addresses left (at most math.MaxInt64 each, which an IPv6
// pool may hold more than).
type Usage struct {
	AssignedIPv4, AvailableIPv4 int64
	AssignedIPv6, AvailableIPv6 int64
}

// UsageOf counts the addresses of pool that services hold as
// load-balancer IPs (an address shared by several services counts once).
func UsageOf(pool *model.AddressPool, services []*model.Service) Usage {
	held := map[netip.Addr]bool{}
	for _, s := range services {
		for _, ip := range s.LoadBalancerIPs {
			for _, r := range pool.Ranges {
				if r.Contains(ip) {
					held[ip] = true
				}
			}
		}
	}
	var u Usage
	size4, size6 := new(big.Int), new(big.Int)
	for _, r := range pool.Ranges {
		n := new(big.Int).Sub(new(big.Int).SetBytes(r.Last.AsSlice()), new(big.Int).SetBytes(r.First.AsSlice()))
		n.Add(n, big.NewInt(1))
		if r.First.Is4() && pool.AvoidBuggyIPs {
			n.Sub(n, big.NewInt(iprange.EndingIn0Or255(r.First, r.Last)))
		}
		if r.First.Is4() {
			size4.Add(size4, n)
		} else {
			size6.Add(size6, n)
		}
	}
	for ip := range held {
		if ip.Is4() {
			u.AssignedIPv4++
		} else {
			u.AssignedIPv6++
		}
	}
	left := func(size *big.Int, used int64) int64 {
		n := new(big.Int).Sub(size, big.NewInt(used))
		if !n.IsInt64() {
			return math.MaxInt64
		}
		return max(n.Int64(), 0)
	}
	u.AvailableIPv4, u.AvailableIPv6 = left(size4, u.AssignedIPv4), left(size6, u.AssignedIPv6)
	return u
}
