package ipam

import (
	"math"
	"net/netip"
	"testing"

	"github.com/weirlb/weir/server/model"
)

func TestUsageCountsEachHeldAddressOnce(t *testing.T) {
	r := func(s string) model.AddressRange {
		a, err := model.ParseAddressRange(s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	pool := &model.AddressPool{Ranges: []model.AddressRange{r("203.0.113.0/28"), r("198.51.100.10-198.51.100.11"), r("2001:db8::/64")}}
	svc := func(ips ...string) *model.Service {
		s := &model.Service{}
		for _, ip := range ips {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.MustParseAddr(ip))
		}
		return s
	}
	got := UsageOf(pool, []*model.Service{
		svc("203.0.113.1", "2001:db8::1"),
		svc("203.0.113.1"), // shared: counted once
		svc("198.51.100.11"),
		svc("192.0.2.1"), // another pool's
	})
	want := Usage{AssignedIPv4: 2, AvailableIPv4: 16, AssignedIPv6: 1, AvailableIPv6: math.MaxInt64}
	if got != want {
		t.Errorf("usage %+v, want %+v", got, want)
	}
}
