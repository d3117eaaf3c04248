package datapath

import (
	"encoding/binary"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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
	formats map[*family]map[string]setFormat
	commits int // batches committed, for tests
}

// setFormat is how the kernel holds one set's elements: the fields of the
// key and, for a map, of the value or a verdict.
type setFormat struct {
	key, value []fieldKind
	verdict    bool
}

type fieldKind int

const (
	addr4Field fieldKind = iota + 1
	addr6Field
	protoField   // inet_proto: one byte
	serviceField // inet_service: two bytes, network order
	integerField // numgen's result: 32 bits, host order
)

func newElementWriter() *elementWriter {
	w := &elementWriter{formats: map[*family]map[string]setFormat{}}
	for _, f := range []*family{&ipv4, &ipv6} {
		w.formats[f] = map[string]setFormat{}
		for _, obj := range tableSets(*f, "") {
			var name, typ string
			var flags []knftables.SetFlag
			switch o := obj.(type) {
			case *knftables.Set:
				name, typ, flags = o.Name, o.Type, o.Flags
			case *knftables.Map:
				name, typ, flags = o.Name, o.Type+o.TypeOf, o.Flags
			}
			if len(flags) > 0 {
				continue // interval sets are nft's
			}
			if format, ok := parseFormat(typ); ok {
				w.formats[f][strings.TrimSuffix(name, "_")] = format
			}
		}
	}
	return w
}

// parseFormat reads a set's type ("ipv4_addr . inet_service") or typeof
// ("ip daddr . numgen random mod 1 : ip daddr . tcp dport") declaration.
func parseFormat(typ string) (setFormat, bool) {
	keyPart, valuePart, isMap := strings.Cut(typ, " : ")
	var out setFormat
	var ok bool
	if out.key, ok = parseFields(keyPart); !ok {
		return setFormat{}, false
	}
	switch {
	case !isMap:
	case valuePart == "verdict":
		out.verdict = true
	default:
		if out.value, ok = parseFields(valuePart); !ok {
			return setFormat{}, false
		}
	}
	return out, true
}

func parseFields(s string) ([]fieldKind, bool) {
	var out []fieldKind
	for _, part := range strings.Split(s, " . ") {
		var k fieldKind
		switch {
		case part == "ipv4_addr" || part == "ip daddr" || part == "ip saddr":
			k = addr4Field
		case part == "ipv6_addr" || part == "ip6 daddr" || part == "ip6 saddr":
			k = addr6Field
		case part == "inet_proto" || part == "meta l4proto":
			k = protoField
		case part == "inet_service" || strings.HasSuffix(part, " dport"):
			k = serviceField
		case strings.HasPrefix(part, "numgen "):
			k = integerField
		default:
			return nil, false
		}
		out = append(out, k)
	}
	return out, true
}

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

// encode lays out e for generation g of f's table: ok is false for an
// element of a set the writer does not know (the interval sets').
func (w *elementWriter) encode(f *family, g generation, e element) (encodedElement, bool) {
	format, known := w.formats[f][e.set]
	if !known {
		return encodedElement{}, false
	}
	set := e.set
	if e.pick.exists() {
		// In its pick's set: the key of the kind's frontends.
		set, format = e.pick.set(), setFormat{key: format.key}
	}
	el, err := format.encode(e)
	if err != nil {
		return encodedElement{}, false
	}
	return encodedElement{g.of(set), el}, true
}

