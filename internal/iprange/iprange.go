// Package iprange turns address ranges into CIDR prefixes and back.
package iprange

import "net/netip"

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
