package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/servertest"
)

func lbSvc(name, clusterIP string, port int32) *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: name},
		Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{clusterIP},
			Ports: []*weirv1.ServicePort{{Name: "p", Port: port}}},
	}
}

// assigned waits until every named service has the wanted status
// ("203.0.113.100" or "reason:PoolExhausted").
func assigned(t *testing.T, ts *servertest.Server, want map[string]string) {
	t.Helper()
	var got map[string]string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got = map[string]string{}
		for name := range want {
			r, err := ts.Registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: name})
			if err != nil {
				got[name] = err.Error()
				continue
			}
			st := r.GetService().GetStatus()
			got[name] = fmt.Sprint(st.GetLoadBalancerIps())
			if st.GetAddressReason() != "" {
				got[name] = "reason:" + st.GetAddressReason()
			}
		}
		if cmp.Equal(got, want) {
			return
		}
	}
	t.Fatalf("assignments %v, want %v", got, want)
}

func TestAddressPoolsAssignLoadBalancerIPs(t *testing.T) {
	dir := t.TempDir()
	ts := servertest.Start(t, dir)
	ctx := context.Background()
	reg := ts.Registry
	mustPool := func(name string, manual bool, addrs ...string) {
		t.Helper()
		if _, err := reg.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
			Metadata: &weirv1.ObjectMeta{Name: name}, Addresses: addrs, ManualOnly: manual}}); err != nil {
			t.Fatal(err)
		}
	}
	mustPool("public", false, "203.0.113.100-203.0.113.101")
	mustPool("shared", true, "198.51.100.200/32")
	if _, err := reg.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "overlap"}, Addresses: []string{"203.0.113.101/32"}}}); err == nil {
		t.Error("a pool overlapping another was accepted")
	}
	create := func(s *weirv1.Service) {
		t.Helper()
		if _, err := reg.CreateService(ctx, &weirv1.CreateServiceRequest{Service: s}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond) // distinct creation times: older first
	}
	create(lbSvc("a", "10.96.1.1", 80))
	create(lbSvc("b", "10.96.1.2", 80))
	create(lbSvc("c", "10.96.1.3", 80))
	taken := lbSvc("d", "10.96.1.4", 80)
	taken.Spec.LoadBalancerIps = []string{"203.0.113.100"}
	create(taken)
	// Sharing: same key, distinct ports share the manual-only pool's one address.
	for i, port := range []int32{80, 443, 443} {
		s := lbSvc(fmt.Sprintf("share%d", i), fmt.Sprintf("10.96.2.%d", i+1), port)
		s.Spec.AddressPool, s.Spec.AllowSharedIp = "shared", "web"
		create(s)
	}
	assigned(t, ts, map[string]string{
		"a": "[203.0.113.100]", "b": "[203.0.113.101]", "c": "reason:PoolExhausted", "d": "reason:AddressTaken",
		"share0": "[198.51.100.200]", "share1": "[198.51.100.200]", "share2": "reason:PoolExhausted",
	})

	// An update that leaves status out keeps the address.
	got, _ := reg.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "b"})
	upd := got.GetService()
	upd.Status = nil
	upd.Spec.Ports[0].Port = 81
	if _, err := reg.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: upd}); err != nil {
		t.Fatal(err)
	}
	// a goes: its address goes to the oldest waiting service, c.
	if _, err := reg.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"b": "[203.0.113.101]", "c": "[203.0.113.100]", "d": "reason:AddressTaken"}
	assigned(t, ts, want)

	// A restart keeps every assignment where it is.
	ts.Stop()
	ts2 := servertest.Start(t, dir)
	assigned(t, ts2, want)
}

// TestPoolAdvertisementIsValidatedAndKept: peers and aggregation lengths
// round-trip; a length that is no prefix length, or would announce
// addresses outside the pool, is refused naming the field, and the pool
// stays as it was.
func TestPoolAdvertisementIsValidatedAndKept(t *testing.T) {
	ts := servertest.Start(t, t.TempDir())
	ctx := context.Background()
	adv := &weirv1.BgpAdvertisement{Peers: []string{"upstream"}, AggregationLength: 24, AggregationLengthV6: 120}
	created, err := ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/24", "2001:db8:113::/120"}, BgpAdvertisement: adv}})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.GetAddressPool().GetBgpAdvertisement(); !proto.Equal(got, adv) {
		t.Errorf("stored advertisement %v, want %v", got, adv)
	}
	for _, tc := range []struct {
		name      string
		addresses []string
		adv       *weirv1.BgpAdvertisement
		field     string
	}{
		{"not a prefix length", []string{"203.0.113.0/24"}, &weirv1.BgpAdvertisement{AggregationLength: 33}, "bgp_advertisement.aggregation_length"},
		{"aggregate wider than the pool", []string{"203.0.113.0/25"}, &weirv1.BgpAdvertisement{AggregationLength: 24}, "bgp_advertisement.aggregation_length"},
		{"range not aligned to the aggregate", []string{"203.0.113.10-203.0.113.20"}, &weirv1.BgpAdvertisement{AggregationLength: 30}, "bgp_advertisement.aggregation_length"},
		{"IPv6 aggregate wider than the pool", []string{"2001:db8:113::/120"}, &weirv1.BgpAdvertisement{AggregationLengthV6: 112}, "bgp_advertisement.aggregation_length_v6"},
		{"bad peer name", []string{"203.0.113.0/24"}, &weirv1.BgpAdvertisement{Peers: []string{"Upstream_1"}}, "bgp_advertisement.peers[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := proto.Clone(created.GetAddressPool()).(*weirv1.AddressPool)
			pool.Addresses, pool.BgpAdvertisement = tc.addresses, tc.adv
			_, err := ts.Registry.UpdateAddressPool(ctx, &weirv1.UpdateAddressPoolRequest{AddressPool: pool})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.field+":") {
				t.Errorf("got %v %q; want InvalidArgument naming %s", st.Code(), st.Message(), tc.field)
			}
			got, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "public"})
			if err != nil || !proto.Equal(got.GetAddressPool(), created.GetAddressPool()) {
				t.Errorf("the refused update changed the pool: %v, %v", got, err)
			}
		})
	}
}
