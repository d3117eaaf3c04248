package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/knftables"
)

// TestElementChangesOverNetlinkMatchNft: changes made of elements alone
// (an endpoint moved, a service added or removed next to others of its
// shape, a service left without endpoints, both families) go over the
// element writer's netlink socket, and leave tables identical to what a
// fresh agent programs through nft for the same state, while a service no
// change touches keeps answering.
func TestElementChangesOverNetlinkMatchNft(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	svc := func(i int, endpoints ...string) *Service {
		s := &Service{
			Key:             ServiceKey{"default", fmt.Sprintf("svc%d", i)},
			ClusterIPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)}), netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", 10+i))},
			LoadBalancerIPs: []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)})},
			Ports:           []ServicePort{{Name: "p", Protocol: TCP, Port: 80, NodePort: uint16(30080 + i)}},
		}
		for _, e := range endpoints {
			s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, Endpoint{Addr: netip.MustParseAddr(e), Port: 8080, Local: true, Ready: true, Serving: true})
		}
		return s
	}
	state := nodeState(stableService(),
		svc(0, "10.244.1.10", "10.244.1.11", "fd00:244:1::10", "fd00:244:1::11"),
		svc(1, "10.244.1.20", "10.244.1.21", "fd00:244:1::20", "fd00:244:1::21"),
		svc(2, "10.244.1.30", "10.244.1.31", "fd00:244:1::30", "fd00:244:1::31"),
		svc(3, "10.244.1.40", "10.244.1.41", "fd00:244:1::40", "fd00:244:1::41"))
	dp, err := NewForNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Apply(ctx, state); err != nil {
		t.Fatal(err)
	}
	probe := startProbe(t)
	with := func(s *Service) NodeState {
		next := NodeState{Node: state.Node, Services: map[ServiceKey]*Service{}}
		for k, v := range state.Services {
			next.Services[k] = v
		}
		next.Services[s.Key] = s
		return next
	}
	without := func(key ServiceKey) NodeState {
		next := with(state.Services[key])
		delete(next.Services, key)
		return next
	}
	for _, step := range []struct {
		what string
		next NodeState
	}{
		{"an IPv4 endpoint moves", with(svc(0, "10.244.1.12", "10.244.1.11", "fd00:244:1::10", "fd00:244:1::11"))},
		{"an IPv6 endpoint moves", with(svc(1, "10.244.1.20", "10.244.1.21", "fd00:244:1::22", "fd00:244:1::21"))},
		{"a service of an existing shape comes", with(svc(4, "10.244.1.50", "10.244.1.51", "fd00:244:1::50", "fd00:244:1::51"))},
		{"a service goes", without(ServiceKey{"default", "svc2"})},
		{"a service loses its endpoints", with(svc(3))},
	} {
		before := dp.elements.commits
		if err := dp.Apply(ctx, step.next); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		state = step.next
		if dp.elements.commits == before {
			t.Errorf("%s: not committed over netlink", step.what)
		}
		got := canonicalTables(t)
		if failed := probe.failures(); failed != nil {
			t.Fatalf("%s: connections to the unchanged service failed: %v", step.what, failed)
		}
		probe.excused.Store(true)
		removeTables(t)
		fresh, err := NewForNode(Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := fresh.Apply(ctx, state); err != nil {
			t.Fatal(err)
		}
		probe.forgetExcused(t)
		probe.excused.Store(false)
		if diff := cmp.Diff(canonicalTables(t), got); diff != "" {
			t.Fatalf("%s: the tables differ from a fresh agent's (-fresh +got):\n%s", step.what, diff)
		}
		dp = fresh // the walk goes on from a fresh agent's tables
	}
}

// TestTableListedOverNetlinkAsByNft: the names a full sync lists over the
// element writer's socket (chains, sets, maps, both families) are those
// knftables lists, with foreign objects and a rule's anonymous set in the
// table;
// and a family without a table lists nothing.
func TestTableListedOverNetlinkAsByNft(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	dp, err := NewForNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Apply(ctx, nodeState(stableService())); err != nil {
		t.Fatal(err)
	}
	for _, args := range []string{
		"add map ip weir foreign_map { type ipv4_addr : ipv4_addr ; }",
		"add set ip weir foreign_set { type inet_service ; }",
		"add chain ip weir foreign_chain",
		"add rule ip weir foreign_chain ip daddr { 192.0.2.1, 192.0.2.2 } accept",
		"add table ip other",
		"add chain ip other elsewhere",
		"delete table ip6 weir",
	} {
		if out, err := exec.Command("nft", args).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v: %s", args, err, out)
		}
	}
	for _, f := range families {
		got, ok, err := dp.elements.list(f)
		if !ok || err != nil {
			t.Fatalf("%s: listing over netlink: %v %v", f, ok, err)
		}
		var want tableObjects
		for _, l := range []struct {
			kind string
			into *[]string
		}{{"chain", &want.chains}, {"set", &want.sets}, {"map", &want.maps}} {
			names, err := dp.nft[f][0].List(ctx, l.kind)
			if err != nil && !knftables.IsNotFound(err) {
				t.Fatal(err)
			}
			*l.into = names
			if len(want.chains) == 0 {
				break // no table: knftables fails on its sets
			}
		}
		for _, names := range [][]string{got.chains, got.sets, got.maps, want.chains, want.sets, want.maps} {
			slices.Sort(names)
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(tableObjects{}), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: listed over netlink (-by knftables +over netlink):\n%s", f, diff)
		}
		if f.is6 && len(got.chains) != 0 {
			t.Errorf("ip6: no table, yet %v listed", got)
		}
		if !f.is6 && !slices.Contains(got.maps, "foreign_map") {
			t.Errorf("ip: the foreign map not listed: %v", got)
		}
	}
}
