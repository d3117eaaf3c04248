package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLinkLocalPeers: get peers says where an unnumbered router is (its
// interface), a link-local one with its zone, and a dynamic AS by name.
func TestLinkLocalPeers(t *testing.T) {
	e := newEnv(t)
	const peers = `kind: BgpPeer
metadata:
  name: leaf-1
interface: eth1
dynamic_asn: external
my_asn: 4200000001
vrf: red
---
kind: BgpPeer
metadata:
  name: leaf-2
address: fe80::2
interface: eth2
dynamic_asn: internal
my_asn: 4200000001
`
	if out := e.mustLbctl(peers, "apply", "-f", "-"); out != "peer/leaf-1 created\npeer/leaf-2 created\n" {
		t.Errorf("apply: %q", out)
	}
	got := e.mustLbctl("", "get", "peers")
	want := "NAME     ADDRESS             ASN        MY-ASN       NODES   AGE\n" +
		"leaf-1   eth1 (unnumbered)   external   4200000001   all     0s\n" +
		"leaf-2   fe80::2%eth2        internal   4200000001   all     0s\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("get peers (-want +got):\n%s", diff)
	}
}
