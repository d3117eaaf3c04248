package datapath

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// An element of a set or map is held as the kernel holds it: its key and
// value are the bytes nf_tables stores, laid out by its set's format. A
// table of 100,000 services has over a million elements, so an element is
// a fixed-size value with no pointer in it: the live map costs no
// allocation per element and nothing for the collector to follow, a load
// over netlink copies the bytes as they are, and nft syntax is rendered
// only for what still goes through nft (a change that also touches chains,
// the interval sets, the tests' fake).

// element is one set or map element of one family's table.
type element struct {
	elemID
	value elemValue // empty for set elements
	// pick, for a frontend without session affinity, is the pick whose set
	// holds it (set is then its kind's frontends, value empty).
	pick pick
}

// elemID identifies an element regardless of its value.
type elemID struct {
	fam uint8 // index in families
	set setID
	key fields
}

func (id elemID) family() *family { return families[id.fam] }

// format is how the bytes of the element's set read.
func (id elemID) format() *setFormat { return &formats[id.fam][id.set] }

func compareIDs(a, b elemID) int {
	return cmp.Or(cmp.Compare(a.fam, b.fam), cmp.Compare(a.set, b.set), a.key.compare(b.key))
}

// maxFields is the longest key: a firewall_allow element of IPv6,
// address . proto . port . prefix.
const maxFields = 44

// fields is a key or a value in the kernel's layout: each field of a
// concatenation padded to four bytes, in network order (but a numgen slot,
// which is a register in host order). Interval sets, which only nft
// writes, lay a prefix out as its address then its length, and a TTL
// range as its two ends.
type fields struct {
	n uint8
	b [maxFields]byte
}

func (f fields) bytes() []byte { return f.b[:f.n] }

// maxValue is the longest value: an IPv6 backend, address . port.
const maxValue = 20

// elemValue is a map element's value, in the layout of fields.
type elemValue struct {
	n uint8
	b [maxValue]byte
}

func (f fields) asValue() elemValue {
	var v elemValue
	v.n = uint8(copy(v.b[:], f.bytes()))
	return v
}

func (v elemValue) bytes() []byte { return v.b[:v.n] }

func (v elemValue) fields() fields {
	var f fields
	f.n = uint8(copy(f.b[:], v.bytes()))
	return f
}

func (f fields) compare(o fields) int { return bytes.Compare(f.bytes(), o.bytes()) }

func (f *fields) put(p ...byte) *fields {
	n := copy(f.b[f.n:], p)
	f.n += uint8((n + 3) &^ 3)
	return f
}

func (f *fields) addr(a netip.Addr) *fields {
	if a.Is4() {
		b := a.As4()
		return f.put(b[:]...)
	}
	b := a.As16()
	return f.put(b[:]...)
}

func (f *fields) proto(p Protocol) *fields { return f.put(protocolNumber(p)) }

func (f *fields) port(p uint16) *fields { return f.put(byte(p>>8), byte(p)) }

// slot is a backends map's index, numgen's result.
func (f *fields) slot(i int) *fields {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(i))
	return f.put(b[:]...)
}

// prefix is an interval set's address range; a single address is a prefix
// of its full length.
func (f *fields) prefix(p netip.Prefix) *fields {
	p = p.Masked()
	a := p.Addr()
	if a.Is4() {
		b := a.As4()
		f.n += uint8(copy(f.b[f.n:], b[:]))
	} else {
		b := a.As16()
		f.n += uint8(copy(f.b[f.n:], b[:]))
	}
	return f.put(byte(p.Bits()))
}

// ttls is an interval set's range of TTLs.
func (f *fields) ttls(low, high uint8) *fields { return f.put(low, high) }

// affinityRef is a frontends map's value: a goto to the session-affinity
// chain of service port id (see affinity), of its local endpoints or of
// all.
func (f *fields) affinityRef(id uint32, local bool) *fields {
	var which byte
	if local {
		which = 1
	}
	return f.put(byte(id>>24), byte(id>>16), byte(id>>8), byte(id), which)
}

func protocolNumber(p Protocol) byte {
	switch p {
	case TCP:
		return 6
	case UDP:
		return 17
	case SCTP:
		return 132
	}
	return 0
}

func protocolOfNumber(n byte) Protocol {
	for _, p := range protocols {
		if protocolNumber(p) == n {
			return p
		}
	}
	return 0
}

// setID names one set or map of a family's table (tableDecls), whatever the
// generation. A pick's set is no setID: its elements carry their pick.
type setID uint8

// setNames are the names of the sets by setID; formats their layout per
// family, as tableDecls declares them.
var (
	setNames []string
	setIDs   = map[string]setID{}
	formats  [2][]setFormat
)

func init() {
	for fi := range families {
		for _, d := range declared[fi] {
			if _, known := setIDs[d.name]; !known {
				setIDs[d.name] = setID(len(setNames))
				setNames = append(setNames, d.name)
			}
			formats[fi] = append(formats[fi], d.format())
			if int(setIDs[d.name]) != len(formats[fi])-1 {
				panic("datapath: the families' tables list their sets in different orders")
			}
		}
	}
}

