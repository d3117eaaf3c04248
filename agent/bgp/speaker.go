// Package bgp announces this node's service VIPs to the upstream routers
// (MetalLB's "node speaker" placement): a VIP is announced with the node as
// next hop while the node should receive the VIP's traffic, and withdrawn
// the moment it should not.
package bgp

import (
	"context"

	"github.com/weirlb/weir/internal/bgpspeaker"
)

// Speaker is the seam to the BGP speaker (bgpspeaker.GoBGP in production).
type Speaker interface {
	bgpspeaker.Paths
	// SetPeers makes peers the speaker's peers besides its configured
	// ones: new peers are dialled, changed ones re-dialled, missing ones
	// dropped.
	SetPeers(ctx context.Context, peers []Peer) error
	// SetExportRules keeps some routes to some peers.
	SetExportRules(ctx context.Context, rules []ExportRule) error
	Sessions(ctx context.Context) ([]bgpspeaker.Session, error)
	Close()
}

// Announcement, Peer and ExportRule are the speaker's.
type (
	Announcement = bgpspeaker.Announcement
	Peer         = bgpspeaker.Peer
	ExportRule   = bgpspeaker.ExportRule
)
