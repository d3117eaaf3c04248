package l2owner

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package starts (its controllers) ends with its
// context: none outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
