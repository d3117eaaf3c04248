package datapath

import (
	"sync"

	"github.com/weirlb/weir/datapath/internal/nfwire"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// elementWriter commits transactions made only of set and map elements
// (what an endpoint change is), and the loads and deletions of a full
// sync, over one netlink socket it keeps open (nfwire.Conn), as batches it
// lays out itself (nfwire.Batch).
//
// Why not nft: deleting an element leaves it for the kernel to free after
// an RCU grace period, and the kernel waits for that when a netfilter
// netlink socket closes (nf_tables flushes its destroy work on
// NETLINK_URELEASE). The nft command opens a socket per run, so every run
// that deletes an element waits 10-30 ms on exit, long after its commit
// was visible to packets. Over a socket that stays open the same commit
// returns in a fraction of a millisecond and the kernel frees in the
// background (docs/performance.md). And nft parses text the datapath
// would first have to render.
//
// It writes no interval set's elements; those go through nft.
type elementWriter struct {
	mu      sync.Mutex
	conn    *nfwire.Conn // nil until first used, and after an error
	commits int          // batches committed, for tests
}

func newElementWriter() *elementWriter { return &elementWriter{} }

// elementOps are the element deletes and adds of one family's transaction.
type elementOps struct {
	deletes, adds []element
	// marker: the marker chain to rename, from and to (see digest).
	marker [2]string
}

// commit sends one family's element changes as one transaction, atomic
// like an nft run: ok is false, with nothing sent, when an element is in a
// set it cannot write.
func (w *elementWriter) commit(f *family, g generation, ops *elementOps) (ok bool, err error) {
	b := newBatch()
	if len(encodeElements(b, unix.NFT_MSG_DELSETELEM, f, g, ops.deletes)) > 0 ||
		len(encodeElements(b, unix.NFT_MSG_NEWSETELEM, f, g, ops.adds)) > 0 {
		return false, nil
	}
	if ops.marker[1] != "" {
		b.DeleteChain(f.wire, ops.marker[0])
		b.NewChain(f.wire, ops.marker[1])
	}
	return w.send(b)
}

// loadBatch is how many elements one transaction of a netlink load holds:
// a batch is one write to the socket, which the kernel refuses when larger
// than its send buffer (212 KiB by default; an element takes up to ~100
// bytes).
const loadBatch = 2000

// deleteObjects deletes sets, maps and chains of f's table, unreferenced,
// as one transaction: over the socket that stays open, the kernel frees a
// set's elements after the commit, in the background, where nft's exit
// would wait for it (about a second for a million elements). ok is false
// when it cannot.
func (w *elementWriter) deleteObjects(f *family, objs []knftables.Object) (ok bool, err error) {
	b := newBatch()
	for _, o := range objs {
		switch o := o.(type) {
		case *knftables.Set:
			b.DeleteSet(f.wire, o.Name)
		case *knftables.Map:
			b.DeleteSet(f.wire, o.Name)
		case *knftables.Chain:
			b.DeleteChain(f.wire, o.Name)
		default:
			return false, nil
		}
	}
	return w.send(b)
}

// send commits b: ok is false when there is no socket. After a failure the
// next use opens a fresh socket.
func (w *elementWriter) send(b *nfwire.Batch) (ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		conn, err := nfwire.Dial()
		if err != nil {
			return false, nil // nft can still do it
		}
		w.conn = conn
	}
	if err := w.conn.Commit(b); err != nil {
		w.conn.Close()
		w.conn = nil
		return true, err
	}
	w.commits++
	return true, nil
}

// list names the chains, sets and maps of f's table (none when there is
// no table), over the socket: ok is false when there is no socket.
func (w *elementWriter) list(f *family) (objs tableObjects, ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		conn, err := nfwire.Dial()
		if err != nil {
			return objs, false, nil
		}
		w.conn = conn
	}
	listed, err := w.conn.ListTable(f.wire, TableName)
	if err != nil {
		w.conn.Close()
		w.conn = nil
	}
	return tableObjects{chains: listed.Chains, sets: listed.Sets, maps: listed.Maps}, true, err
}

// newBatch starts a transaction on the table.
func newBatch() *nfwire.Batch { return nfwire.NewBatch(TableName) }

// loadBatches keeps the batches a full sync has loaded for the next ones:
// at 100,000 services a sync lays out over 100 MB of messages, which would
// otherwise all be garbage (and the heap's peak).
var loadBatches = sync.Pool{New: func() any { return newBatch() }}

// pooledBatch is an empty batch from loadBatches; a batch loaded goes back
// with releaseBatch.
func pooledBatch() *nfwire.Batch {
	b := loadBatches.Get().(*nfwire.Batch)
	b.Reset()
	return b
}

func releaseBatch(b *nfwire.Batch) { loadBatches.Put(b) }

// destination is the set or map an element goes in: a pick's set, or one
// of tableDecls.
type destination struct {
	set  setID
	pick pick
}

func (e element) destination() destination {
	if e.pick.exists() {
		return destination{pick: e.pick}
	}
	return destination{set: e.set}
}

func (d destination) name(g generation) string {
	if d.pick.exists() {
		return g.of(d.pick.set())
	}
	return g.of(d.set.String())
}

// encodeElements adds to b messages that add (unix.NFT_MSG_NEWSETELEM) or
// delete (unix.NFT_MSG_DELSETELEM) elems in generation g of f's table, one
// message per set and up to nfwire.MaxListElements elements. It returns
// the elements of interval sets, which only nft writes.
func encodeElements(b *nfwire.Batch, op uint16, f *family, g generation, elems []element) (rest []element) {
	var order []destination
	groups := map[destination][]int32{}
	for i, e := range elems {
		if e.format().interval {
			rest = append(rest, e)
			continue
		}
		d := e.destination()
		if _, ok := groups[d]; !ok {
			order = append(order, d)
		}
		groups[d] = append(groups[d], int32(i))
	}
	for _, d := range order {
		name := d.name(g)
		idx := groups[d]
		for len(idx) > 0 {
			n := min(len(idx), nfwire.MaxListElements)
			encodeList(b, op, f, name, elems, idx[:n])
			idx = idx[n:]
		}
	}
	return rest
}

// encodeList adds one message for the elements idx of elems, all of set.
func encodeList(b *nfwire.Batch, op uint16, f *family, set string, elems []element, idx []int32) {
	list := b.Elements(op, f.wire, set)
	for _, i := range idx {
		e := &elems[i]
		if op == unix.NFT_MSG_NEWSETELEM && e.value.n > 0 && e.format().verdict {
			list.AddGoto(e.key.bytes(), e.verdictChain())
			continue
		}
		list.Add(e.key.bytes(), e.value.bytes())
	}
	list.End()
}