// sets are the setIDs of the sets elements are made for.
var sets struct {
	noEndpointFrontends, noEndpointNodePorts, clusterIPs, nodePortAddresses,
	localEndpoints, hairpin, serviceCIDRs, clusterCIDRs, firewallFrontends,
	firewallAllow, firewallAllowLocal, masqueradeFrontends, masqueradeNodePorts,
	localFrontends, localNodePorts, flowTTLs, flowSenders setID
}

func init() {
	for _, s := range []struct {
		id   *setID
		name string
	}{
		{&sets.noEndpointFrontends, noEndpointFrontendsSet}, {&sets.noEndpointNodePorts, noEndpointNodePortsSet},
		{&sets.clusterIPs, clusterIPsSet}, {&sets.nodePortAddresses, nodePortAddressesSet},
		{&sets.localEndpoints, localEndpointsSet}, {&sets.hairpin, hairpinSet},
		{&sets.serviceCIDRs, serviceCIDRsSet}, {&sets.clusterCIDRs, clusterCIDRsSet},
		{&sets.firewallFrontends, firewallFrontendsSet}, {&sets.firewallAllow, firewallAllowSet},
		{&sets.firewallAllowLocal, firewallAllowLocalSet}, {&sets.masqueradeFrontends, masqueradeFrontendsSet},
		{&sets.masqueradeNodePorts, masqueradeNodePortsSet}, {&sets.localFrontends, localFrontendsSet},
		{&sets.localNodePorts, localNodePortsSet}, {&sets.flowTTLs, flowTTLsSet}, {&sets.flowSenders, flowSendersSet},
	} {
		*s.id = setOf(s.name)
	}
	for _, k := range frontendKinds {
		k.frontendsSet = setOf(k.frontends)
		for i, p := range protocols {
			k.backendsSet[i] = setOf(k.backends(p))
		}
	}
}

// setOf is the setID of a set of tableDecls.
func setOf(name string) setID {
	id, ok := setIDs[name]
	if !ok {
		panic("datapath: no set " + name)
	}
	return id
}

func (s setID) String() string { return setNames[s] }

// setFormat is how the kernel holds one set's elements: the fields of the
// key and, for a map, of the value or a verdict.
type setFormat struct {
	key, value []fieldKind
	verdict    bool
	// interval: only nft writes the set; its last address field is a
	// prefix, and a TTL field a range.
	interval bool
}

type fieldKind int

const (
	addr4Field fieldKind = iota + 1
	addr6Field
	protoField   // inet_proto: one byte
	serviceField // inet_service: two bytes, network order
	integerField // numgen's result: 32 bits, host order
	ttlField     // the TTL or hop limit: one byte
)

// text renders fields laid out as kinds in nft syntax ("10.96.0.1 . tcp .
// 80"); interval says they are an interval set's.
func (f fields) text(kinds []fieldKind, interval bool) string {
	var sb strings.Builder
	b := f.bytes()
	for i, k := range kinds {
		if i > 0 {
			sb.WriteString(" . ")
		}
		var n int
		switch k {
		case addr4Field, addr6Field:
			n = 4
			if k == addr6Field {
				n = 16
			}
			a, _ := netip.AddrFromSlice(b[:n])
			if interval && i == len(kinds)-1 {
				bits := int(b[n])
				n++
				sb.WriteString(prefixString(netip.PrefixFrom(a, bits)))
				break
			}
			sb.WriteString(a.String())
		case protoField:
			sb.WriteString(protocolOfNumber(b[0]).String())
			n = 1
		case serviceField:
			sb.WriteString(strconv.Itoa(int(binary.BigEndian.Uint16(b))))
			n = 2
		case integerField:
			sb.WriteString(strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b)), 10))
			n = 4
		case ttlField:
			low, high := b[0], b[1]
			sb.WriteString(strconv.Itoa(int(low)))
			if high != low {
				sb.WriteString("-" + strconv.Itoa(int(high)))
			}
			n = 2
		}
		b = b[(n+3)&^3:]
	}
	return sb.String()
}

// keyText and valueText render the element in nft syntax.
func (e element) keyText() string {
	format := e.format()
	return e.key.text(format.key, format.interval)
}

func (e element) valueText() string {
	format := e.format()
	switch {
	case e.value.n == 0:
		return ""
	case format.verdict:
		return "goto " + e.verdictChain()
	}
	return e.value.fields().text(format.value, false)
}

// verdictChain is the chain a frontends map's value goes to.
func (e element) verdictChain() string {
	b := e.value.bytes()
	return affinityChain(binary.BigEndian.Uint32(b), b[4] == 1)
}

// object renders the element for generation g's set, for nft.
func (e element) object(g generation) *knftables.Element {
	el := &knftables.Element{Key: []string{e.keyText()}}
	switch {
	case e.pick.exists():
		el.Set = g.of(e.pick.set())
	case e.value.n == 0:
		el.Set = g.of(e.set.String())
	default:
		el.Map = g.of(e.set.String())
		el.Value = []string{e.valueText()}
	}
	return el
}

// String is the element as nft reads it, for logs and tests.
func (e element) String() string {
	s := fmt.Sprintf("%s %s { %s", e.family(), e.set, e.keyText())
	if v := e.valueText(); v != "" {
		s += " : " + v
	}
	return s + " }"
}
