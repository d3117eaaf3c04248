// Package iprange turns address ranges into CIDR prefixes and back, and
// counts what a range holds.
package iprange

import (
	"encoding/binary"
	"net/netip"
)

// Last is the last address of p.
func Last(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Prefixes are the fewest prefixes that together hold the addresses from
// first to last (same family, first <= last), in order.
func Prefixes(first, last netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for a := first; a.IsValid() && a.Compare(last) <= 0; {
		// The shortest prefix that starts at a and ends by last.
		bits := a.BitLen()
		for bits > 0 {
			p := netip.PrefixFrom(a, bits-1)
			if p.Masked().Addr() != a || Last(p).Compare(last) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(a, bits)
		out = append(out, p)
		a = Last(p).Next()
	}
	return out
}

// EndingIn0Or255 counts the IPv4 addresses from first to last whose last
// byte is 0 or 255: those a pool that avoids "buggy" addresses (MetalLB's
// avoidBuggyIPs) does not give out. Counted, not listed.
func EndingIn0Or255(first, last netip.Addr) int64 {
	f, l := int64(binary.BigEndian.Uint32(first.AsSlice())), int64(binary.BigEndian.Uint32(last.AsSlice()))
	// upTo counts the numbers in [0, n] that are rest modulo 256.
	upTo := func(n, rest int64) int64 {
		if n < rest {
			return 0
		}
		return (n-rest)/256 + 1
	}
	var n int64
	for _, rest := range []int64{0, 255} {
		n += upTo(l, rest) - upTo(f-1, rest)
	}
	return n
}
