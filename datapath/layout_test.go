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

// The connections a service DNAT'ed leave reject_unserved before the FIB
// lookup that keeps the node's own addresses from being refused.
func TestDNATedConnectionsLeaveRejectUnservedFirst(t *testing.T) {
	d := New(knftables.NewFake(knftables.IPv4Family, TableName), nil, Config{})
	for _, c := range tableChains(ipv4, d.cfg, genA, nil) {
		if c.chain.Name == "reject_unserved" {
			dnat, local := slices.Index(c.rules, "ct status dnat return"), slices.Index(c.rules, "fib daddr type local return")
			if dnat < 0 || local < 0 || dnat > local {
				t.Fatalf("reject_unserved: DNAT'ed connections return at rule %d, local addresses at %d: %q", dnat, local, c.rules)
			}
			return
		}
	}
	t.Fatal("no chain reject_unserved")
}
