// Package notify wakes every waiter of a change at once: a channel that
// is closed, and replaced, at each change. The store revision, the hub's
// cache version, the agents' status and the speakers' reports each have
// one.
package notify

import (
	"context"
	"sync"
)

// Signal announces changes to whatever state its owner keeps. The zero
// Signal is ready to use. A waiter takes Changed before it reads the
// state it waits on: a change made after that read closes the channel
// the waiter holds, so no change is missed.
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// Changed returns a channel closed at the next Broadcast.
func (s *Signal) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Broadcast wakes everyone holding a channel from Changed. The owner
// calls it after the change is visible to readers.
func (s *Signal) Broadcast() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// Wait returns once ready reports true, checking it first and again after
// every change, or ctx's error when ctx ends first.
func (s *Signal) Wait(ctx context.Context, ready func() bool) error {
	for {
		changed := s.Changed()
		if ready() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
