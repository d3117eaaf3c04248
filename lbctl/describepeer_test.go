package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// peerFixture is three nodes, two in rack r1, and two peers: one
// unnumbered on eth1 for every node, one with BFD and a dynamic AS for
// rack r1.
const peerFixture = `kind: Node
metadata: {name: node1, labels: {rack: r1}}
addresses: [192.0.2.11]
---
kind: Node
metadata: {name: node2, labels: {rack: r2}}
addresses: [192.0.2.12]
---
kind: Node
metadata: {name: node3, labels: {rack: r1}}
addresses: [192.0.2.13]
---
kind: BgpPeer
metadata: {name: leaf-1}
interface: eth1
dynamic_asn: external
my_asn: 4200000001
vrf: red
---
kind: BgpPeer
metadata: {name: rr-1}
address: 198.51.100.1
dynamic_asn: internal
my_asn: 64512
port: 1179
ebgp_multihop_ttl: 2
source_address: 192.0.2.11
hold_time_seconds: 30
graceful_restart: true
password: s3cret
node_selector: {rack: r1}
bfd: {receive_interval_ms: 100, detect_multiplier: 4, passive: true}
`

// TestDescribePeer: a peer's page shows every field, defaults filled in,
// the password never, and per node its sessions with the peer alone, an
// unnumbered peer's found by its interface; a node the peer's selector
// picks that reports none says so.
func TestDescribePeer(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(peerFixture, "apply", "-f", "-")
	established := weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED
	e.bgp = map[string][]*weirv1.BgpSession{"node1": {
		{PeerAddress: "198.51.100.1", PeerAsn: 64512, SessionState: established, EstablishedSince: timestamppb.New(e.now.Add(-3 * time.Hour)), BfdState: "Up",
			Families: []*weirv1.BgpFamily{{AddressFamily: weirv1.AddressFamily_ADDRESS_FAMILY_IPV4, Negotiated: true, Sent: 3}}},
		{PeerAddress: "fe80::1%eth1", PeerAsn: 65001, SessionState: weirv1.BgpSessionState_BGP_SESSION_STATE_ACTIVE,
			LastError: "the router sent NOTIFICATION code 2(open) subcode 2(bad peer as)"},
		{PeerAddress: "fe80::1%eth2", PeerAsn: 65002, SessionState: established}, // another link's router
		{PeerAddress: "192.0.2.1", PeerAsn: 64500, SessionState: established},    // another peer
	}}
	e.agent("node1", 200)

	golden(t, "describe peer rr-1", e.mustLbctl("", "describe", "peer", "rr-1"), `
Name:                rr-1
Labels:              <none>
Source:              native
Created:             0s ago
Address:             198.51.100.1
Interface:           <none>
Port:                1179
ASN:                 internal (dynamic: as the router's OPEN says)
My ASN:              64512
VRF:                 <none>
eBGP Multihop TTL:   2
Source Address:      192.0.2.11
Hold Time:           30s
Keepalive:           a third of the hold time
Connect Retry:       1s (default)
Graceful Restart:    yes
Password:            <write-only: not read back>
Node Selector:       rack=r1
BFD:
  Receive Interval:          100ms
  Transmit Interval:         300ms (default)
  Detect Multiplier:         4
  Passive:                   yes
  Minimum TTL (multi-hop):   254 (default)

Sessions:
  NODE    PEER           ASN     STATE                                         UP   BFD   FAMILIES                 LAST ERROR
  node1   198.51.100.1   64512   established                                   3h   Up    ipv4 sent 3 accepted 0   <none>
  node3   -              -       <no session reported> (agent not connected)   -    -     -                        -
`)
	golden(t, "describe bgppeer leaf-1", e.mustLbctl("", "describe", "bgppeer", "leaf-1"), `
Name:                leaf-1
Labels:              <none>
Source:              native
Created:             0s ago
Address:             unnumbered on eth1
Interface:           eth1
Port:                179 (default)
ASN:                 external (dynamic: as the router's OPEN says)
My ASN:              4200000001
VRF:                 red
eBGP Multihop TTL:   <none> (directly connected)
Source Address:      <none>
Hold Time:           90s (default)
Keepalive:           a third of the hold time
Connect Retry:       1s (default)
Graceful Restart:    no
Password:            <write-only: not read back>
Node Selector:       all
BFD:                 <none>

Sessions:
  NODE    PEER           ASN     STATE                                         UP   BFD   FAMILIES   LAST ERROR
  node1   fe80::1%eth1   65001   active                                        -    -     <none>     the router sent NOTIFICATION code 2(open) subcode 2(bad peer as)
  node2   -              -       <no session reported> (agent not connected)   -    -     -          -
  node3   -              -       <no session reported> (agent not connected)   -    -     -          -
`)

	var doc struct {
		Peer struct {
			Kind string `json:"kind"`
		} `json:"bgppeer"`
		Sessions []struct {
			Name        string `json:"name"`
			BgpSessions []struct {
				PeerAddress string `json:"peer_address"`
			} `json:"bgp_sessions"`
		} `json:"sessions"`
	}
	out := e.mustLbctl("", "describe", "peer", "rr-1", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("describe peer -o json does not parse: %v\n%s", err, out)
	}
	var got []string
	for _, n := range doc.Sessions {
		var peers []string
		for _, s := range n.BgpSessions {
			peers = append(peers, s.PeerAddress)
		}
		got = append(got, n.Name+":"+strings.Join(peers, ","))
	}
	if want := []string{"node1:198.51.100.1", "node3:"}; doc.Peer.Kind != "BgpPeer" || !slices.Equal(got, want) {
		t.Errorf("describe peer -o json: kind %q, sessions %q, want %q\n%s", doc.Peer.Kind, got, want, out)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("describe peer -o json shows the password\n%s", out)
	}
}
