package nfwire

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// A set is created as nft's "add set" or "add map" creates it: the same
// attributes, and the same user data, in which nft records what it needs
// to print and parse the set again (the byte order, the typeof
// expressions), so that nft lists it, and parses rules naming it, as its
// own.

// Attributes and flags x/sys/unix does not name.
const (
	nftaTableUserdata = 6    // NFTA_TABLE_USERDATA
	nftaSetDescConcat = 2    // NFTA_SET_DESC_CONCAT
	nftaSetFieldLen   = 1    // NFTA_SET_FIELD_LEN
	nftSetConcat      = 0x80 // NFT_SET_CONCAT
)

// DataType is nft's number for a field's data type.
type DataType uint32

const (
	TypeInteger DataType = 4
	TypeIPv4    DataType = 7
	TypeIPv6    DataType = 8
	TypeProto   DataType = 12
	TypeService DataType = 13

	typeBits = 6 // a concatenation's type: its fields' types, 6 bits each
)

// ByteOrder is nft's number for a field's byte order.
type ByteOrder uint32

const (
	orderNone ByteOrder = 0 // a concatenation's
	HostOrder ByteOrder = 1
	BigEndian ByteOrder = 2
)

// Header is nft's number for a protocol header a payload expression reads.
type Header uint32

const (
	HeaderUDP       Header = 6
	HeaderTCP       Header = 8
	HeaderSCTP      Header = 10
	HeaderTransport Header = 11 // "th"
	HeaderIPv4      Header = 12
	HeaderIPv6      Header = 13
)

// nft's numbers for its expressions and its user data's attributes.
const (
	exprPayload = 7
	exprMeta    = 9
	exprConcat  = 13
	exprNumgen  = 23

	MetaL4Proto  = 16 // NFT_META_L4PROTO
	NumgenRandom = 1  // NFT_NG_RANDOM

	udataComment    = 0 // a table's comment
	udataKeyOrder   = 0 // a set's
	udataDataOrder  = 1
	udataKeyTypeof  = 3
	udataDataTypeof = 4
	udataDataRange  = 6 // the map's values are ranges
)

// Field is one field of a set's key or value: its data type, its size in
// bytes, its byte order and, declared by typeof, its expression's user
// data (see PayloadExpr, MetaExpr, NumgenExpr).
type Field struct {
	Type  DataType
	Len   uint32
	Order ByteOrder
	Expr  []byte
}

// PayloadExpr is the user data of a payload expression: a header's field
// (nft's number for it in that header); bits, when not zero, is an
// integer field's width, which nft records.
func PayloadExpr(h Header, field, bits uint32) []byte {
	var u udata
	u.u32(0, uint32(h))
	u.u32(1, field)
	if bits != 0 {
		u.u32(4, bits)
	}
	return u.expr(exprPayload)
}

// MetaExpr is the user data of a meta expression reading key.
func MetaExpr(key uint32) []byte {
	var u udata
	u.u32(0, key)
	return u.expr(exprMeta)
}

// NumgenExpr is the user data of a numgen expression of mode and modulus
// mod, with no offset.
func NumgenExpr(mode, mod uint32) []byte {
	var u udata
	u.u32(0, mode)
	u.u32(1, mod)
	u.u32(2, 0)
	return u.expr(exprNumgen)
}

// Set declares a set or a map: a map has a value (Data) or is a verdict
// map. Typeof says its fields were declared by expressions, whose user
// data nft records.
type Set struct {
	Name     string
	Key      []Field
	Data     []Field
	Verdict  bool
	Interval bool
	Typeof   bool
}

func (s *Set) isMap() bool { return s.Verdict || len(s.Data) > 0 }

