package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

// TestElementsHoldNoPointer: a table of 100,000 services has over a million
// live elements; each is a fixed-size value with no pointer in it, so that
// holding them costs no allocation per element and the collector never
// walks them.
func TestElementsHoldNoPointer(t *testing.T) {
	var hasPointer func(reflect.Type) bool
	hasPointer = func(typ reflect.Type) bool {
		switch typ.Kind() {
		case reflect.Struct:
			for i := range typ.NumField() {
				if hasPointer(typ.Field(i).Type) {
					return true
				}
			}
			return false
		case reflect.Array:
			return hasPointer(typ.Elem())
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			return false
		}
		return true
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[elemID](), reflect.TypeFor[liveElement](), reflect.TypeFor[compactID](), reflect.TypeFor[compactLive]()} {
		if hasPointer(typ) {
			t.Errorf("%v holds a pointer", typ)
		}
	}
	if size := unsafe.Sizeof(elemID{}) + unsafe.Sizeof(liveElement{}); size > 96 {
		t.Errorf("a live element takes %d bytes, more than 96", size)
	}
}

// everyKindOfElement is a state with an element in every set and map of
// both families: address frontends of every kind and protocol, node ports,
// traffic policies, session affinity, source ranges, services without
// endpoints, interval sets and the flow ring's TTLs.
func everyKindOfElement() (NodeState, Config) {
	mk := func(name string, i byte, proto Protocol) *Service {
		return &Service{
			Key:             ServiceKey{"default", name},
			ClusterIPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, i}), netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i))},
			ExternalIPs:     []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, i})},
			LoadBalancerIPs: []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, i}), netip.MustParseAddr(fmt.Sprintf("2001:db8:1::%x", i))},
			Ports: []ServicePort{{Name: "p", Protocol: proto, Port: 80, NodePort: 30000 + uint16(i), Endpoints: []Endpoint{
				{Addr: netip.AddrFrom4([4]byte{10, 244, 1, i}), Port: 8080, Local: true, Ready: true, Serving: true},
				{Addr: netip.AddrFrom4([4]byte{10, 244, 2, i}), Port: 8080, Ready: true, Serving: true},
				{Addr: netip.MustParseAddr(fmt.Sprintf("fd00:244:1::%x", i)), Port: 8080, Local: true, Ready: true, Serving: true},
			}}},
		}
	}
	var svcs []*Service
	for i, p := range protocols {
		svcs = append(svcs, mk("cluster-"+p.String(), byte(10+i), p))
		local := mk("local-"+p.String(), byte(20+i), p)
		local.ExternalTrafficPolicy, local.InternalTrafficPolicy = Local, Local
		svcs = append(svcs, local)
	}
	affinity := mk("affinity", 3, TCP)
	affinity.SessionAffinityTimeout = 3 * time.Hour
	affinity.ExternalTrafficPolicy = Local
	ranges := mk("ranges", 4, SCTP)
	ranges.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8:ff::/48")}
	empty := mk("empty", 5, UDP)
	empty.Ports[0].Endpoints = nil
	st := nodeState(append(svcs, affinity, ranges, empty)...)
	st.Node.Addresses = append(st.Node.Addresses, netip.MustParseAddr("2001:db8::11"))
	st.Node.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	st.Node.FlowRing = 3
	st.Node.FlowPeers = []FlowPeer{{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}}
	st.Node.FlowSenders = []FlowPeer{{Name: "node3", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.13"), netip.MustParseAddr("2001:db8::13")}}}
	cfg := Config{
		ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")},
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("192.0.2.11/32"), netip.MustParsePrefix("2001:db8::/64")},
		Flows:             &FlowRedirect{Interface: "weir-flows"},
	}
	return st, cfg
}

// TestFullSyncOverNetlinkMatchesNft: a whole table loaded from the
// elements' bytes over netlink is the table nft makes from their rendering
// as text, for every set and map of both families.
func TestFullSyncOverNetlinkMatchesNft(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	state, cfg := everyKindOfElement()
	tables := map[bool][]string{}
	for _, overNft := range []bool{false, true} {
		removeTables(t)
		dp, err := newForNode(cfg, overNft)
		if err != nil {
			t.Fatal(err)
		}
		if err := dp.Apply(ctx, state); err != nil {
			t.Fatalf("elements over nft %v: %v", overNft, err)
		}
		tables[overNft] = canonicalTables(t)
	}
	if len(tables[true]) == 0 {
		t.Fatal("nft made no table")
	}
	if diff := cmp.Diff(tables[true], tables[false]); diff != "" {
		t.Fatalf("the table loaded over netlink differs from nft's (-nft +netlink):\n%s", diff)
	}
	// Every set and map of both families holds an element: the state
	// leaves none of their layouts untried.
	sets, _ := everyKindOfElementSets(state, cfg)
	for fam, names := range sets {
		for _, name := range setNames {
			if !names[name] {
				t.Errorf("%s: the state has no element of %s", families[fam], name)
			}
		}
	}
}

// everyKindOfElementSets names, per family, the sets the state's elements
// are in.
func everyKindOfElementSets(state NodeState, cfg Config) ([2]map[string]bool, int) {
	out := [2]map[string]bool{{}, {}}
	dp := New(nil, nil, cfg)
	dp.nft = nil
	elems := nodeElements(state.Node, dp.cfg)
	for _, svc := range state.Services {
		elems = append(elems, serviceContribution(svc, state.Node, DefaultMasqueradeMark).elems...)
	}
	for _, e := range elems {
		out[e.fam][e.set.String()] = true
	}
	return out, len(elems)
}

// TestLatePicksKeepTheirRules: a pick that the first batch of a full sync
// over netlink does not name (here a node port's flow table, after a load-
// balancer IP's 4,093 slots filled the first batch) has its chain written
// after the transaction that empties the pick chains and writes the first
// picks' rules, never before: the table equals the one nft loads, every
// time. Before, the two transactions raced and pick rules went missing.
func TestLatePicksKeepTheirRules(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	svc := &Service{Key: ServiceKey{"default", "quic"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.30")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.30")},
		Ports:           []ServicePort{{Name: "quic", Protocol: UDP, Port: 443, NodePort: 30443}}}
	for i := range 130 {
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(1 + i/100), byte(1 + i%100)}),
			Port: 8443, Ready: true, Serving: true})
	}
	web := webService(ep("10.244.9.11", true), ep("10.244.9.12", false), ep("10.244.9.13", false))
	state := nodeState(svc, web)
	if flowTableSize(130) <= loadBatch {
		t.Fatalf("a table of %d slots fits the first batch (%d): no late pick", flowTableSize(130), loadBatch)
	}
	var want []string
	for run := range 6 {
		overNft := run == 0
		removeTables(t)
		dp, err := newForNode(Config{}, overNft)
		if err != nil {
			t.Fatal(err)
		}
		if err := dp.Apply(ctx, state); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		got := canonicalTables(t)
		if overNft {
			want = got
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("run %d: the table loaded over netlink differs from nft's (-nft +netlink):\n%s", run, diff)
		}
	}
}
