package datapath

import (
	"slices"

	"github.com/weirlb/weir/datapath/internal/benchseam"
	"github.com/weirlb/weir/datapath/internal/nfwire"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// What package benchhook, for benchmarks, reaches through benchseam: the
// kernel floor loads a state's elements as a full sync does, and a
// datapath may commit its element changes through nft as it once did.
func init() {
	benchseam.Plan = func(state, cfg any, table string) []benchseam.Family {
		return floorPlan(state.(NodeState), cfg.(Config), table)
	}
	benchseam.NewForNodeOverNft = func(cfg any) (any, error) {
		return newForNode(cfg.(Config), true)
	}
}

// floorPlan lays out state's elements (both families' that the netlink
// writer can encode) for the sets of generation a of a table named table,
// in the batches a full sync uses.
func floorPlan(state NodeState, cfg Config, table string) []benchseam.Family {
	d := New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), cfg)
	w := d.desire(state, nil)
	var out []benchseam.Family
	for _, f := range d.families() {
		plan := benchseam.Family{NFT: f.nft, Sets: tableSets(*f, genA), Delete: nfwire.NewBatch(table)}
		for p := range w.picks[f] {
			plan.Sets = append(plan.Sets, p.object(*f, genA))
		}
		for chunk := range slices.Chunk(slices.Collect(w.elements(f)), loadBatch) {
			b := nfwire.NewBatch(table)
			rest := encodeElements(b, unix.NFT_MSG_NEWSETELEM, f, genA, chunk)
			plan.Elements += len(chunk) - len(rest)
			plan.Load = append(plan.Load, b)
		}
		for _, obj := range plan.Sets {
			plan.Delete.DeleteSet(f.wire, setName(obj))
		}
		out = append(out, plan)
	}
	return out
}
