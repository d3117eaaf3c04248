package flows

import (
	"testing"

	"go.uber.org/goleak"
)

// The prober's reader and the flow reporter end with their contexts: no
// goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
