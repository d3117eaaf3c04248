package ipam

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// A pool with avoid_buggy_ips gives out no IPv4 address ending in .0 or
// .255, neither picked nor asked for, and does not count them as free.
func TestAvoidBuggyIPsSkipsDot0AndDot255(t *testing.T) {
	reg := registrytest.Open(t)
	var ranges []model.AddressRange
	for _, s := range []string{"198.51.100.255-198.51.101.1", "2001:db8::-2001:db8::1"} {
		r, err := model.ParseAddressRange(s)
		if err != nil {
			t.Fatal(err)
		}
		ranges = append(ranges, r)
	}
	pool := &model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: ranges, AvoidBuggyIPs: true}
	if _, err := reg.Pools.Create(pool); err != nil {
		t.Fatal(err)
	}
	for i, ask := range []string{"", "198.51.101.0", "", ""} {
		s := &model.Service{Meta: model.Meta{Namespace: "shop", Name: fmt.Sprintf("s%d", i)}, Type: model.LoadBalancer,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		if ask != "" {
			s.RequestedLoadBalancerIPs = []netip.Addr{netip.MustParseAddr(ask)}
		}
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]string{}
	for _, w := range New(reg, nil, nil).Plan() {
		got[w.Service.Key()] = fmt.Sprint(w.IPs, " ", w.Reason, " ", w.Message)
	}
	// Plan decides every service against the same free addresses: the
	// first free one is .1 of the second /24, for each of them.
	if want := "[198.51.101.1]  "; got["shop/s0"] != want {
		t.Errorf("shop/s0 was given %q; want %q (.255 and .0 are avoided)", got["shop/s0"], want)
	}
	if want := "[] " + ReasonNotAllowed + " 198.51.101.0 ends in .0 or .255"; !strings.HasPrefix(got["shop/s1"], want) {
		t.Errorf("shop/s1 asked for .0: %q; want it refused, %q", got["shop/s1"], want)
	}
	if u := UsageOf(pool, nil); u.AvailableIPv4 != 1 || u.AvailableIPv6 != 2 {
		t.Errorf("usage %+v: want 1 IPv4 free (.0 and .255 avoided) and 2 IPv6 (not affected)", u)
	}
}

// A service that holds .0 or .255 of a pool that avoids them (turned on
// after it got it) is given another address, as MetalLB does: the
// operator turned it on because those addresses do not work for some
// clients. One that holds a good address keeps it (nothing written).
func TestAvoidBuggyIPsTakesBackWhatWasGivenBefore(t *testing.T) {
	reg := registrytest.Open(t)
	r, err := model.ParseAddressRange("198.51.100.254-198.51.101.2")
	if err != nil {
		t.Fatal(err)
	}
	pool := &model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: []model.AddressRange{r}, AvoidBuggyIPs: true}
	if _, err := reg.Pools.Create(pool); err != nil {
		t.Fatal(err)
	}
	for i, held := range []string{"198.51.100.255", "198.51.100.254"} {
		s := &model.Service{Meta: model.Meta{Namespace: "shop", Name: fmt.Sprintf("s%d", i)}, Type: model.LoadBalancer,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster,
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(held)}}
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]string{}
	for _, w := range New(reg, nil, nil).Plan() {
		got[w.Service.Key()] = fmt.Sprint(w.IPs)
	}
	if want := "[198.51.101.1]"; got["shop/s0"] != want {
		t.Errorf("shop/s0 held .255: given %q; want %q", got["shop/s0"], want)
	}
	if w, written := got["shop/s1"]; written {
		t.Errorf("shop/s1 held .254: given %q; want it kept (no write)", w)
	}
}
