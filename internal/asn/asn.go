// Package asn is the one rule of which AS numbers a speaker may take as
// its own or a router's: every layer (the API, the agent's and the
// speaker's flags) asks it.
package asn

import "fmt"

// Trans is the 2-byte ASN a 4-byte speaker puts where an old one expects
// its AS (RFC 6793): no AS of its own.
const Trans = 23456

// Validate checks an AS number: 1-4294967295 (4-byte ASNs, RFC 6793; 0 is
// reserved, RFC 7607), not AS_TRANS. A uint32 holds no more.
func Validate(a uint32) error {
	switch a {
	case 0:
		return fmt.Errorf("0 is reserved (RFC 7607): 1-4294967295")
	case Trans:
		return fmt.Errorf("23456 is AS_TRANS (RFC 6793), the stand-in for a 4-byte ASN, not an AS of its own")
	}
	return nil
}
