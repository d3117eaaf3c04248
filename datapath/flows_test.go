package datapath

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

func flowsState(ring int, peers ...FlowPeer) NodeState {
	st := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false), ep("fd00:244:1::11", true)))
	st.Node.Addresses = append(st.Node.Addresses, netip.MustParseAddr("2001:db8::11"))
	st.Node.FlowRing, st.Node.FlowPeers = ring, peers
	return st
}

// A new connection's first packet goes where it went without redirection:
// the rules that pass moved connections on never touch it.
func TestNewConnectionsIgnoreTheFlowRules(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
	if err := dp.Apply(ctx, flowsState(3, FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}})); err != nil {
		t.Fatal(err)
	}
	both := verdict{Endpoints: []string{"10.244.1.11:8080", "10.244.2.11:8080"}}
	for _, src := range []netip.Addr{podSource, externalSource} {
		if diff := cmp.Diff(both, trace(t, v4, src, "tcp", netip.MustParseAddrPort("203.0.113.10:80"))); diff != "" {
			t.Errorf("from %s (-want +got):\n%s", src, diff)
		}
	}
}

// How far a moved packet may go is the ring's size, per family with a
// peer to send it to; no ring, no redirection.
func TestFlowTTLsFollowTheRing(t *testing.T) {
	ctx := context.Background()
	peer4 := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}}
	peer46 := FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}
	for _, tc := range []struct {
		name   string
		st     NodeState
		v4, v6 []string
	}{
		{"no ring", flowsState(0), nil, nil},
		{"two nodes: the first node sends, the next serves", flowsState(2, peer46), []string{"255"}, []string{"255"}},
		{"four nodes", flowsState(4, peer46), []string{"253-255"}, []string{"253-255"}},
		{"no IPv6 peer", flowsState(4, peer4), []string{"253-255"}, nil},
		{"a ring larger than TTLs allow", flowsState(1000, peer46), []string{"16-255"}, []string{"16-255"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, v6 := newConfiguredFakeDatapath(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
			if err := dp.Apply(ctx, tc.st); err != nil {
				t.Fatal(err)
			}
			for _, f := range []struct {
				name string
				fake *knftables.Fake
				want []string
			}{{"ip", v4, tc.v4}, {"ip6", v6, tc.v6}} {
				var got []string
				for _, e := range f.fake.Table.Sets[genOf(f.fake.Table).of(flowTTLsSet)].Elements {
					got = append(got, e.Key...)
				}
				if diff := cmp.Diff(f.want, got); diff != "" {
					t.Errorf("%s flow TTLs (-want +got):\n%s", f.name, diff)
				}
			}
		})
	}
}
