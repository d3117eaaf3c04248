package main

import (
	"strings"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// 4-byte ASNs and a 32-bit local preference print as the unsigned numbers
// they are, and large communities as they were written, in get and
// describe.
func TestWideNumbersPrintAsWritten(t *testing.T) {
	e := newEnv(t)
	const resources = `kind: BgpPeer
metadata:
  name: rack-tor
address: 192.0.2.1
asn: 4200000100
my_asn: 4294967295
---
kind: AddressPool
metadata:
  name: rack
addresses:
- 203.0.113.0/28
bgp_advertisement:
  local_preference: 4000000000
  communities: ["64512:100", "large:4200000001:1:4294967295"]
`
	e.mustLbctl(resources, "apply", "-f", "-")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"get", "peers"}, []string{"4200000100", "4294967295"}},
		{[]string{"get", "peer", "rack-tor", "-o", "yaml"}, []string{"asn: 4200000100", "my_asn: 4294967295"}},
		{[]string{"get", "pools", "-o", "wide"}, []string{"4000000000", "64512:100,large:4200000001:1:4294967295"}},
		{[]string{"get", "pool", "rack", "-o", "yaml"}, []string{"local_preference: 4000000000", "- large:4200000001:1:4294967295"}},
	} {
		out := e.mustLbctl("", tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("lbctl %s: want %s in\n%s", strings.Join(tc.args, " "), w, out)
			}
		}
	}
}

// describe node shows a router's 4-byte ASN as the number it is.
func TestDescribeNodeShowsAFourByteASN(t *testing.T) {
	e := lbEnv(t)
	e.bgp = map[string][]*weirv1.BgpSession{"node1": {{PeerAddress: "192.0.2.1", PeerAsn: 4200000100, State: "established",
		Families: []*weirv1.BgpFamily{{Family: "ipv4", Negotiated: true}}}}}
	e.agent("node1", 200, lbHealth(200, 1))
	if out := e.mustLbctl("", "describe", "node", "node1"); !strings.Contains(out, "192.0.2.1   4200000100") {
		t.Errorf("describe node: want the session with AS 4200000100\n%s", out)
	}
}
