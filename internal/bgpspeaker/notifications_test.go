package bgpspeaker

import (
	"net/netip"
	"testing"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// TestNotificationsAreKeptPerRouter: the NOTIFICATIONs GoBGP logs become
// each session's last error, named by code, subcode and meaning.
func TestNotificationsAreKeptPerRouter(t *testing.T) {
	n := &notifications{last: map[netip.Addr]string{}}
	n.note("received notification", gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.1", "Code": uint8(2), "Subcode": uint8(2), "Data": []byte{}})
	n.note("sent notification", gobgplog.Fields{"Topic": "Peer", "Key": "2001:db8::1", "Code": uint8(6), "Subcode": uint8(2),
		"Communicated-Reason": "maintenance"})
	n.note("sent notification", gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.2",
		"Data": bgp.NewMessageError(2, 2, nil, "as number mismatch expected 64501, received 64500")})
	n.note("some other warning", gobgplog.Fields{"Key": "192.0.2.9", "Code": uint8(1), "Subcode": uint8(1)})
	for addr, want := range map[string]string{
		"192.0.2.1":   "the router sent NOTIFICATION code 2(open) subcode 2(bad peer as)",
		"2001:db8::1": "this speaker sent NOTIFICATION code 6(cease) subcode 2(administrative shutdown): maintenance",
		"192.0.2.2":   "this speaker sent NOTIFICATION code 2(open) subcode 2(bad peer as): as number mismatch expected 64501, received 64500",
		"192.0.2.9":   "",
	} {
		if got := n.get(netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s: %q, want %q", addr, got, want)
		}
	}
}
