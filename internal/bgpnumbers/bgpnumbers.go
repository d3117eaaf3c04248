// Package bgpnumbers is the one home of a BGP session's numbers: which AS
// numbers a speaker may take as its own or a router's, and the timers a
// session has when nothing sets them. Every layer (the API, the flags,
// the speaker) asks it.
package bgpnumbers

import (
	"fmt"
	"time"
)

// ASTrans is the 2-byte ASN a 4-byte speaker puts where an old one
// expects its AS (RFC 6793): no AS of its own.
const ASTrans = 23456

// ValidateASN checks an AS number: 1-4294967295 (4-byte ASNs, RFC 6793;
// 0 is reserved, RFC 7607), not AS_TRANS. A uint32 holds no more.
func ValidateASN(a uint32) error {
	switch a {
	case 0:
		return fmt.Errorf("0 is reserved (RFC 7607): 1-4294967295")
	case ASTrans:
		return fmt.Errorf("23456 is AS_TRANS (RFC 6793), the stand-in for a 4-byte ASN, not an AS of its own")
	}
	return nil
}

// DefaultHoldTime is a session's hold time when none is set (RFC 4271's
// suggestion).
const DefaultHoldTime = 90 * time.Second

// DefaultConnectRetry is short, so a router that comes back is peered
// with at once: a node speaker only dials, so no collision of two dialling
// routers (what RFC 4271's 120 s avoids) can happen.
const DefaultConnectRetry = time.Second

// DynamicASN names a router's AS by its relation to the speaker's own
// (MetalLB's dynamicASN) instead of a number: for a router whose AS
// differs from rack to rack, one peer configuration serves every node.
type DynamicASN string

const (
	// Internal: the router is in the speaker's own AS (iBGP).
	Internal DynamicASN = "internal"
	// External: the router is in the AS its OPEN says, which the speaker
	// takes as it comes.
	External DynamicASN = "external"
)

// ValidateDynamicASN checks a dynamic ASN: "internal" or "external".
func ValidateDynamicASN(d DynamicASN) error {
	if d != Internal && d != External {
		return fmt.Errorf("%q is not a dynamic AS: \"internal\" or \"external\"", string(d))
	}
	return nil
}

// RemoteAS is the AS a speaker of AS local expects a router to say: asn
// when set, local for an internal router, and 0 (whatever its OPEN says)
// for an external one.
func RemoteAS(asn uint32, dynamic DynamicASN, local uint32) uint32 {
	switch {
	case asn != 0:
		return asn
	case dynamic == Internal:
		return local
	}
	return 0
}
