package datapath

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// A FIB lookup (is this address the node's?) costs several times a set's
// lookup, and a new connection used to pay nine of them on its way to a
// node port. Every rule that does one does it last, after the matches
// that usually fail, so that a packet to a cluster IP or a forwarded one
// pays none; and the rules a node port's packet meets share one per
// chain.
func TestAFIBLookupIsTheLastMatch(t *testing.T) {
	fib := regexp.MustCompile(`fib [sd]addr type local `)
	after := regexp.MustCompile(`^(return|goto |jump |accept|drop|meta mark set )`)
	configs := map[string]Config{
		"default":           {},
		"protected ports":   {ProtectedPorts: []uint16{10256, 9443}},
		"moved connections": {Flows: &FlowRedirect{Interface: "weir-flows"}},
		"preserve local":    {Masquerade: MasqueradePreserveLocal},
		"bridge detection":  {LocalDetection: LocalDetection{Mode: DetectBridgeInterface, Interface: "cni0"}},
		"no detection, all": {LocalDetection: LocalDetection{Mode: DetectNone}, MasqueradeAll: true},
		"interface prefix":  {LocalDetection: LocalDetection{Mode: DetectInterfaceNamePrefix, Interface: "veth"}},
	}
	for name, cfg := range configs {
		d := New(knftables.NewFake(knftables.IPv4Family, TableName), nil, cfg)
		for _, f := range families {
			perChain := map[string]int{}
			for _, c := range tableChains(*f, d.cfg, genA, nil) {
				for _, r := range c.rules {
					locs := fib.FindAllStringIndex(r, -1)
					if !strings.HasPrefix(r, "tcp dport ") { // a protected port's: its packets only
						perChain[c.chain.Name] += len(locs)
					}
					for _, loc := range locs {
						if rest := r[loc[1]:]; !after.MatchString(rest) {
							t.Errorf("%s, %s, chain %s: a match follows the FIB lookup: %q", name, f, c.chain.Name, r)
						}
					}
				}
			}
			// The chains a node port's new connection crosses.
			for _, chain := range []string{"services", "external_services", "node_ports", "external_node_ports"} {
				if perChain[chain] > 1 {
					t.Errorf("%s, %s: chain %s does %d FIB lookups, want at most 1", name, f, chain, perChain[chain])
				}
			}
			if n := perChain["reject_unserved"]; n > 2 {
				t.Errorf("%s, %s: reject_unserved does %d FIB lookups", name, f, n)
			}
		}
	}
}

// Every new connection crosses reject_unserved and the firewall, and
// almost none is refused there: the common one leaves each after one test
// past the exemptions, not after the sets of the refused (the firewall's
// ranges an interval of a concatenation, the costliest of the table).
// Measured with packetrate -compare-profile.
func TestTheCommonConnectionLeavesTheRefusingChainsFirst(t *testing.T) {
	for name, cfg := range map[string]Config{
		"default":           {},
		"protected ports":   {ProtectedPorts: []uint16{10256, 9443}},
		"moved connections": {Flows: &FlowRedirect{Interface: "weir-flows"}},
	} {
		d := New(knftables.NewFake(knftables.IPv4Family, TableName), nil, cfg)
		exempt := 1 + len(cfg.ProtectedPorts)
		want := map[string]string{
			"reject_unserved": "ct status dnat return",
			"firewall":        "ip daddr . meta l4proto . th dport != @firewall_frontends_a return",
		}
		passOn := map[string]int{"reject_unserved": 0, "firewall": 0}
		if cfg.Flows != nil {
			passOn["reject_unserved"] = 1
		}
		seen := 0
		for _, c := range tableChains(ipv4, d.cfg, genA, nil) {
			w, ok := want[c.chain.Name]
			if !ok {
				continue
			}
			seen++
			if i := exempt + passOn[c.chain.Name]; len(c.rules) <= i || c.rules[i] != w {
				t.Errorf("%s: chain %s: rule %d is not %q: %q", name, c.chain.Name, i, w, c.rules)
			}
		}
		if seen != len(want) {
			t.Fatalf("%s: found %d of the chains %v", name, seen, want)
		}
	}
}

// The firewall's last rule drops unconditionally: the gate above it sent
// back whatever is not a firewalled frontend.
func TestTheFirewallDropsOnlyItsFrontends(t *testing.T) {
	d := New(knftables.NewFake(knftables.IPv4Family, TableName), nil, Config{})
	for _, c := range tableChains(ipv4, d.cfg, genA, nil) {
		if c.chain.Name != "firewall" {
			continue
		}
		gate := slices.IndexFunc(c.rules, func(r string) bool { return strings.Contains(r, "!= @firewall_frontends_a return") })
		drop := slices.Index(c.rules, "drop")
		if gate < 0 || drop != len(c.rules)-1 || gate > drop {
			t.Fatalf("firewall: the gate at %d, the drop at %d: %q", gate, drop, c.rules)
		}
		return
	}
	t.Fatal("no chain firewall")
}

// A kind's picks are one rule per endpoint count, and its affinity map one
// more: a packet walks them only once a set says it is sent to one of the
// kind's frontends. A node port's packet from outside walked the picks of
// cluster and external IPs before it reached its own.
func TestAKindsPicksAreBehindAGate(t *testing.T) {
	for name, cfg := range map[string]Config{
		"default":           {},
		"preserve local":    {Masquerade: MasqueradePreserveLocal},
		"no detection, all": {LocalDetection: LocalDetection{Mode: DetectNone}, MasqueradeAll: true},
	} {
		d := New(knftables.NewFake(knftables.IPv4Family, TableName), nil, cfg)
		chains := tableChains(ipv4, d.cfg, genA, nil)
		picking := map[string]bool{}
		for _, c := range chains {
			for _, r := range c.rules {
				for _, k := range frontendKinds {
					if r == "jump "+k.pickChain(genA) {
						picking[c.chain.Name] = true
					}
				}
			}
		}
		if len(picking) != len(frontendKinds)+1 { // ip kind: two gates
			t.Errorf("%s: the chains that jump to picks: %v", name, picking)
		}
		for _, c := range chains {
			for _, r := range c.rules {
				f := strings.Fields(r)
				if len(f) < 2 || !picking[f[len(f)-1]] || f[len(f)-2] != "jump" && f[len(f)-2] != "goto" {
					continue
				}
				if !strings.Contains(r, " @") {
					t.Errorf("%s: chain %s enters %s with no set's lookup: %q", name, c.chain.Name, f[len(f)-1], r)
				}
			}
		}
	}
}
