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
