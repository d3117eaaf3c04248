// Package floorhook is the seam through which package kernelfloor, which
// only benchmarks import, reaches what the datapath plans for a state,
// without that plan being part of the datapath's API.
package floorhook

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

// Plan is set by package datapath: the state's (a datapath.NodeState)
// tables under cfg (a datapath.Config), named table. The two are untyped
// here because this package cannot import the datapath; kernelfloor's
// typed wrapper is the only caller.
var Plan func(state, cfg any, table string) []Family
