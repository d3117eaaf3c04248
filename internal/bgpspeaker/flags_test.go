package bgpspeaker

import (
	"flag"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/bfd"
)

// The command line's routers take the hold time and BFD of the flags;
// values out of range are refused naming the flag.
func TestPeerFlags(t *testing.T) {
	parse := func(args ...string) (*PeerFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var f PeerFlags
		f.Register(fs)
		return &f, fs.Parse(args)
	}
	f, err := parse("--bgp-hold-time", "9s", "--bgp-bfd-interval", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	peers := []Peer{{Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500}}
	if err := f.Apply(peers); err != nil {
		t.Fatal(err)
	}
	want := bfd.Profile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 100 * time.Millisecond, DetectMultiplier: 3}
	if peers[0].HoldTime != 9*time.Second || peers[0].BFD == nil || *peers[0].BFD != want {
		t.Errorf("peer %+v; want hold 9s and BFD %+v", peers[0], want)
	}
	f, _ = parse()
	if err := f.Apply(peers); err != nil || peers[0].BFD != nil || peers[0].HoldTime != 0 {
		t.Errorf("no flags: %+v, %v; want the defaults", peers[0], err)
	}
	for _, args := range [][]string{
		{"--bgp-hold-time", "2s"}, {"--bgp-hold-time", "3500ms"},
		{"--bgp-bfd-interval", "5ms"}, {"--bgp-bfd-interval", "100ms", "--bgp-bfd-multiplier", "1"},
		{"--bgp-bfd-interval", "100ms", "--bgp-bfd-multiplier", "256"},
	} {
		f, err := parse(args...)
		if err == nil {
			err = f.Apply(peers)
		}
		if err == nil || !strings.Contains(err.Error(), args[len(args)-2]) {
			t.Errorf("%v: %v; want a refusal naming %s", args, err, args[len(args)-2])
		}
	}
}
