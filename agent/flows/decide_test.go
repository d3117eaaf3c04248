package flows

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"

	"github.com/weirlb/weir/datapath"
)

// fakeKernel records what Flows programs, as the kernel would hold it:
// the device's addresses, its forwarding entries and the table's routes.
type fakeKernel struct {
	failAt string // "device", "forward", "route" or "rules": that step fails

	local, own4 netip.Addr // the device's, invalid when there is none
	forwards    map[netip.Addr]bool
	routes      map[bool]fakeRoute // by family: is6
	ruled       bool
}

type fakeRoute struct {
	gw, outer netip.Addr
	mac       string
}

var errKernel = errors.New("kernel says no")

func (k *fakeKernel) fail(step string) error {
	if k.failAt == step {
		return errKernel
	}
	return nil
}

func (k *fakeKernel) device(local, own4 netip.Addr) (netlink.Link, error) {
	if err := k.fail("device"); err != nil {
		return nil, err
	}
	k.local, k.own4 = local, own4
	return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DefaultInterface, Index: 7}}, nil
}

func (k *fakeKernel) forwardTo(_ netlink.Link, outer netip.Addr) error {
	if k.forwards == nil {
		k.forwards = map[netip.Addr]bool{}
	}
	k.forwards[outer] = true
	return k.fail("forward")
}

func (k *fakeKernel) route(_ netlink.Link, gw netip.Addr, mac net.HardwareAddr, outer netip.Addr) error {
	if err := k.fail("route"); err != nil {
		return err
	}
	if k.routes == nil {
		k.routes = map[bool]fakeRoute{}
	}
	k.routes[gw.Is6()] = fakeRoute{gw: gw, outer: outer, mac: mac.String()}
	return nil
}

func (k *fakeKernel) removeRoute(is6 bool) { delete(k.routes, is6) }

func (k *fakeKernel) removeRoutes() error {
	clear(k.routes)
	return nil
}

func (k *fakeKernel) rules() error {
	k.ruled = true
	return k.fail("rules")
}

func (k *fakeKernel) removeAll() error {
	*k = fakeKernel{}
	return nil
}

