// Package bgpcommunity is BGP communities as operators write them, the one
// rule every layer (the API, the custom resources, the resources file, the
// admission webhook, lbctl) reads them by: standard communities (RFC 1997)
// as ASN:VALUE or a well-known name, and large communities (RFC 8092) as
// large:GLOBAL:LOCAL1:LOCAL2, MetalLB's spelling, in the same list.
package bgpcommunity

import (
	"fmt"
	"strconv"
	"strings"
)

// Large is a large community (RFC 8092): a global administrator, usually
// a 4-byte ASN, and two 32-bit values of its choosing.
type Large struct {
	Global uint32 `json:"global"`
	Local1 uint32 `json:"local1"`
	Local2 uint32 `json:"local2"`
}

// String writes l as Parse reads it.
func (l Large) String() string {
	return fmt.Sprintf("%s%d:%d:%d", largePrefix, l.Global, l.Local1, l.Local2)
}

// Community is one written community. BGP carries the two kinds in two
// path attributes (COMMUNITIES and LARGE_COMMUNITY), so a route's
// attributes keep them in two lists.
type Community struct {
	// Standard is ASN<<16 | VALUE when IsLarge is false.
	Standard uint32
	Large    Large
	IsLarge  bool
}

// String writes c as Parse reads it.
func (c Community) String() string {
	if c.IsLarge {
		return c.Large.String()
	}
	return FormatStandard(c.Standard)
}

// wellKnown are RFC 1997's and RFC 3765's names, as FRR and GoBGP spell
// them.
var wellKnown = []struct {
	name  string
	value uint32
}{
	{"no-export", 0xFFFFFF01}, {"no-advertise", 0xFFFFFF02}, {"no-export-subconfed", 0xFFFFFF03}, {"no-peer", 0xFFFFFF04},
}

const largePrefix = "large:"

// Spellings is what Parse reads, for error messages and documentation.
const Spellings = "ASN:VALUE (each 0-65535), large:GLOBAL:LOCAL1:LOCAL2 (each 0-4294967295), no-export, no-advertise, no-export-subconfed or no-peer"

// Parse reads a standard community "ASN:VALUE" (each 0-65535, also how
// MetalLB writes the well-known ones, 65535:65281 for no-export), a
// well-known community's name, or a large community
// "large:GLOBAL:LOCAL1:LOCAL2" (each 0-4294967295). Numbers are plain
// decimals without sign or leading zero, so each community has one
// spelling.
func Parse(s string) (Community, error) {
	for _, w := range wellKnown {
		if s == w.name {
			return Community{Standard: w.value}, nil
		}
	}
	if rest, ok := strings.CutPrefix(s, largePrefix); ok {
		parts := strings.Split(rest, ":")
		if len(parts) == 3 {
			g, err1 := parseNumber(parts[0], 32)
			l1, err2 := parseNumber(parts[1], 32)
			l2, err3 := parseNumber(parts[2], 32)
			if err1 == nil && err2 == nil && err3 == nil {
				return Community{Large: Large{Global: uint32(g), Local1: uint32(l1), Local2: uint32(l2)}, IsLarge: true}, nil
			}
		}
		return Community{}, fmt.Errorf("%q is not a large community (large:GLOBAL:LOCAL1:LOCAL2, each 0-4294967295)", s)
	}
	hi, lo, ok := strings.Cut(s, ":")
	a, err1 := parseNumber(hi, 16)
	b, err2 := parseNumber(lo, 16)
	if !ok || err1 != nil || err2 != nil {
		return Community{}, fmt.Errorf("%q is not a community (%s)", s, Spellings)
	}
	return Community{Standard: uint32(a)<<16 | uint32(b)}, nil
}

// parseNumber reads a decimal of at most bits bits with no sign and no
// leading zero.
func parseNumber(s string, bits int) (uint64, error) {
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	return strconv.ParseUint(s, 10, bits)
}

// FormatStandard writes a standard community as Parse reads it, a
// well-known one by its name.
func FormatStandard(c uint32) string {
	for _, w := range wellKnown {
		if w.value == c {
			return w.name
		}
	}
	return fmt.Sprintf("%d:%d", c>>16, c&0xFFFF)
}
