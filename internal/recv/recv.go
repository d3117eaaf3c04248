// Package recv turns a gRPC stream's blocking Recv into channels a
// session's select can wait on beside its timers and its context.
package recv

import (
	"context"
	"errors"
	"io"
)

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

// SendError is the error to report for a failed Send on a stream whose
// Recv Pump reports on msgs and errs. gRPC's Send fails with a bare io.EOF
// once the server has ended the stream: the status the server ended it
// with (Unauthenticated to a certificate without its node token,
// PermissionDenied to a node acting for another) comes only from Recv, so
// it is taken from errs, past the messages still unread (finite: the
// stream has ended). Any other error is returned as it is.
func SendError[T any](ctx context.Context, err error, msgs <-chan T, errs <-chan error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	for {
		select {
		case rerr := <-errs:
			return rerr
		case <-msgs:
		case <-ctx.Done():
			return err
		}
	}
}