func newFake() (*Flows, *fakeKernel) {
	f := New(Config{})
	k := &fakeKernel{}
	f.kernel = k
	return f, k
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func flowPeer(name string, a ...string) datapath.FlowPeer {
	return datapath.FlowPeer{Name: name, Addresses: addrs(a...)}
}

func v4Route(gw string) fakeRoute {
	a := netip.MustParseAddr(gw)
	return fakeRoute{gw: a, outer: a, mac: MAC(a).String()}
}

// v6Route is the IPv6 route to the device whose outer address is outer:
// through its link-local address, which the device reaches directly.
func v6Route(outer string) fakeRoute {
	a := netip.MustParseAddr(outer)
	return fakeRoute{gw: linkLocal(MAC(a)), outer: a, mac: MAC(a).String()}
}

// Where Set sends moved packets, and what it tells the datapath to mark:
// the first peer of the ring that answers and that the node's outer family
// reaches, routed in each family the peer has; no ring at all when there
// is no such peer, so that no packet is marked for a route that does not
// exist. Every peer the probes ask gets a forwarding entry.
func TestSetSendsToTheFirstAlivePeer(t *testing.T) {
	dual := addrs("192.0.2.11", "2001:db8::11")
	for _, tc := range []struct {
		name     string
		node     datapath.NodeInfo
		dead     map[string]bool
		want     datapath.NodeInfo
		routes   map[bool]fakeRoute
		forwards []string
	}{{
		name: "both families to the first peer",
		node: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 3,
			FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12", "2001:db8::12"), flowPeer("node3", "192.0.2.13")}},
		want: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 3,
			FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12", "2001:db8::12")}},
		routes:   map[bool]fakeRoute{false: v4Route("192.0.2.12"), true: v6Route("192.0.2.12")},
		forwards: []string{"192.0.2.12", "192.0.2.13"},
	}, {
		name: "a silent first peer is passed over, and its IPv6 route goes with it",
		node: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 3,
			FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12", "2001:db8::12"), flowPeer("node3", "192.0.2.13")}},
		dead: map[string]bool{"node2": true},
		want: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 3,
			FlowPeers: []datapath.FlowPeer{flowPeer("node3", "192.0.2.13")}},
		routes:   map[bool]fakeRoute{false: v4Route("192.0.2.13")},
		forwards: []string{"192.0.2.12", "192.0.2.13"},
	}, {
		name: "no peer answers: the first reachable one",
		node: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 4,
			FlowPeers: []datapath.FlowPeer{flowPeer("node2", "2001:db8::12"), flowPeer("node3", "192.0.2.13"), flowPeer("node4", "192.0.2.14")}},
		dead: map[string]bool{"node3": true, "node4": true},
		want: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 4,
			FlowPeers: []datapath.FlowPeer{flowPeer("node3", "192.0.2.13")}},
		routes:   map[bool]fakeRoute{false: v4Route("192.0.2.13")},
		forwards: []string{"192.0.2.13", "192.0.2.14"},
	}, {
		name: "an IPv6-only node sends to IPv6 peers only",
		node: datapath.NodeInfo{Name: "node1", Addresses: addrs("2001:db8::11"), FlowRing: 3,
			FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12"), flowPeer("node3", "2001:db8::13")}},
		want: datapath.NodeInfo{Name: "node1", Addresses: addrs("2001:db8::11"), FlowRing: 3,
			FlowPeers: []datapath.FlowPeer{flowPeer("node3", "2001:db8::13")}},
		routes:   map[bool]fakeRoute{true: v6Route("2001:db8::13")},
		forwards: []string{"2001:db8::13"},
	}, {
		name: "a ring of one: nothing to pass on",
		node: datapath.NodeInfo{Name: "node1", Addresses: dual, FlowRing: 1, FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12")}},
		want: datapath.NodeInfo{Name: "node1", Addresses: dual},
	}, {
		name: "no peer of the node's family",
		node: datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11"), FlowRing: 2, FlowPeers: []datapath.FlowPeer{flowPeer("node2", "2001:db8::12")}},
		want: datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11")},
	}, {
		name: "a node without addresses",
		node: datapath.NodeInfo{Name: "node1", FlowRing: 2, FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12")}},
		want: datapath.NodeInfo{Name: "node1"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f, k := newFake()
			f.dead = tc.dead
			got, err := f.Set(tc.node)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("the node as the datapath must program it (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.routes, k.routes, cmp.AllowUnexported(fakeRoute{}), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("routes by family, is6 (-want +got):\n%s", diff)
			}
			var forwards []string
			for _, a := range addrs(tc.forwards...) {
				if !k.forwards[a] {
					t.Errorf("no forwarding entry for the probes to %s", a)
				}
				forwards = append(forwards, a.String())
			}
			if len(k.forwards) != len(forwards) {
				t.Errorf("forwarding entries %v; want %v", k.forwards, forwards)
			}
			if len(tc.routes) > 0 && !k.ruled {
				t.Error("routes but no rules selecting their table")
			}
		})
	}
}

// A node that had a route and loses its ring has its routes removed, and
// says so to the datapath.
func TestSetRemovesTheRoutesWithTheRing(t *testing.T) {
	f, k := newFake()
	node := datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11"), FlowRing: 2, FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12")}}
	if _, err := f.Set(node); err != nil || len(k.routes) != 1 {
		t.Fatalf("Set: %v, routes %v; want one route", err, k.routes)
	}
	node.FlowRing = 1
	got, err := f.Set(node)
	if err != nil {
		t.Fatal(err)
	}
	if got.FlowRing != 0 || got.FlowPeers != nil || len(k.routes) != 0 {
		t.Errorf("ring %d, peers %v, routes %v; want none", got.FlowRing, got.FlowPeers, k.routes)
	}
	if next, _ := f.sendingTo(); next != "" {
		t.Errorf("still sending to %q", next)
	}
}

