package main

import (
	"flag"
	"log/slog"
	"strings"
	"testing"
)

// The flags that reach the server keep their names, defaults and help
// (they are shared with weir-agent's, which says "agent" instead).
func TestServerFlags(t *testing.T) {
	fs := flag.NewFlagSet("weir-speaker", flag.ContinueOnError)
	newOptions(fs)
	for name, want := range map[string][2]string{
		"server":    {"127.0.0.1:7443", "comma-separated HOST:PORT of weir-server's replicas (a DNS name counts as all its addresses); the speaker is on one at a time and moves to the next when it goes away"},
		"insecure":  {"false", "talk to the server in plain text (lab and demo only)"},
		"ca-file":   {"", "CA that signed the server's certificate"},
		"cert-file": {"", "this speaker's client certificate (PEM, role speaker)"},
		"key-file":  {"", "this speaker's private key (PEM)"},
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("no --%s", name)
			continue
		}
		if f.DefValue != want[0] || f.Usage != want[1] {
			t.Errorf("--%s: default %q, help %q; want %q, %q", name, f.DefValue, f.Usage, want[0], want[1])
		}
	}
	if fs.Lookup("node-token-file") != nil {
		t.Error("a speaker has --node-token-file: only an agent acts for a node")
	}
}

// --bgp-asn is an AS a speaker may have: not 0, not AS_TRANS.
func TestBGPASNFlag(t *testing.T) {
	for _, asn := range []string{"0", "23456"} {
		fs := flag.NewFlagSet("weir-speaker", flag.ContinueOnError)
		o := newOptions(fs)
		if err := fs.Parse([]string{"--bgp-asn", asn, "--bgp-peers", "192.0.2.1/64500", "--name", "lb1"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := o.settings(slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--bgp-asn") {
			t.Errorf("--bgp-asn %s: %v; want a refusal naming --bgp-asn", asn, err)
		}
	}
}
