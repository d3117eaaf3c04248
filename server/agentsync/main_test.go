package agentsync

import (
	"testing"

	"go.uber.org/goleak"
)

// The hub's goroutines (its fanout, a session's sender and reader) end
// with their contexts and streams: none outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
