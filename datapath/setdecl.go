package datapath

import (
	"fmt"
	"strings"
	"time"

	"github.com/weirlb/weir/datapath/internal/nfwire"
	"sigs.k8s.io/knftables"
)

// setDecl declares one set or map of the table. Every form of it is
// rendered from these fields: the nft object (object), the layout of its
// elements (format) and the netlink message that creates it (wire); no
// form is read back from another.
type setDecl struct {
	name string // without its generation's suffix
	key  []field
	// value is a map's value; verdict makes it a verdict map.
	value   []field
	verdict bool
	// interval: the set holds ranges (an address field a prefix, a TTL
	// field a range); only nft writes its elements.
	interval bool
	// Options that only nft writes: a declaration with any has no
	// netlink form.
	comment string
	timeout time.Duration
}

// field is one field of a set's key or value, as nft declares it (by type
// name, or by the expression that fills it: typeof), as an element lays it
// out, and as the kernel records it.
type field struct {
	typ  string // "ipv4_addr": declared by type
	expr string // "ip daddr": declared by typeof
	kind fieldKind
	wire nfwire.Field
}

// Fields declared by type.
var (
	inetProto   = field{typ: "inet_proto", kind: protoField, wire: nfwire.Field{Type: nfwire.TypeProto, Len: 1, Order: nfwire.BigEndian}}
	inetService = field{typ: "inet_service", kind: serviceField, wire: nfwire.Field{Type: nfwire.TypeService, Len: 2, Order: nfwire.BigEndian}}
)

// addrType is an address of family f.
func addrType(f family) field {
	if f.is6 {
		return field{typ: f.addrType, kind: addr6Field, wire: nfwire.Field{Type: nfwire.TypeIPv6, Len: 16, Order: nfwire.BigEndian}}
	}
	return field{typ: f.addrType, kind: addr4Field, wire: nfwire.Field{Type: nfwire.TypeIPv4, Len: 4, Order: nfwire.BigEndian}}
}

// Fields declared by typeof: what a rule reads from the packet.
var (
	l4proto = field{expr: "meta l4proto", kind: protoField,
		wire: nfwire.Field{Type: nfwire.TypeProto, Len: 1, Order: nfwire.BigEndian, Expr: nfwire.MetaExpr(nfwire.MetaL4Proto)}}
	thDport = dport(nfwire.HeaderTransport, "th")
	// numgenSlot is a backends map's slot, numgen's result: the modulus
	// in a declaration is only its type's.
	numgenSlot = field{expr: "numgen random mod 1", kind: integerField,
		wire: nfwire.Field{Type: nfwire.TypeInteger, Len: 4, Order: nfwire.HostOrder, Expr: nfwire.NumgenExpr(nfwire.NumgenRandom, 1)}}
)

// nft's numbers for the header fields below.
const (
	thDportField     = 2
	ipDaddrField     = 12
	ipTTLField       = 8
	ip6DaddrField    = 9
	ip6HopLimitField = 7
)

// dport is the destination port read from the header h, named name.
func dport(h nfwire.Header, name string) field {
	return field{expr: name + " dport", kind: serviceField,
		wire: nfwire.Field{Type: nfwire.TypeService, Len: 2, Order: nfwire.BigEndian, Expr: nfwire.PayloadExpr(h, thDportField, 0)}}
}

// protocolDport is the destination port of a packet of protocol p.
func protocolDport(p Protocol) field {
	h := map[Protocol]nfwire.Header{TCP: nfwire.HeaderTCP, UDP: nfwire.HeaderUDP, SCTP: nfwire.HeaderSCTP}[p]
	return dport(h, p.String())
}

// daddr is the packet's destination address in family f.
func daddr(f family) field {
	a := addrType(f)
	if f.is6 {
		a.wire.Expr = nfwire.PayloadExpr(nfwire.HeaderIPv6, ip6DaddrField, 0)
	} else {
		a.wire.Expr = nfwire.PayloadExpr(nfwire.HeaderIPv4, ipDaddrField, 0)
	}
	a.typ, a.expr = "", f.ip+" daddr"
	return a
}

// ttl is the packet's TTL (IPv6: hop limit): an integer whose width nft
// records.
func ttl(f family) field {
	h, n := nfwire.HeaderIPv4, uint32(ipTTLField)
	if f.is6 {
		h, n = nfwire.HeaderIPv6, ip6HopLimitField
	}
	return field{expr: f.ttl, kind: ttlField,
		wire: nfwire.Field{Type: nfwire.TypeInteger, Len: 1, Order: nfwire.BigEndian, Expr: nfwire.PayloadExpr(h, n, 8)}}
}

// typeof: the declaration names its fields by expression.
func (d *setDecl) typeof() bool { return d.key[0].expr != "" }

// declaration is the set's type in nft syntax: "ipv4_addr . inet_service"
// or "ip daddr . numgen random mod 1 : ip daddr . tcp dport".
func (d *setDecl) declaration() string {
	s := fieldsText(d.key)
	switch {
	case d.verdict:
		s += " : verdict"
	case len(d.value) > 0:
		s += " : " + fieldsText(d.value)
	}
	return s
}

// fieldsText joins fields as nft declares them, or as a rule reads them.
func fieldsText(fs []field) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.typ + f.expr
	}
	return strings.Join(parts, " . ")
}

// object is the set for nft, in generation g.
func (d *setDecl) object(g generation) knftables.Object {
	var typ, typeOf string
	if d.typeof() {
		typeOf = d.declaration()
	} else {
		typ = d.declaration()
	}
	var flags []knftables.SetFlag
	if d.interval {
		flags = append(flags, knftables.IntervalFlag)
	}
	var comment *string
	if d.comment != "" {
		comment = knftables.PtrTo(d.comment)
	}
	var timeout *time.Duration
	if d.timeout != 0 {
		timeout = &d.timeout
	}
	name := g.of(d.name)
	if d.verdict || len(d.value) > 0 {
		return &knftables.Map{Name: name, Type: typ, TypeOf: typeOf, Flags: flags, Comment: comment, Timeout: timeout}
	}
	return &knftables.Set{Name: name, Type: typ, TypeOf: typeOf, Flags: flags, Comment: comment, Timeout: timeout}
}

// format is how the kernel holds the set's elements.
func (d *setDecl) format() setFormat {
	kinds := func(fs []field) []fieldKind {
		var out []fieldKind
		for _, f := range fs {
			out = append(out, f.kind)
		}
		return out
	}
	return setFormat{key: kinds(d.key), value: kinds(d.value), verdict: d.verdict, interval: d.interval}
}

// wire is the set's netlink form in generation g: an error for options
// only nft writes.
func (d *setDecl) wire(g generation) (nfwire.Set, error) {
	if d.comment != "" || d.timeout != 0 {
		return nfwire.Set{}, fmt.Errorf("set %s: no netlink form for its options", g.of(d.name))
	}
	wires := func(fs []field) []nfwire.Field {
		var out []nfwire.Field
		for _, f := range fs {
			out = append(out, f.wire)
		}
		return out
	}
	return nfwire.Set{Name: g.of(d.name), Key: wires(d.key), Data: wires(d.value),
		Verdict: d.verdict, Interval: d.interval, Typeof: d.typeof()}, nil
}