// commit sends one family's element changes as one netlink batch (atomic,
// like an nft transaction): ok is false, with nothing sent, when an element
// is in a set it cannot write.
func (w *elementWriter) commit(f *family, g generation, ops *elementOps) (ok bool, err error) {
	encode := func(es []element) ([]encodedElement, bool) {
		out := make([]encodedElement, 0, len(es))
		for _, e := range es {
			el, ok := w.encode(f, g, e)
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
// yet, in transactions of loadBatch elements over the netlink socket,
// encoding each batch just before it goes: neither nft's parser nor a
// second copy of the table in memory. It returns the elements it cannot
// write (interval sets), for nft, and ok false when it has no socket.
func (w *elementWriter) load(f *family, g generation, elems iter.Seq[element]) (rest []element, ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open() {
		return nil, false, nil
	}
	// Batches are encoded while the kernel commits the one before: the
	// kernel does its part in the sending thread, so on two cores the two
	// overlap.
	batches := make(chan []encodedElement, 2)
	stop := make(chan struct{})
	go func() {
		defer close(batches)
		batch := make([]encodedElement, 0, loadBatch)
		emit := func() bool {
			sortBySet(batch)
			select {
			case batches <- batch:
				batch = make([]encodedElement, 0, loadBatch)
				return true
			case <-stop:
				return false
			}
		}
		for e := range elems {
			el, ok := w.encode(f, g, e)
			if !ok {
				rest = append(rest, e)
				continue
			}
			if batch = append(batch, el); len(batch) == loadBatch && !emit() {
				return
			}
		}
		if len(batch) > 0 {
			emit()
		}
	}()
	for batch := range batches {
		if err = w.flush(w.queue(f, batch, w.conn.SetAddElements)); err != nil {
			close(stop)
			for range batches {
			}
			return nil, true, err
		}
	}
	return rest, true, nil
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

// encode turns an element in nft syntax into the kernel's bytes.
func (s setFormat) encode(e element) (nftables.SetElement, error) {
	var el nftables.SetElement
	var err error
	if el.Key, err = encodeFields(s.key, e.key); err != nil {
		return el, err
	}
	switch {
	case s.verdict:
		if el.VerdictData, err = parseVerdict(e.value); err != nil {
			return el, err
		}
	case len(s.value) > 0:
		if el.Val, err = encodeFields(s.value, e.value); err != nil {
			return el, err
		}
	case e.value != "":
		return el, fmt.Errorf("a value for a set element")
	}
	return el, nil
}

// encodeFields lays out "a . b . c" as the kernel's registers hold it: each
// field of a concatenation padded to 4 bytes.
func encodeFields(kinds []fieldKind, s string) ([]byte, error) {
	out := make([]byte, 0, 4*len(kinds)+12)
	rest := s
	for i, k := range kinds {
		part, tail, more := strings.Cut(rest, " . ")
		if more != (i < len(kinds)-1) {
			return nil, fmt.Errorf("%q does not have %d fields", s, len(kinds))
		}
		rest = tail
		start := len(out)
		switch k {
		case addr4Field, addr6Field:
			a, err := netip.ParseAddr(part)
			if err != nil || a.Is4() != (k == addr4Field) {
				return nil, fmt.Errorf("%q is not an address of the set's family", part)
			}
			out = append(out, a.AsSlice()...)
		case protoField:
			p, ok := protocolNumbers[part]
			if !ok {
				return nil, fmt.Errorf("unknown protocol %q", part)
			}
			out = append(out, p)
		case serviceField:
			n, err := strconv.ParseUint(part, 10, 16)
			if err != nil {
				return nil, err
			}
			out = binary.BigEndian.AppendUint16(out, uint16(n))
		case integerField:
			n, err := strconv.ParseUint(part, 10, 32)
			if err != nil {
				return nil, err
			}
			out = binary.NativeEndian.AppendUint32(out, uint32(n))
		}
		if len(kinds) > 1 {
			for (len(out)-start)%4 != 0 {
				out = append(out, 0)
			}
		}
	}
	return out, nil
}

var protocolNumbers = map[string]byte{"tcp": 6, "udp": 17, "sctp": 132}

func parseVerdict(v string) (*expr.Verdict, error) {
	switch {
	case v == "drop":
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case v == "accept":
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case v == "return":
		return &expr.Verdict{Kind: expr.VerdictReturn}, nil
	case strings.HasPrefix(v, "goto "):
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: strings.TrimPrefix(v, "goto ")}, nil
	case strings.HasPrefix(v, "jump "):
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: strings.TrimPrefix(v, "jump ")}, nil
	}
	return nil, fmt.Errorf("unknown verdict %q", v)
}
