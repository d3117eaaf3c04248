// Package nfwire is the kernel's side of nf_tables: the netlink messages
// that create tables, chains and sets and add or delete set elements, laid
// out byte for byte as nft lays them out, and the socket that commits them
// as one transaction. It knows nothing of services: its callers say which
// sets, with which fields, hold which bytes.
package nfwire

import (
	"encoding/binary"
	"iter"

	"golang.org/x/sys/unix"
)

// Family is an nf_tables address family, as a message's header names it.
type Family uint8

const (
	IPv4 Family = unix.NFPROTO_IPV4
	IPv6 Family = unix.NFPROTO_IPV6
)

// String is the family as nft names it.
func (f Family) String() string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// Batch is one nf_tables transaction of element and object changes, laid
// out in one buffer as the bytes the socket sends: the batch's begin
// message, then each message with its netlink header, the end message
// written by Commit. An element costs a few appends of its bytes, and a
// batch Reset for the next transaction keeps its buffer.
type Batch struct {
	table string // the table's name in every family
	buf   []byte
	msgs  []message
	sets  uint32 // sets created, which the kernel numbers
}

// NewBatch starts an empty transaction on the tables named table.
func NewBatch(table string) *Batch {
	b := &Batch{table: table}
	b.Reset()
	return b
}

// Reset empties the batch, keeping its memory.
func (b *Batch) Reset() {
	b.buf, b.msgs, b.sets = b.buf[:0], b.msgs[:0], 0
	b.control(unix.NFNL_MSG_BATCH_BEGIN)
}

// nlmsghdrLen is a netlink message header's length: the message's length,
// type and flags, a sequence number and a port id.
const nlmsghdrLen = unix.SizeofNlMsghdr

// message is one message of a batch: its type and its bytes in buf (from
// its netlink header).
type message struct {
	typ        uint16
	start, end int
}

// Empty: the batch holds no message.
func (b *Batch) Empty() bool { return len(b.msgs) == 0 }

// Messages are the batch's messages: each one's type (subsystem and
// operation) and bytes (the nfgenmsg header and the attributes).
func (b *Batch) Messages() iter.Seq2[uint16, []byte] {
	return func(yield func(uint16, []byte) bool) {
		for _, m := range b.msgs {
			if !yield(m.typ, b.buf[m.start+nlmsghdrLen:m.end]) {
				return
			}
		}
	}
}

// MaxListElements is how many elements one message holds: its element
// list is one attribute, whose length must fit 16 bits (an element takes
// up to about 100 bytes).
const MaxListElements = 500

// ElementList is one message of a batch adding or deleting elements of
// one set, open until End.
type ElementList struct {
	b                 *Batch
	op                uint16
	start, list, size int
}

// Elements starts a message that adds (unix.NFT_MSG_NEWSETELEM) or
// deletes (unix.NFT_MSG_DELSETELEM) elements of set in fam's table; the
// caller keeps to MaxListElements.
func (b *Batch) Elements(op uint16, fam Family, set string) ElementList {
	start := b.begin(fam)
	b.attrString(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.attrString(unix.NFTA_SET_ELEM_LIST_SET, set)
	return ElementList{b: b, op: op, start: start, list: b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)}
}

// Add lists an element by its key, with a map's value (none for a set, or
// for a deletion).
func (l *ElementList) Add(key, value []byte) {
	item := l.item(key)
	if l.op == unix.NFT_MSG_NEWSETELEM && len(value) > 0 {
		data := l.b.nest(unix.NFTA_SET_ELEM_DATA)
		l.b.attr(unix.NFTA_DATA_VALUE, value)
		l.b.close(data)
	}
	l.b.close(item)
}

// AddGoto lists a verdict map's element whose value is a goto to chain.
func (l *ElementList) AddGoto(key []byte, chain string) {
	item := l.item(key)
	if l.op == unix.NFT_MSG_NEWSETELEM {
		data := l.b.nest(unix.NFTA_SET_ELEM_DATA)
		verdict := l.b.nest(unix.NFTA_DATA_VERDICT)
		code := int32(unix.NFT_GOTO)
		l.b.attrU32(unix.NFTA_VERDICT_CODE, uint32(code))
		l.b.attrString(unix.NFTA_VERDICT_CHAIN, chain)
		l.b.close(verdict)
		l.b.close(data)
	}
	l.b.close(item)
}

// item opens the next element of the list, with its key.
func (l *ElementList) item(key []byte) int {
	l.size++
	item := l.b.nest(uint16(l.size))
	k := l.b.nest(unix.NFTA_SET_ELEM_KEY)
	l.b.attr(unix.NFTA_DATA_VALUE, key)
	l.b.close(k)
	return item
}

