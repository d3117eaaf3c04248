package bgpspeaker

import (
	"flag"
	"fmt"
	"time"

	"github.com/weirlb/weir/internal/bfd"
)

// PeerFlags are the session options of the routers a command line names
// (--bgp-peers): the same for every one of them. BgpPeer resources carry
// their own.
type PeerFlags struct {
	hold          time.Duration
	bfdInterval   time.Duration
	bfdMultiplier uint
}

// Register adds the flags to fs.
func (f *PeerFlags) Register(fs *flag.FlagSet) {
	fs.DurationVar(&f.hold, "bgp-hold-time", 0, "BGP hold time with the --bgp-peers routers, 3s-65535s (0: 90s)")
	fs.DurationVar(&f.bfdInterval, "bgp-bfd-interval", 0, "run BFD with the --bgp-peers routers at this receive and transmit interval, 10ms-1m (0: no BFD): a router found gone closes its session at once")
	fs.UintVar(&f.bfdMultiplier, "bgp-bfd-multiplier", 3, "with --bgp-bfd-interval: packets missed before a BFD session is down, 2-255")
}

// Apply sets the flags' options on peers.
func (f *PeerFlags) Apply(peers []Peer) error {
	if f.hold != 0 && (f.hold < 3*time.Second || f.hold > 65535*time.Second || f.hold%time.Second != 0) {
		return fmt.Errorf("--bgp-hold-time: %v is not 0 or whole seconds from 3s to 65535s", f.hold)
	}
	var profile *bfd.Profile
	if f.bfdInterval != 0 {
		if f.bfdMultiplier > 255 {
			return fmt.Errorf("--bgp-bfd-multiplier: %d is not 2-255", f.bfdMultiplier)
		}
		profile = &bfd.Profile{ReceiveInterval: f.bfdInterval, TransmitInterval: f.bfdInterval, DetectMultiplier: uint8(f.bfdMultiplier)}
		if err := profile.Validate(); err != nil {
			return fmt.Errorf("--bgp-bfd-interval, --bgp-bfd-multiplier: %w", err)
		}
	}
	for i := range peers {
		peers[i].HoldTime, peers[i].BFD = f.hold, profile
	}
	return nil
}
