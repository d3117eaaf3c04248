package notify

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// A waiter for version n returns once the version reaches n, however the
// changes interleave with its checks: none is lost between a waiter's
// read of the state and its wait.
func TestWaitSeesEveryChange(t *testing.T) {
	defer goleak.VerifyNone(t)
	var s Signal
	var version atomic.Uint64
	const waiters, last = 50, 2000
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := uint64(last * (i + 1) / waiters)
			if err := s.Wait(context.Background(), func() bool { return version.Load() >= want }); err != nil {
				t.Errorf("waiting for %d: %v", want, err)
			}
		}()
	}
	for range last {
		version.Add(1)
		s.Broadcast()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a waiter missed the change that satisfied it")
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	var s Signal
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- s.Wait(ctx, func() bool { return false }) }()
	s.Broadcast() // a change that does not satisfy it
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Wait returned %v, want %v", err, context.Canceled)
	}
}

func TestChangedIsClosedByTheNextBroadcastOnly(t *testing.T) {
	var s Signal
	s.Broadcast() // before anyone waits: nothing to wake, nothing kept
	ch := s.Changed()
	select {
	case <-ch:
		t.Fatal("closed before any change after it was taken")
	default:
	}
	s.Broadcast()
	select {
	case <-ch:
	default:
		t.Fatal("still open after a change")
	}
	if s.Changed() == ch {
		t.Fatal("the next waiter got the closed channel")
	}
}