// End closes the message.
func (l *ElementList) End() {
	l.b.close(l.list)
	l.b.end(l.op, l.start)
}

// DeleteSet adds a message deleting a set or map of fam's table;
// DeleteChain one deleting a chain.
func (b *Batch) DeleteSet(fam Family, name string) {
	start := b.begin(fam)
	b.attrString(unix.NFTA_SET_TABLE, b.table)
	b.attrString(unix.NFTA_SET_NAME, name)
	b.end(unix.NFT_MSG_DELSET, start)
}

func (b *Batch) DeleteChain(fam Family, name string) {
	start := b.begin(fam)
	b.attrString(unix.NFTA_CHAIN_TABLE, b.table)
	b.attrString(unix.NFTA_CHAIN_NAME, name)
	b.end(unix.NFT_MSG_DELCHAIN, start)
}

// NewTable adds a message creating fam's table with its comment, as nft's
// "add table" would: an existing one is left as it is.
func (b *Batch) NewTable(fam Family, comment string) {
	start := b.begin(fam)
	b.attrString(unix.NFTA_TABLE_NAME, b.table)
	b.attrU32(unix.NFTA_TABLE_FLAGS, 0)
	var u udata
	u.put(udataComment, append([]byte(comment), 0))
	b.attr(nftaTableUserdata, u)
	b.end(unix.NFT_MSG_NEWTABLE, start)
}

// NewChain adds a message creating a regular chain, left as it is if it
// exists; FlushChain one deleting its rules.
func (b *Batch) NewChain(fam Family, name string) {
	start := b.begin(fam)
	b.attrString(unix.NFTA_CHAIN_TABLE, b.table)
	b.attrString(unix.NFTA_CHAIN_NAME, name)
	b.end(unix.NFT_MSG_NEWCHAIN, start)
}

func (b *Batch) FlushChain(fam Family, name string) {
	start := b.begin(fam)
	b.attrString(unix.NFTA_RULE_TABLE, b.table)
	b.attrString(unix.NFTA_RULE_CHAIN, name)
	b.end(unix.NFT_MSG_DELRULE, start)
}

// begin starts a message: room for its netlink header, then its nfgenmsg
// header (the family, version 0, resource 0).
func (b *Batch) begin(fam Family) int {
	start := len(b.buf)
	b.buf = append(b.buf, make([]byte, nlmsghdrLen)...)
	b.buf = append(b.buf, byte(fam), unix.NFNETLINK_V0, 0, 0)
	return start
}

// end writes the header of the message begun at start: its length, its
// type, and its flags (an answer asked for each; nft's "add" for what
// creates, so that what exists stays).
func (b *Batch) end(op uint16, start int) {
	typ := uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | op)
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	switch op {
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_NEWCHAIN:
		flags |= unix.NLM_F_CREATE
	}
	b.header(start, typ, flags)
	b.msgs = append(b.msgs, message{typ: typ, start: start, end: len(b.buf)})
}

// header writes the netlink header of the message from start to the end of
// the buffer; its sequence number is Commit's to write.
func (b *Batch) header(start int, typ, flags uint16) {
	h := b.buf[start:]
	binary.NativeEndian.PutUint32(h[0:], uint32(len(b.buf)-start))
	binary.NativeEndian.PutUint16(h[4:], typ)
	binary.NativeEndian.PutUint16(h[6:], flags)
}

// control appends the message that begins or ends the transaction.
func (b *Batch) control(typ uint16) {
	start := len(b.buf)
	b.buf = append(b.buf, make([]byte, nlmsghdrLen)...)
	b.buf = append(b.buf, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES)
	b.header(start, typ, unix.NLM_F_REQUEST)
}

// attr appends an attribute: its length and type in host order, then its
// payload, padded to four bytes.
func (b *Batch) attr(typ uint16, payload []byte) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(payload)))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, payload...)
	b.pad()
}

func (b *Batch) attrString(typ uint16, s string) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(s)+1))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, s...)
	b.buf = append(b.buf, 0)
	b.pad()
}

func (b *Batch) attrU32(typ uint16, v uint32) {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], v)
	b.attr(typ, p[:])
}

func (b *Batch) pad() {
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

// nest opens a nested attribute; close sets its length.
func (b *Batch) nest(typ uint16) int {
	start := len(b.buf)
	b.buf = append(b.buf, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(b.buf[start+2:], typ|unix.NLA_F_NESTED)
	return start
}

func (b *Batch) close(start int) {
	binary.NativeEndian.PutUint16(b.buf[start:], uint16(len(b.buf)-start))
}
