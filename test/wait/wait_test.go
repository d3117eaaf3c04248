package wait

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records a failure instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func TestFor(t *testing.T) {
	calls := 0
	For(t, time.Second, "the third call", func() error {
		if calls++; calls < 3 {
			return errors.New("not the third")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("%d calls, want 3", calls)
	}

	r := &recorder{TB: t}
	start := time.Now()
	func() {
		defer func() {
			if p := recover(); p != r {
				panic(p)
			}
		}()
		For(r, 100*time.Millisecond, "never", func() error { return errors.New("no") })
	}()
	if !strings.HasPrefix(r.failed, "never: still failing after 100ms: no") || time.Since(start) < 100*time.Millisecond {
		t.Errorf("a check that never holds: failed %q after %v; want a failure after 100 ms", r.failed, time.Since(start))
	}
}
