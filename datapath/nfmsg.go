package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfBatch is one nf_tables transaction of element and object changes, laid
// out as the netlink messages the kernel takes, in one buffer: an element
// costs a few appends of its bytes, and nothing else.
type nfBatch struct {
	table string // the table's name in every family
	buf   []byte
	msgs  []nfMsg
	sets  uint32 // sets created, which the kernel numbers
}

func newBatch() *nfBatch { return &nfBatch{table: TableName} }

// nfMsg is one message of a batch: its type and its bytes in buf (the
// nfgenmsg header and the attributes).
type nfMsg struct {
	typ        uint16
	start, end int
}

// maxListElements is how many elements one message holds: its element
// list is one attribute, whose length must fit 16 bits (an element takes
// up to about 100 bytes).
const maxListElements = 500

// destination is the set or map an element goes in: a pick's set, or one
// of tableSets.
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

// elements adds messages that add (unix.NFT_MSG_NEWSETELEM) or delete
// (unix.NFT_MSG_DELSETELEM) elems in generation g of f's table, one
// message per set and up to maxListElements elements. It returns the
// elements of interval sets, which only nft writes.
func (b *nfBatch) elements(op uint16, f *family, g generation, elems []element) (rest []element) {
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
			n := min(len(idx), maxListElements)
			b.setElements(op, f, name, elems, idx[:n])
			idx = idx[n:]
		}
	}
	return rest
}

// setElements adds one message for the elements idx of elems, all of set.
func (b *nfBatch) setElements(op uint16, f *family, set string, elems []element, idx []int32) {
	start := b.begin(f)
	b.attrString(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.attrString(unix.NFTA_SET_ELEM_LIST_SET, set)
	list := b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	for n, i := range idx {
		e := &elems[i]
		item := b.nest(uint16(n + 1))
		key := b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, e.key.bytes())
		b.close(key)
		if op == unix.NFT_MSG_NEWSETELEM && e.value.n > 0 {
			data := b.nest(unix.NFTA_SET_ELEM_DATA)
			if e.format().verdict {
				verdict := b.nest(unix.NFTA_DATA_VERDICT)
				code := int32(unix.NFT_GOTO)
				b.attr(unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(code)))
				b.attrString(unix.NFTA_VERDICT_CHAIN, e.verdictChain())
				b.close(verdict)
			} else {
				b.attr(unix.NFTA_DATA_VALUE, e.value.bytes())
			}
			b.close(data)
		}
		b.close(item)
	}
	b.close(list)
	b.end(op, start)
}

// delete adds a message deleting a set or map (unix.NFT_MSG_DELSET) or a
// chain (unix.NFT_MSG_DELCHAIN) of f's table.
func (b *nfBatch) delete(op uint16, f *family, name string) {
	start := b.begin(f)
	switch op {
	case unix.NFT_MSG_DELSET:
		b.attrString(unix.NFTA_SET_TABLE, b.table)
		b.attrString(unix.NFTA_SET_NAME, name)
	case unix.NFT_MSG_DELCHAIN:
		b.attrString(unix.NFTA_CHAIN_TABLE, b.table)
		b.attrString(unix.NFTA_CHAIN_NAME, name)
	default:
		panic(fmt.Sprintf("datapath: no deletion message %d", op))
	}
	b.end(op, start)
}

// begin starts a message with its nfgenmsg header: the family, version 0,
// resource 0.
func (b *nfBatch) begin(f *family) int {
	start := len(b.buf)
	proto := byte(unix.NFPROTO_IPV4)
	if f.is6 {
		proto = unix.NFPROTO_IPV6
	}
	b.buf = append(b.buf, proto, unix.NFNETLINK_V0, 0, 0)
	return start
}

func (b *nfBatch) end(op uint16, start int) {
	b.msgs = append(b.msgs, nfMsg{typ: unix.NFNL_SUBSYS_NFTABLES<<8 | op, start: start, end: len(b.buf)})
}

// attr appends an attribute: its length and type in host order, then its
// payload, padded to four bytes.
func (b *nfBatch) attr(typ uint16, payload []byte) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(payload)))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, payload...)
	b.pad()
}

func (b *nfBatch) attrString(typ uint16, s string) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(s)+1))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, s...)
	b.buf = append(b.buf, 0)
	b.pad()
}

