package datapath

import (
	"sync"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// elementWriter commits transactions made only of set and map elements
// (what an endpoint change is), and the loads and deletions of a full
// sync, over one netlink socket it keeps open (nfConn), as batches it lays
// out itself (nfBatch).
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
	conn    *nfConn // nil until first used, and after an error
	commits int     // batches committed, for tests
}

func newElementWriter() *elementWriter { return &elementWriter{} }

// elementOps are the element deletes and adds of one family's transaction.
type elementOps struct {
	deletes, adds []element
}

// commit sends one family's element changes as one transaction, atomic
// like an nft run: ok is false, with nothing sent, when an element is in a
// set it cannot write.
func (w *elementWriter) commit(f *family, g generation, ops *elementOps) (ok bool, err error) {
	b := newBatch()
	if len(b.elements(unix.NFT_MSG_DELSETELEM, f, g, ops.deletes)) > 0 ||
		len(b.elements(unix.NFT_MSG_NEWSETELEM, f, g, ops.adds)) > 0 {
		return false, nil
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
			b.delete(unix.NFT_MSG_DELSET, f, o.Name)
		case *knftables.Map:
			b.delete(unix.NFT_MSG_DELSET, f, o.Name)
		case *knftables.Chain:
			b.delete(unix.NFT_MSG_DELCHAIN, f, o.Name)
		default:
			return false, nil
		}
	}
	return w.send(b)
}

// send commits b: ok is false when there is no socket. After a failure the
// next use opens a fresh socket.
func (w *elementWriter) send(b *nfBatch) (ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		conn, err := dialNF()
		if err != nil {
			return false, nil // nft can still do it
		}
		w.conn = conn
	}
	if err := w.conn.commit(b); err != nil {
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
		conn, err := dialNF()
		if err != nil {
			return objs, false, nil
		}
		w.conn = conn
	}
	if objs, err = w.conn.listTable(f, TableName); err != nil {
		w.conn.Close()
		w.conn = nil
	}
	return objs, true, err
}