// NewSet adds a message creating the set or map s in fam's table, as
// nft's "add set" or "add map" would: an existing one of the same shape is
// left as it is.
func (b *Batch) NewSet(fam Family, s Set) {
	start := b.begin(fam)
	b.attrString(unix.NFTA_SET_TABLE, b.table)
	b.attrString(unix.NFTA_SET_NAME, s.Name)
	b.sets++
	b.attrU32(unix.NFTA_SET_ID, b.sets) // required, unique in the transaction
	flags := s.flags()
	b.attrU32(unix.NFTA_SET_FLAGS, flags)
	keyType, keyLen := fieldsType(s.Key)
	b.attrU32(unix.NFTA_SET_KEY_TYPE, keyType)
	b.attrU32(unix.NFTA_SET_KEY_LEN, keyLen)
	switch {
	case s.Verdict:
		b.attrU32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
	case s.isMap():
		dataType, dataLen := fieldsType(s.Data)
		b.attrU32(unix.NFTA_SET_DATA_TYPE, dataType)
		b.attrU32(unix.NFTA_SET_DATA_LEN, dataLen)
	}
	if flags&nftSetConcat != 0 {
		b.concatDesc(s.Key)
	}
	b.attr(unix.NFTA_SET_USERDATA, s.userdata())
	b.end(unix.NFT_MSG_NEWSET, start)
}

func (s *Set) flags() uint32 {
	var flags uint32
	if s.isMap() {
		flags |= unix.NFT_SET_MAP
	}
	if s.Interval {
		flags |= unix.NFT_SET_INTERVAL
		if len(s.Key) > 1 {
			flags |= nftSetConcat
		}
	}
	return flags
}

// concatDesc describes an interval set's concatenated key: its fields'
// lengths.
func (b *Batch) concatDesc(key []Field) {
	desc := b.nest(unix.NFTA_SET_DESC)
	concat := b.nest(nftaSetDescConcat)
	for _, k := range key {
		elem := b.nest(unix.NFTA_LIST_ELEM)
		b.attrU32(nftaSetFieldLen, k.Len)
		b.close(elem)
	}
	b.close(concat)
	b.close(desc)
}

// userdata is what nft records of the set: its byte orders, its typeof
// expressions.
func (s *Set) userdata() udata {
	var u udata
	u.u32(udataKeyOrder, uint32(fieldsOrder(s.Key)))
	if s.isMap() {
		u.u32(udataDataOrder, uint32(fieldsOrder(s.Data)))
	}
	if e := fieldsExpr(s.Key, s.Typeof); e != nil {
		u.put(udataKeyTypeof, e)
	}
	if e := fieldsExpr(s.Data, s.Typeof); e != nil {
		u.put(udataDataTypeof, e)
	}
	if s.isMap() {
		u.u32(udataDataRange, 0)
	}
	return u
}

// fieldsType is a key's or value's type and length: a concatenation's
// fields each take a multiple of four bytes.
func fieldsType(fs []Field) (typ, size uint32) {
	if len(fs) == 1 {
		return uint32(fs[0].Type), fs[0].Len
	}
	for _, f := range fs {
		typ = typ<<typeBits | uint32(f.Type)
		size += (f.Len + 3) &^ 3
	}
	return typ, size
}

func fieldsOrder(fs []Field) ByteOrder {
	if len(fs) == 1 {
		return fs[0].Order
	}
	return orderNone
}

// fieldsExpr is the user data recording a key's or value's expression: a
// typeof declaration's, or for a declared concatenation the bare fact.
func fieldsExpr(fs []Field, typeof bool) []byte {
	switch {
	case len(fs) == 0 || !typeof && len(fs) == 1:
		return nil
	case len(fs) == 1:
		return fs[0].Expr
	}
	var parts udata
	if typeof {
		for i, f := range fs {
			parts.put(byte(i), f.Expr)
		}
	}
	var u udata
	u.u32(0, exprConcat)
	u.put(1, parts)
	return u
}

// udata is nft's user data: attributes of one byte's type and one byte's
// length, numbers in host order.
type udata []byte

func (u *udata) put(typ byte, v []byte) {
	*u = append(append(*u, typ, byte(len(v))), v...)
}

func (u *udata) u32(typ byte, v uint32) { u.put(typ, binary.NativeEndian.AppendUint32(nil, v)) }

// expr is the user data of an expression of type typ with u's attributes.
func (u udata) expr(typ uint32) []byte {
	var e udata
	e.u32(0, typ)
	e.put(1, u)
	return e
}
