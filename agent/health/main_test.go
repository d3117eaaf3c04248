package health

import (
	"testing"

	"go.uber.org/goleak"
)

// The health-check ports' listeners and connections close with the agent:
// no goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
