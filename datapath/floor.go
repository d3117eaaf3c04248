package datapath

import (
	"context"
	"slices"
	"time"

	"golang.org/x/sys/unix"
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

// KernelLoadFloor measures what the kernel alone takes to load state's
// elements (both families' that the netlink writer can encode) into the
// sets of a bare table in the current network namespace, and to delete
// them: the elements are worked out and laid out as messages first,
// untimed, then committed in the batches a full sync uses, timed. It is
// the floor a full sync is compared with (test/bench/datapath); the table,
// TableName+"_floor", is deleted after.
func KernelLoadFloor(ctx context.Context, state NodeState, cfg Config) (KernelFloor, error) {
	var floor KernelFloor
	d := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), cfg)
	w := d.desire(state, nil)
	conn, err := dialNF()
	if err != nil {
		return floor, err
	}
	defer conn.Close()
	const table = TableName + "_floor"
	for _, f := range d.families() {
		nft, err := knftables.New(f.nft, table)
		if err != nil {
			return floor, err
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
		tx.Add(&knftables.Table{})
		for _, obj := range tableSets(*f, genA) {
			tx.Add(obj)
		}
		for p := range w.picks[f] {
			tx.Add(p.object(*f, genA))
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
		var batches []*nfBatch
		for chunk := range slices.Chunk(slices.Collect(w.elements(f)), loadBatch) {
			b := &nfBatch{table: table}
			rest := b.elements(unix.NFT_MSG_NEWSETELEM, f, genA, chunk)
			floor.Elements += len(chunk) - len(rest)
			batches = append(batches, b)
		}
		for _, b := range batches {
			start := time.Now()
			if err := conn.commit(b); err != nil {
				return floor, err
			}
			floor.Load += time.Since(start)
		}
		del := &nfBatch{table: table}
		for _, obj := range tableSets(*f, genA) {
			del.delete(unix.NFT_MSG_DELSET, f, setName(obj))
		}
		for p := range w.picks[f] {
			del.delete(unix.NFT_MSG_DELSET, f, genA.of(p.set()))
		}
		start := time.Now()
		if err := conn.commit(del); err != nil {
			return floor, err
		}
		floor.Delete += time.Since(start)
	}
	return floor, nil
}
