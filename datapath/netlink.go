package datapath

import (
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"sigs.k8s.io/knftables"
)

// elementWriter commits transactions made only of set and map elements
// (what an endpoint change is) over one netlink socket it keeps open.
//
// Why not nft: deleting an element leaves it for the kernel to free after
// an RCU grace period, and the kernel waits for that when a netfilter
// netlink socket closes (nf_tables flushes its destroy work on
// NETLINK_URELEASE). The nft command opens a socket per run, so every run
// that deletes an element waits 10-30 ms on exit, long after its commit
// was visible to packets. Over a socket that stays open the same commit
// returns in a fraction of a millisecond and the kernel frees in the
// background (docs/performance.md).
//
// It writes only the sets and maps whose element layout it knows from
// tableSets, and no interval set; anything else goes through nft.
type elementWriter struct {
	mu      sync.Mutex
	conn    *nftables.Conn // nil until first used, and after an error
	commits int            // batches committed, for tests
}

func newElementWriter() *elementWriter { return &elementWriter{} }

// elementOps are the element deletes and adds of one family's transaction.
type elementOps struct {
	deletes, adds []element
}

// encodedElement is an element as the kernel takes it, with the name of
// the set it goes in.
type encodedElement struct {
	set  string
	elem nftables.SetElement
}

// commit sends one family's element changes as one netlink batch (atomic,
// like an nft transaction): ok is false, with nothing sent, when an element
// is in a set it cannot write.
func (w *elementWriter) commit(f *family, g generation, ops *elementOps) (ok bool, err error) {
	var arena []byte
	encode := func(es []element) ([]encodedElement, bool) {
		out := make([]encodedElement, 0, len(es))
		for _, e := range es {
			el, ok := e.kernel(g, &arena)
			if !ok {
				return nil, false
			}
			out = append(out, el)
		}
		return out, true
	}
	deletes, ok1 := encode(ops.deletes)
	adds, ok2 := encode(ops.adds)
	if !ok1 || !ok2 {
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open() {
		return false, nil // nft can still do it
	}
	if err = w.queue(f, deletes, w.conn.SetDeleteElements); err == nil {
		err = w.queue(f, adds, w.conn.SetAddElements)
	}
	if err = w.flush(err); err != nil {
		return true, err
	}
	return true, nil
}

// loadBatch is how many elements one transaction of a netlink load holds:
// a batch is one message to the kernel, which refuses one larger than the
// socket's send buffer (212 KiB by default; an element takes up to ~90
// bytes).
const loadBatch = 2000

// load adds elements to generation g of f's table, which nothing reads
// yet, as one transaction over the netlink socket: neither nft's parser
// nor the elements' text. It returns the elements it cannot write
// (interval sets'), for nft, and ok false when it has no socket.
func (w *elementWriter) load(f *family, g generation, elems []element) (rest []element, ok bool, err error) {
	batch := make([]encodedElement, 0, len(elems))
	var arena []byte
	for _, e := range elems {
		el, ok := e.kernel(g, &arena)
		if !ok {
			rest = append(rest, e)
			continue
		}
		batch = append(batch, el)
	}
	sortBySet(batch)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open() {
		return nil, false, nil
	}
	if err := w.flush(w.queue(f, batch, w.conn.SetAddElements)); err != nil {
		return nil, true, err
	}
	return rest, true, nil
}

// deleteObjects deletes sets, maps and chains of f's table, unreferenced,
// as one transaction: over the socket that stays open, the kernel frees a
// set's elements after the commit, in the background, where nft's exit
// would wait for it (about a second for a million elements). ok is false
// when it has no socket.
func (w *elementWriter) deleteObjects(f *family, objs []knftables.Object) (ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open() {
		return false, nil
	}
	for _, o := range objs {
		switch o.(type) {
		case *knftables.Set, *knftables.Map, *knftables.Chain:
		default:
			return false, nil
		}
	}
	table := netlinkTable(f, TableName)
	for _, o := range objs {
		switch o := o.(type) {
		case *knftables.Set:
			w.conn.DelSet(&nftables.Set{Table: table, Name: o.Name})
		case *knftables.Map:
			w.conn.DelSet(&nftables.Set{Table: table, Name: o.Name})
		case *knftables.Chain:
			w.conn.DelChain(&nftables.Chain{Table: table, Name: o.Name})
		}
	}
	return true, w.flush(nil)
}

// sortBySet puts the elements of a set together, for one message per set.
func sortBySet(batch []encodedElement) {
	slices.SortFunc(batch, func(a, b encodedElement) int { return strings.Compare(a.set, b.set) })
}

// open makes sure the writer has its socket; w.mu must be held.
func (w *elementWriter) open() bool {
	if w.conn != nil {
		return true
	}
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return false
	}
	w.conn = conn
	return true
}

// queue adds one message per run of elements of the same set, in the order
// given; w.mu must be held.
func (w *elementWriter) queue(f *family, list []encodedElement, do func(*nftables.Set, []nftables.SetElement) error) error {
	return queueElements(netlinkTable(f, TableName), list, do)
}

func netlinkTable(f *family, name string) *nftables.Table {
	if f.is6 {
		return &nftables.Table{Name: name, Family: nftables.TableFamilyIPv6}
	}
	return &nftables.Table{Name: name, Family: nftables.TableFamilyIPv4}
}

// queueElements adds one message per run of elements of the same set, in
// the order given.
func queueElements(table *nftables.Table, list []encodedElement, do func(*nftables.Set, []nftables.SetElement) error) error {
	for i := 0; i < len(list); {
		j := i
		var elems []nftables.SetElement
		for ; j < len(list) && list[j].set == list[i].set; j++ {
			elems = append(elems, list[j].elem)
		}
		// A message's element list is one netlink attribute, at most
		// 64 KiB: a few hundred elements.
		for chunk := range slices.Chunk(elems, 500) {
			if err := do(&nftables.Set{Table: table, Name: list[i].set}, chunk); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

// flush commits what is queued as one batch, unless err says queuing
// failed; w.mu must be held. After a failure the kernel aborted the whole
// batch, and the next use opens a fresh socket.
func (w *elementWriter) flush(err error) error {
	if err == nil {
		err = w.conn.Flush()
	}
	if err != nil {
		w.conn.CloseLasting()
		w.conn = nil
		return err
	}
	w.commits++
	return nil
}