func (b *nfBatch) pad() {
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

// nest opens a nested attribute; close sets its length.
func (b *nfBatch) nest(typ uint16) int {
	start := len(b.buf)
	b.buf = append(b.buf, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(b.buf[start+2:], typ|unix.NLA_F_NESTED)
	return start
}

func (b *nfBatch) close(start int) {
	binary.NativeEndian.PutUint16(b.buf[start:], uint16(len(b.buf)-start))
}

func (b *nfBatch) empty() bool { return len(b.msgs) == 0 }

// nfConn is a netlink socket to nf_tables that stays open: the kernel frees
// what a transaction deleted in the background, where closing the socket
// waits for it (nf_tables flushes its destroy work on NETLINK_URELEASE).
type nfConn struct{ conn *netlink.Conn }

func dialNF() (*nfConn, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, err
	}
	return &nfConn{conn: conn}, nil
}

func (c *nfConn) Close() error { return c.conn.Close() }

// commit sends the batch as one transaction, atomic like an nft run, and
// reads the kernel's answer to every message: nil when it took them all.
// After an error the kernel has aborted the whole transaction; the
// socket should not be used again, as answers may be left on it.
func (c *nfConn) commit(b *nfBatch) error {
	if b.empty() {
		return nil
	}
	batchHeader := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}
	msgs := make([]netlink.Message, 0, len(b.msgs)+2)
	msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request}, Data: batchHeader})
	for _, m := range b.msgs {
		flags := netlink.Request | netlink.Acknowledge
		switch m.typ & 0xff {
		case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_NEWCHAIN:
			flags |= netlink.Create // as nft's "add": what exists stays
		}
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(m.typ), Flags: flags}, Data: b.buf[m.start:m.end]})
	}
	msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request}, Data: batchHeader})
	if _, err := c.conn.SendMessages(msgs); err != nil {
		return fmt.Errorf("sending a transaction: %w", err)
	}
	var errs error
	for range b.msgs {
		if _, err := c.conn.Receive(); err != nil {
			if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOBUFS) {
				return err // the kernel sends no other answer
			}
			errs = errors.Join(errs, err)
		}
	}
	return errs
}

// listTable names the chains, sets and maps of f's table: the kernel's
// dumps of their names, without their contents.
func (c *nfConn) listTable(f *family, table string) (tableObjects, error) {
	var objs tableObjects
	chains, err := c.dump(f, unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE, table)
	if err != nil {
		return objs, fmt.Errorf("listing %s chains: %w", f, err)
	}
	for _, attrs := range chains {
		if attrs.string(unix.NFTA_CHAIN_TABLE) == table {
			objs.chains = append(objs.chains, attrs.string(unix.NFTA_CHAIN_NAME))
		}
	}
	if len(objs.chains) == 0 {
		// No chains: no table of ours (Weir's always has chains), and
		// the kernel refuses to list the sets of a missing table.
		return objs, nil
	}
	sets, err := c.dump(f, unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, table)
	if err != nil {
		return objs, fmt.Errorf("listing %s sets: %w", f, err)
	}
	for _, attrs := range sets {
		flags := uint32(0)
		if v := attrs[unix.NFTA_SET_FLAGS]; len(v) == 4 {
			flags = binary.BigEndian.Uint32(v)
		}
		switch {
		case attrs.string(unix.NFTA_SET_TABLE) != table:
		case flags&unix.NFT_SET_MAP != 0:
			objs.maps = append(objs.maps, attrs.string(unix.NFTA_SET_NAME))
		default:
			objs.sets = append(objs.sets, attrs.string(unix.NFTA_SET_NAME))
		}
	}
	return objs, nil
}

// dump asks the kernel for its objects of one kind (typ: a GET message) in
// f's table (named by the attribute tableAttr), and returns each one's
// attributes.
func (c *nfConn) dump(f *family, typ, tableAttr uint16, table string) ([]nfAttrs, error) {
	b := newBatch()
	start := b.begin(f)
	b.attrString(tableAttr, table)
	b.end(typ, start)
	m := b.msgs[0]
	msgs, err := c.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(m.typ), Flags: netlink.Request | netlink.Dump},
		Data:   b.buf[m.start:m.end],
	})
	if err != nil {
		return nil, err
	}
	var out []nfAttrs
	for _, msg := range msgs {
		if len(msg.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(msg.Data[4:])
		if err != nil {
			return nil, err
		}
		attrs := nfAttrs{}
		for ad.Next() {
			attrs[ad.Type()] = ad.Bytes()
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		out = append(out, attrs)
	}
	return out, nil
}

// nfAttrs are a message's attributes by type.
type nfAttrs map[uint16][]byte

// string is a string attribute, without its terminating NUL.
func (a nfAttrs) string(typ uint16) string { return strings.TrimSuffix(string(a[typ]), "\x00") }
