package removal

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts ends with it: a stopped watch leaves
// none behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
