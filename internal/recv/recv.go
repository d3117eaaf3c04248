// Package recv turns a gRPC stream's blocking Recv into channels a
// session's select can wait on beside its timers and its context.
package recv

import "context"

// Pump calls recv until it fails, passing each message on through msgs
// (buffered by buffer) and the failure through errs (buffered: the pump
// never waits to report it). It stops, without waiting for a reader,
// as soon as ctx ends: a session that returns cancels ctx, and the
// stream's own context with it so that a blocked recv returns too, and
// leaves no goroutine behind. recv must return once ctx ends; a gRPC
// stream's Recv does when ctx is the stream's context or its parent.
func Pump[T any](ctx context.Context, recv func() (T, error), buffer int) (msgs <-chan T, errs <-chan error) {
	out, failed := make(chan T, buffer), make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, failed
}
