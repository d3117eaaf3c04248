package bgp

import (
	"testing"

	"go.uber.org/goleak"
)

// The announcer and the speaker (gobgp's server among them) stop with their
// contexts: no goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
