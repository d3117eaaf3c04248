package datapath

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// A full sync creates a generation's table, sets and maps over the element
// writer's socket (see prepareSets), so that its elements can start loading
// without waiting for an nft process. These are the messages nft sends for
// "add table" and "add set" or "add map", worked out from the declarations
// tableSets makes: the same attributes, and the same user data, in which
// nft records what it needs to print and parse the set again (the byte
// order, the typeof expressions). TestSetsOverNetlinkMatchNft compares what
// the kernel holds either way, byte for byte.

// Attributes and flags x/sys/unix does not name.
const (
	nftaTableUserdata = 6    // NFTA_TABLE_USERDATA
	nftaSetDescConcat = 2    // NFTA_SET_DESC_CONCAT
	nftaSetFieldLen   = 1    // NFTA_SET_FIELD_LEN
	nftSetConcat      = 0x80 // NFT_SET_CONCAT
)

// nft's numbers: its data types, byte orders, expression types, protocol
// headers and their fields, and its user data's attribute types.
const (
	typeInteger = 4
	typeIPv4    = 7
	typeIPv6    = 8
	typeProto   = 12
	typeService = 13
	typeBits    = 6 // a concatenation's type: its fields' types, 6 bits each

	orderNone = 0 // a concatenation's
	orderHost = 1
	orderBig  = 2

	exprPayload = 7
	exprMeta    = 9
	exprConcat  = 13
	exprNumgen  = 23

	metaL4Proto     = 16 // NFT_META_L4PROTO
	numgenRandom    = 1  // NFT_NG_RANDOM
	udataComment    = 0  // a table's comment
	udataKeyOrder   = 0  // a set's
	udataDataOrder  = 1
	udataKeyTypeof  = 3
	udataDataTypeof = 4
	udataDataRange  = 6 // the map's values are ranges
)

// payloadField is a protocol header's field as nft numbers it.
type payloadField struct{ header, field uint32 }

var payloadFields = map[string]payloadField{
	"ip saddr": {12, 11}, "ip daddr": {12, 12}, "ip ttl": {12, 8},
	"ip6 saddr": {13, 8}, "ip6 daddr": {13, 9}, "ip6 hoplimit": {13, 7},
	"th dport": {11, 2}, "tcp dport": {8, 2}, "udp dport": {6, 2}, "sctp dport": {10, 2},
}

// kernelField is one field of a set's key or value: its data type, its
// size in bytes, its byte order and, declared by typeof, its expression's
// user data.
type kernelField struct {
	dtype uint32
	size  int
	order uint32
	expr  []byte
}

// typeFields are the fields a "type" declaration names.
var typeFields = map[string]kernelField{
	"ipv4_addr":    {dtype: typeIPv4, size: 4, order: orderBig},
	"ipv6_addr":    {dtype: typeIPv6, size: 16, order: orderBig},
	"inet_proto":   {dtype: typeProto, size: 1, order: orderBig},
	"inet_service": {dtype: typeService, size: 2, order: orderBig},
}

// typeofField is the field a typeof declaration's expression makes.
func typeofField(expr string) (kernelField, error) {
	var u udata
	switch {
	case expr == "meta l4proto":
		u.u32(0, metaL4Proto)
		return kernelField{dtype: typeProto, size: 1, order: orderBig, expr: u.expr(exprMeta)}, nil
	case strings.HasPrefix(expr, "numgen random mod "):
		mod, err := strconv.ParseUint(strings.TrimPrefix(expr, "numgen random mod "), 10, 32)
		if err != nil {
			return kernelField{}, fmt.Errorf("numgen: %w", err)
		}
		u.u32(0, numgenRandom)
		u.u32(1, uint32(mod))
		u.u32(2, 0) // offset
		return kernelField{dtype: typeInteger, size: 4, order: orderHost, expr: u.expr(exprNumgen)}, nil
	}
	p, ok := payloadFields[expr]
	if !ok {
		return kernelField{}, fmt.Errorf("no netlink form for %q", expr)
	}
	u.u32(0, p.header)
	u.u32(1, p.field)
	f := kernelField{order: orderBig}
	switch name := expr[strings.IndexByte(expr, ' ')+1:]; name {
	case "saddr", "daddr":
		f.dtype, f.size = typeIPv4, 4
		if strings.HasPrefix(expr, "ip6 ") {
			f.dtype, f.size = typeIPv6, 16
		}
	case "dport":
		f.dtype, f.size = typeService, 2
	default: // the TTL, the hop limit: integers, whose width nft records
		f.dtype, f.size = typeInteger, 1
		u.u32(4, 8)
	}
	f.expr = u.expr(exprPayload)
	return f, nil
}

