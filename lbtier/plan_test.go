package lbtier

import (
	"net/netip"
	"testing"

	"github.com/weirlb/weir/internal/bgpspeaker"
)

func TestPlanAnnouncesOnlyWhatPassesEveryCheck(t *testing.T) {
	vip := netip.MustParseAddr("203.0.113.10")
	target := func(node, hop string, weight uint32) Target {
		a := netip.MustParseAddr(hop)
		return Target{VIP: vip, Prefix: netip.PrefixFrom(vip, 32), Service: "default/web", Node: node, NextHop: a, Weight: weight, Probe: ProbeKey{Addr: a, Port: 32000, Path: "/"}}
	}
	targets := []Target{target("node1", "192.0.2.11", 3), target("node2", "192.0.2.12", 1), target("node3", "192.0.2.13", 1), target("node4", "192.0.2.14", 2)}
	probes := map[string]ProbeState{
		"192.0.2.11": {Known: true, Up: true, Last: "200"},
		"192.0.2.12": {Known: true, Up: false, Last: "503"},
		"192.0.2.13": {Known: true, Up: true, Last: "200"},
		"192.0.2.14": {},
	}
	ids := map[string]uint32{"node1": 1, "node2": 2, "node3": 3, "node4": 4}
	want, status := Plan(targets, Inputs{
		Probe:       func(k ProbeKey) ProbeState { return probes[k.Addr.String()] },
		Unreachable: func(n string) bool { return n == "node3" },
		PathID:      func(n string) uint32 { return ids[n] },
	})
	prefix := netip.MustParsePrefix("203.0.113.10/32")
	if len(want) != 1 || want[PathKey{prefix, 1}].NextHop != netip.MustParseAddr("192.0.2.11") || want[PathKey{prefix, 1}].Weight != 3 {
		t.Errorf("plan %v: want node1's path alone, id 1, weight 3", want)
	}
	reasons := map[string]string{}
	for _, s := range status {
		reasons[s.Node] = s.Reason
	}
	wantReasons := map[string]string{"node1": "", "node2": ReasonProbeFailing, "node3": ReasonNodeUnreachable, "node4": ReasonProbePending}
	for n, r := range wantReasons {
		if reasons[n] != r {
			t.Errorf("%s: reason %q, want %q", n, reasons[n], r)
		}
	}

	// Two announced paths and a router without ADD-PATH: both say so; no
	// established session: NoSessions.
	two := []PathStatus{{Target: targets[0], Announced: true}, {Target: targets[2], Announced: true}}
	explainSessions(two, []bgpspeaker.Session{{State: "established", AddPath: true}, {State: "established"}})
	if two[0].Reason != ReasonAddPathNotNegotiate || two[1].Reason != ReasonAddPathNotNegotiate {
		t.Errorf("without ADD-PATH: %q %q", two[0].Reason, two[1].Reason)
	}
	one := []PathStatus{{Target: targets[0], Announced: true}}
	explainSessions(one, []bgpspeaker.Session{{State: "established"}})
	if one[0].Reason != "" {
		t.Errorf("one path without ADD-PATH: reason %q, want none (the router hears all of it)", one[0].Reason)
	}
	explainSessions(one, []bgpspeaker.Session{{State: "active"}})
	if one[0].Reason != ReasonNoSessions {
		t.Errorf("no session: reason %q", one[0].Reason)
	}
}

// TestPlanAggregates: targets of several addresses in one aggregate make
// one path per node, weighted by all of them, or unweighted when one is.
func TestPlanAggregates(t *testing.T) {
	agg := netip.MustParsePrefix("203.0.113.0/24")
	target := func(vip, node, hop string, weight uint32) Target {
		a := netip.MustParseAddr(hop)
		return Target{VIP: netip.MustParseAddr(vip), Prefix: agg, Node: node, NextHop: a, Weight: weight, Probe: ProbeKey{Addr: a, Port: 10256, Path: "/healthz"}}
	}
	want, status := Plan([]Target{
		target("203.0.113.7", "node1", "192.0.2.11", 2), target("203.0.113.9", "node1", "192.0.2.11", 1),
		target("203.0.113.7", "node2", "192.0.2.12", 1), target("203.0.113.20", "node2", "192.0.2.12", 0),
	}, Inputs{
		Probe:       func(ProbeKey) ProbeState { return ProbeState{Known: true, Up: true} },
		Unreachable: func(string) bool { return false },
		PathID:      func(n string) uint32 { return map[string]uint32{"node1": 1, "node2": 2}[n] },
	})
	if len(want) != 2 || want[PathKey{agg, 1}].Weight != 3 || want[PathKey{agg, 2}].Weight != 0 {
		t.Errorf("plan %v: want node1 weighing 3 and node2 unweighted, one path each for %s", want, agg)
	}
	// One router without ADD-PATH hears one of the aggregate's two next hops.
	explainSessions(status, []bgpspeaker.Session{{State: "established"}})
	for _, st := range status {
		if st.Reason != ReasonAddPathNotNegotiate {
			t.Errorf("%s via %s: reason %q, want %s", st.VIP, st.Node, st.Reason, ReasonAddPathNotNegotiate)
		}
	}
}
