// Package wait is the tests' one way to wait until something holds: a
// check retried, then the test failed with what was awaited and why it
// still did not hold.
package wait

import (
	"testing"
	"time"
)

// For calls check until it returns nil, for at most within; past it the
// test fails with what and check's last error. It retries every 1/200 of
// within, at least 5 ms and at most 50 ms apart, so that a check that
// sends packets does not load a busy machine.
func For(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	interval := min(max(within/200, 5*time.Millisecond), 50*time.Millisecond)
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, within, err)
		}
		time.Sleep(interval)
	}
}

// Until is For with a condition that says nothing of why it does not hold.
func Until(t testing.TB, within time.Duration, what string, ok func() bool) {
	t.Helper()
	For(t, within, what, func() error {
		if !ok() {
			return errNotYet
		}
		return nil
	})
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}