// A step the kernel refuses leaves the node without a ring (the datapath
// then marks nothing) and returns the kernel's error; where packets went
// before is kept, so that the next Set reports the change.
func TestSetRefusedByTheKernel(t *testing.T) {
	for _, step := range []string{"device", "forward", "route", "rules"} {
		t.Run(step, func(t *testing.T) {
			f, k := newFake()
			node := datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11"), FlowRing: 3,
				FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12"), flowPeer("node3", "192.0.2.13")}}
			if _, err := f.Set(node); err != nil {
				t.Fatal(err)
			}
			k.failAt = step
			f.dead = map[string]bool{"node2": true}
			got, err := f.Set(node)
			if !errors.Is(err, errKernel) {
				t.Errorf("error %v; want the kernel's", err)
			}
			if got.FlowRing != 0 || got.FlowPeers != nil {
				t.Errorf("ring %d, peers %v; want none", got.FlowRing, got.FlowPeers)
			}
			if next, _ := f.sendingTo(); next != "node2" {
				t.Errorf("sending to %q; want node2 kept until a Set succeeds", next)
			}
		})
	}
}

// Which next node is alive, as the probes' answers come and go: no
// verdict before the first deadline, a silent peer passed over (the route
// moves to the next one), taken back when it answers again, and a node
// that hears no peer at all keeps its route.
func TestJudgeMovesTheRoute(t *testing.T) {
	f, k := newFake()
	node := datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11"), FlowRing: 4,
		FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12"), flowPeer("node3", "192.0.2.13"), flowPeer("node4", "192.0.2.14")}}
	if _, err := f.Set(node); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	f.started = t0
	for _, s := range []struct {
		what      string
		at        time.Duration
		answering []string
		next      string
		passed    []string
	}{
		{"no answer yet, within the first deadline", probeDeadline - time.Millisecond, nil, "node2", nil},
		{"every peer answers", 3 * time.Second, []string{"192.0.2.12", "192.0.2.13", "192.0.2.14"}, "node2", nil},
		{"node2 silent", 6 * time.Second, []string{"192.0.2.13", "192.0.2.14"}, "node3", []string{"node2"}},
		{"node3 silent too", 9 * time.Second, []string{"192.0.2.14"}, "node4", []string{"node2", "node3"}},
		{"no peer answers: nothing changes", 12 * time.Second, nil, "node4", []string{"node2", "node3"}},
		{"node2 answers again", 13 * time.Second, []string{"192.0.2.12", "192.0.2.14"}, "node2", []string{"node3"}},
	} {
		for _, a := range s.answering {
			f.answered(netip.MustParseAddr(a), false, t0.Add(s.at-100*time.Millisecond))
		}
		judgeAndCheck(t, f, k, t0.Add(s.at), s.what, s.next, s.passed)
	}
}

// A peer whose table marked its answers and no longer does lost its rules
// (flushed while its agent was away): its kernel still answers, but what
// it is passed it would serve as new. It is passed over like a silent
// one, after the same deadline, and taken back when its table marks
// answers again. A peer that never marked one (an older agent) counts as
// alive on its kernel's answers.
func TestJudgePassesOverAPeerWithoutItsRules(t *testing.T) {
	f, k := newFake()
	node := datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11"), FlowRing: 4,
		FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12"), flowPeer("node3", "192.0.2.13"), flowPeer("node4", "192.0.2.14")}}
	if _, err := f.Set(node); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	f.started = t0
	type answers struct{ byTable, kernelOnly []string }
	for _, s := range []struct {
		what   string
		at     time.Duration
		answer answers
		next   string
		passed []string
	}{
		// node4 runs an older agent: its table never marks an answer.
		{"every table answers", 3 * time.Second, answers{[]string{"192.0.2.12", "192.0.2.13"}, []string{"192.0.2.14"}}, "node2", nil},
		{"node2's rules flushed, within the deadline", 4 * time.Second, answers{[]string{"192.0.2.13"}, []string{"192.0.2.12", "192.0.2.14"}}, "node2", nil},
		{"node2's rules flushed, past the deadline", 5*time.Second + probeDeadline/2, answers{[]string{"192.0.2.13"}, []string{"192.0.2.12", "192.0.2.14"}}, "node3", []string{"node2"}},
		{"an older agent's node keeps answering unmarked", 9 * time.Second, answers{[]string{"192.0.2.13"}, []string{"192.0.2.12", "192.0.2.14"}}, "node3", []string{"node2"}},
		{"node2's rules back", 10 * time.Second, answers{[]string{"192.0.2.12", "192.0.2.13"}, []string{"192.0.2.14"}}, "node2", nil},
	} {
		for _, a := range s.answer.byTable {
			f.answered(netip.MustParseAddr(a), true, t0.Add(s.at-100*time.Millisecond))
		}
		for _, a := range s.answer.kernelOnly {
			f.answered(netip.MustParseAddr(a), false, t0.Add(s.at-100*time.Millisecond))
		}
		judgeAndCheck(t, f, k, t0.Add(s.at), s.what, s.next, s.passed)
	}
}

