// Package benchhook is what the datapath's benchmarks (test/bench/datapath)
// measure it against: what the kernel alone takes to load a state's set
// elements, and a datapath committing its element changes through nft.
// Only benchmarks import it; the datapath's API does not carry it.
package benchhook

import (
	"context"
	"time"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/datapath/internal/benchseam"
	"github.com/weirlb/weir/datapath/internal/nfwire"
	"sigs.k8s.io/knftables"
)

// KernelFloor is what the kernel alone takes for the elements of a state.
type KernelFloor struct {
	// Load commits the elements, in the batches a full sync uses.
	Load time.Duration
	// Delete deletes the sets and maps holding them, in one transaction:
	// what replacing a table costs beyond loading the new one.
	Delete time.Duration
	// Elements is how many there are.
	Elements int
}

// KernelLoadFloor measures what the kernel alone takes to load state's elements
// (both families' that the netlink writer can encode) into the sets of a
// bare table in the current network namespace, and to delete them: the
// elements are worked out and laid out as messages first, untimed, then
// committed in the batches a full sync uses, timed. The table,
// datapath.TableName+"_floor", is deleted after.
func KernelLoadFloor(ctx context.Context, state datapath.NodeState, cfg datapath.Config) (KernelFloor, error) {
	var floor KernelFloor
	conn, err := nfwire.Dial()
	if err != nil {
		return floor, err
	}
	defer conn.Close()
	const table = datapath.TableName + "_floor"
	for _, f := range benchseam.Plan(state, cfg, table) {
		nft, err := knftables.New(f.NFT, table)
		if err != nil {
			return floor, err
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
		tx.Add(&knftables.Table{})
		for _, obj := range f.Sets {
			tx.Add(obj)
		}
		if err := nft.Run(ctx, tx); err != nil {
			return floor, err
		}
		// Deleted whatever happens next.
		defer func() {
			tx := nft.NewTransaction()
			tx.Delete(&knftables.Table{})
			nft.Run(context.WithoutCancel(ctx), tx)
		}()
		floor.Elements += f.Elements
		for _, b := range f.Load {
			start := time.Now()
			if err := conn.Commit(b); err != nil {
				return floor, err
			}
			floor.Load += time.Since(start)
		}
		start := time.Now()
		if err := conn.Commit(f.Delete); err != nil {
			return floor, err
		}
		floor.Delete += time.Since(start)
	}
	return floor, nil
}

// NewForNodeOverNft is datapath.NewForNode committing element changes
// through nft too, instead of the netlink socket it keeps open for them:
// how every change went before, kept to measure against.
func NewForNodeOverNft(cfg datapath.Config) (*datapath.Datapath, error) {
	dp, err := benchseam.NewForNodeOverNft(cfg)
	if err != nil {
		return nil, err
	}
	return dp.(*datapath.Datapath), nil
}
