package lbtier

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts ends with it:
// none outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