// On IPv6-only nodes the probes go in IPv6, to the peers' outer IPv6
// addresses, and a silent peer is passed over as in IPv4; a dual-stack
// node probes its peers' IPv4 addresses.
func TestIPv6OnlyNodesProbeAndJudgeTheirPeers(t *testing.T) {
	f, k := newFake()
	node := datapath.NodeInfo{Name: "node1", Addresses: addrs("2001:db8::11"), FlowRing: 3,
		FlowPeers: []datapath.FlowPeer{flowPeer("node2", "2001:db8::12"), flowPeer("node3", "2001:db8::13")}}
	if _, err := f.Set(node); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	src, mac, targets := f.probeTargets(t0)
	if src != netip.MustParseAddr("2001:db8::11") || mac.String() != MAC(src).String() || len(targets) != 2 ||
		targets[0].addr != netip.MustParseAddr("2001:db8::12") || targets[1].addr != netip.MustParseAddr("2001:db8::13") {
		t.Fatalf("probes from %s (%s) to %+v; want from 2001:db8::11 to node2's and node3's IPv6 addresses", src, mac, targets)
	}
	f.answered(netip.MustParseAddr("2001:db8::12"), true, t0.Add(time.Second))
	f.answered(netip.MustParseAddr("2001:db8::13"), true, t0.Add(3*time.Second))
	f.judge(t0.Add(3*time.Second + probeDeadline/2))
	if next, passed := f.sendingTo(); next != "node3" || !cmp.Equal(passed, []string{"node2"}) {
		t.Errorf("node2 silent: next %s, passing over %v; want node3, passing over [node2]", next, passed)
	}
	if want := v6Route("2001:db8::13"); k.routes[true] != want {
		t.Errorf("route %+v; want %+v", k.routes[true], want)
	}

	dual, _ := newFake()
	if _, err := dual.Set(datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11", "2001:db8::11"), FlowRing: 2,
		FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12", "2001:db8::12")}}); err != nil {
		t.Fatal(err)
	}
	if src, _, targets := dual.probeTargets(t0); src != netip.MustParseAddr("192.0.2.11") || len(targets) != 1 || targets[0].addr != netip.MustParseAddr("192.0.2.12") {
		t.Errorf("a dual-stack node probes from %s to %+v; want from 192.0.2.11 to 192.0.2.12", src, targets)
	}
}

