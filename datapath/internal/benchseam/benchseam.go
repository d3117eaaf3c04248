// Package benchseam is the seam through which package benchhook, which
// only benchmarks import, reaches the datapath's internals (what it plans
// for a state, how it commits changes) without their being part of the
// datapath's API.
package benchseam

import (
	"github.com/weirlb/weir/datapath/internal/nfwire"
	"sigs.k8s.io/knftables"
)

// Family is what one family's table of a state holds, laid out for a
// table of another name: the sets and maps nft creates, the batches that
// load their elements (as a full sync's), and the one that deletes them.
type Family struct {
	NFT      knftables.Family
	Sets     []knftables.Object
	Load     []*nfwire.Batch
	Delete   *nfwire.Batch
	Elements int // in Load
}

// Set by package datapath. Their arguments and results are the datapath's
// types (state a datapath.NodeState, cfg a datapath.Config, dp a
// *datapath.Datapath), untyped here because this package cannot import
// the datapath; benchhook's typed wrappers are the only callers.
var (
	// Plan is the state's tables under cfg, named table.
	Plan func(state, cfg any, table string) []Family
	// NewForNodeOverNft is datapath.NewForNode committing element
	// changes through nft.
	NewForNodeOverNft func(cfg any) (dp any, err error)
)
