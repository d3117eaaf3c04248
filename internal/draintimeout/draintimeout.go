// Package draintimeout is the rule a drain's timeout is held to
// (weir.v1.DrainNodeRequest.drain_timeout), shared by the server, which
// enforces it, and lbctl, which checks it before asking. A leaf.
package draintimeout

import (
	"fmt"
	"time"
)

// Max is the longest deadline a drain may be given: a week, past which a
// drain is an outage plan rather than a maintenance window.
const Max = 7 * 24 * time.Hour

// Check says what is wrong with d as a drain's timeout, or nil; 0 means
// no deadline. As Kubernetes holds a grace period, a timeout is whole
// seconds and never negative.
func Check(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%v is negative: want 0 (no deadline) or whole seconds up to 7 days", d)
	case d%time.Second != 0:
		return fmt.Errorf("%v is not whole seconds", d)
	case d > Max:
		return fmt.Errorf("%v is more than 7 days (%v)", d, Max)
	}
	return nil
}