// parseKernelFields reads one side of a declaration: "ipv4_addr .
// inet_service" (typeof false) or "ip daddr . tcp dport".
func parseKernelFields(decl string, typeof bool) ([]kernelField, error) {
	var out []kernelField
	for part := range strings.SplitSeq(decl, " . ") {
		if !typeof {
			f, ok := typeFields[part]
			if !ok {
				return nil, fmt.Errorf("no netlink form for type %q", part)
			}
			out = append(out, f)
			continue
		}
		f, err := typeofField(part)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// newSet adds a message creating the set or map obj (one of tableSets, or
// a pick's set) in f's table, as nft's "add set" or "add map" would: an
// existing one of the same shape is left as it is.
func (b *nfBatch) newSet(f *family, obj knftables.Object) error {
	var name, decl string
	var typeof bool
	var declared []knftables.SetFlag
	switch o := obj.(type) {
	case *knftables.Set:
		name, decl, typeof, declared = o.Name, o.Type+o.TypeOf, o.TypeOf != "", o.Flags
		if o.Comment != nil || o.Timeout != nil || o.GCInterval != nil || o.Size != nil || o.Policy != nil || o.AutoMerge != nil {
			return fmt.Errorf("set %s: no netlink form for its options", name)
		}
	case *knftables.Map:
		name, decl, typeof, declared = o.Name, o.Type+o.TypeOf, o.TypeOf != "", o.Flags
		if o.Comment != nil || o.Timeout != nil || o.GCInterval != nil || o.Size != nil || o.Policy != nil {
			return fmt.Errorf("map %s: no netlink form for its options", name)
		}
	default:
		return fmt.Errorf("no netlink form for %T", obj)
	}
	interval := false
	for _, fl := range declared {
		if fl != knftables.IntervalFlag {
			return fmt.Errorf("set %s: no netlink form for flag %q", name, fl)
		}
		interval = true
	}
	keyDecl, dataDecl, isMap := strings.Cut(decl, " : ")
	key, err := parseKernelFields(keyDecl, typeof)
	if err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	verdict := dataDecl == "verdict"
	var data []kernelField
	if isMap && !verdict {
		if data, err = parseKernelFields(dataDecl, typeof); err != nil {
			return fmt.Errorf("map %s: %w", name, err)
		}
	}

	var flags uint32
	if isMap {
		flags |= unix.NFT_SET_MAP
	}
	if interval {
		flags |= unix.NFT_SET_INTERVAL
		if len(key) > 1 {
			flags |= nftSetConcat
		}
	}
	start := b.begin(f)
	b.attrString(unix.NFTA_SET_TABLE, b.table)
	b.attrString(unix.NFTA_SET_NAME, name)
	b.sets++
	b.attrU32(unix.NFTA_SET_ID, b.sets) // required, unique in the transaction
	b.attrU32(unix.NFTA_SET_FLAGS, flags)
	keyType, keyLen := fieldsType(key)
	b.attrU32(unix.NFTA_SET_KEY_TYPE, keyType)
	b.attrU32(unix.NFTA_SET_KEY_LEN, keyLen)
	if isMap {
		if verdict {
			b.attrU32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		} else {
			dataType, dataLen := fieldsType(data)
			b.attrU32(unix.NFTA_SET_DATA_TYPE, dataType)
			b.attrU32(unix.NFTA_SET_DATA_LEN, dataLen)
		}
	}
	if flags&nftSetConcat != 0 {
		desc := b.nest(unix.NFTA_SET_DESC)
		concat := b.nest(nftaSetDescConcat)
		for _, k := range key {
			elem := b.nest(unix.NFTA_LIST_ELEM)
			b.attrU32(nftaSetFieldLen, uint32(k.size))
			b.close(elem)
		}
		b.close(concat)
		b.close(desc)
	}
	var u udata
	u.u32(udataKeyOrder, fieldsOrder(key))
	if isMap {
		u.u32(udataDataOrder, fieldsOrder(data))
	}
	if e := fieldsExpr(key, typeof); e != nil {
		u.put(udataKeyTypeof, e)
	}
	if e := fieldsExpr(data, typeof); e != nil {
		u.put(udataDataTypeof, e)
	}
	if isMap {
		u.u32(udataDataRange, 0)
	}
	b.attr(unix.NFTA_SET_USERDATA, u)
	b.end(unix.NFT_MSG_NEWSET, start)
	return nil
}

// fieldsType is a key's or value's type and length: a concatenation's
// fields each take a multiple of four bytes.
func fieldsType(fs []kernelField) (typ, size uint32) {
	if len(fs) == 1 {
		return fs[0].dtype, uint32(fs[0].size)
	}
	for _, f := range fs {
		typ = typ<<typeBits | f.dtype
		size += uint32(f.size+3) &^ 3
	}
	return typ, size
}

func fieldsOrder(fs []kernelField) uint32 {
	if len(fs) == 1 {
		return fs[0].order
	}
	return orderNone
}

// fieldsExpr is the user data recording a key's or value's expression: a
// typeof declaration's, or for a declared concatenation the bare fact.
func fieldsExpr(fs []kernelField, typeof bool) []byte {
	switch {
	case len(fs) == 0 || !typeof && len(fs) == 1:
		return nil
	case len(fs) == 1:
		return fs[0].expr
	}
	var parts udata
	if typeof {
		for i, f := range fs {
			parts.put(byte(i), f.expr)
		}
	}
	var u udata
	u.u32(0, exprConcat)
	u.put(1, parts)
	return u
}

// newTable adds a message creating f's table with its comment, as nft's
// "add table" would: an existing one is left as it is.
func (b *nfBatch) newTable(f *family, comment string) {
	start := b.begin(f)
	b.attrString(unix.NFTA_TABLE_NAME, b.table)
	b.attrU32(unix.NFTA_TABLE_FLAGS, 0)
	var u udata
	u.put(udataComment, append([]byte(comment), 0))
	b.attr(nftaTableUserdata, u)
	b.end(unix.NFT_MSG_NEWTABLE, start)
}

// newChain adds a message creating a regular chain, left as it is if it
// exists; flushChain one deleting its rules.
func (b *nfBatch) newChain(f *family, name string) {
	start := b.begin(f)
	b.attrString(unix.NFTA_CHAIN_TABLE, b.table)
	b.attrString(unix.NFTA_CHAIN_NAME, name)
	b.end(unix.NFT_MSG_NEWCHAIN, start)
}

func (b *nfBatch) flushChain(f *family, name string) {
	start := b.begin(f)
	b.attrString(unix.NFTA_RULE_TABLE, b.table)
	b.attrString(unix.NFTA_RULE_CHAIN, name)
	b.end(unix.NFT_MSG_DELRULE, start)
}

func (b *nfBatch) attrU32(typ uint16, v uint32) {
	b.attr(typ, binary.BigEndian.AppendUint32(nil, v))
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