// The probe frames are what a peer's kernel answers: each family's
// header and checksums right, the echo's identifier the one the peer's
// table marks.
func TestEchoFrames(t *testing.T) {
	for _, tc := range []struct{ src, dst string }{{"192.0.2.11", "192.0.2.12"}, {"2001:db8::11", "2001:db8::12"}} {
		src, dst := netip.MustParseAddr(tc.src), netip.MustParseAddr(tc.dst)
		b, err := echoFrame(MAC(src), MAC(dst), src, dst, datapath.FlowProbeID, 7)
		if err != nil {
			t.Fatal(err)
		}
		var fr ethernet.Frame
		if err := fr.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		var body []byte
		var sum uint32
		proto := 1
		if src.Is6() {
			ip := fr.Payload
			if fr.EtherType != ethernet.EtherTypeIPv6 || ip[0]>>4 != 6 || ip[6] != 58 || !bytes.Equal(ip[8:24], src.AsSlice()) || !bytes.Equal(ip[24:40], dst.AsSlice()) {
				t.Fatalf("%s: not an IPv6 packet from %s to %s: % x", tc.src, src, dst, ip[:40])
			}
			body, proto = ip[40:], 58
			// The pseudo-header: addresses, length, next header.
			for i := 8; i < 40; i += 2 {
				sum += uint32(ip[i])<<8 | uint32(ip[i+1])
			}
			sum += uint32(len(body)) + 58
		} else {
			ip := fr.Payload
			if fr.EtherType != ethernet.EtherTypeIPv4 || checksum(ip[:20]) != 0 {
				t.Fatalf("%s: IPv4 header checksum wrong: % x", tc.src, ip[:20])
			}
			body = ip[20:]
		}
		for i := 0; i+1 < len(body); i += 2 {
			sum += uint32(body[i])<<8 | uint32(body[i+1])
		}
		if len(body)%2 == 1 {
			sum += uint32(body[len(body)-1]) << 8
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		if sum != 0xffff {
			t.Errorf("%s: ICMP checksum wrong (sum %#x)", tc.src, sum)
		}
		m, err := icmp.ParseMessage(proto, body)
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := m.Body.(*icmp.Echo); !ok || e.ID != datapath.FlowProbeID || e.Seq != 7 {
			t.Errorf("%s: %+v; want an echo request with id %#x, seq 7", tc.src, m.Body, datapath.FlowProbeID)
		}
	}
}

// A peer new to the probes (it joined the ring, or the node's family
// changed) has a whole deadline to answer: it is not passed over at the
// first judgement after it appears.
func TestANewPeerHasADeadlineToAnswer(t *testing.T) {
	f, _ := newFake()
	node := datapath.NodeInfo{Name: "node1", Addresses: addrs("192.0.2.11"), FlowRing: 2,
		FlowPeers: []datapath.FlowPeer{flowPeer("node2", "192.0.2.12")}}
	if _, err := f.Set(node); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	f.probeTargets(t0)
	f.answered(netip.MustParseAddr("192.0.2.12"), true, t0.Add(probeDeadline))
	// node3 joins before node2 in the ring.
	node.FlowRing, node.FlowPeers = 3, []datapath.FlowPeer{flowPeer("node3", "192.0.2.13"), flowPeer("node2", "192.0.2.12")}
	if _, err := f.Set(node); err != nil {
		t.Fatal(err)
	}
	joined := t0.Add(probeDeadline + time.Second)
	f.probeTargets(joined)
	for _, at := range []time.Duration{0, probeInterval, probeDeadline} {
		f.answered(netip.MustParseAddr("192.0.2.12"), true, joined.Add(at))
		f.judge(joined.Add(at))
		if next, passed := f.sendingTo(); next != "node3" || len(passed) != 0 {
			t.Errorf("%v after node3 joined: next %s, passing over %v; want node3, none passed over", at, next, passed)
		}
	}
	f.judge(joined.Add(probeDeadline + probeInterval))
	if next, passed := f.sendingTo(); next != "node2" || !cmp.Equal(passed, []string{"node3"}) {
		t.Errorf("node3 silent past its deadline: next %s, passing over %v; want node2, passing over [node3]", next, passed)
	}
}

// judgeAndCheck judges at now and checks where moved packets go (the
// IPv4 route to next, of node2 to node4 at 192.0.2.12-14) and which peers
// are passed over.
func judgeAndCheck(t *testing.T, f *Flows, k *fakeKernel, now time.Time, what, wantNext string, wantPassed []string) {
	t.Helper()
	f.judge(now)
	next, passed := f.sendingTo()
	if next != wantNext || !cmp.Equal(passed, wantPassed) {
		t.Errorf("%s: next %s, passing over %v; want %s, passing over %v", what, next, passed, wantNext, wantPassed)
	}
	if want := v4Route(map[string]string{"node2": "192.0.2.12", "node3": "192.0.2.13", "node4": "192.0.2.14"}[wantNext]); k.routes[false] != want {
		t.Errorf("%s: route %+v; want %+v", what, k.routes[false], want)
	}
}
