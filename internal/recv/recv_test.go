package recv

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Messages arrive in order, then the failure that ended the stream.
func TestPumpPassesMessagesThenTheFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	next := 0
	msgs, errs := Pump(context.Background(), func() (int, error) {
		if next == 3 {
			return 0, io.EOF
		}
		next++
		return next, nil
	}, 0)
	for want := 1; want <= 3; want++ {
		if got := <-msgs; got != want {
			t.Fatalf("message %d arrived as %d", want, got)
		}
	}
	if err := <-errs; !errors.Is(err, io.EOF) {
		t.Fatalf("the stream's end arrived as %v, want EOF", err)
	}
}

// A session that stops reading and cancels its context leaves no pump
// behind, even with a message in hand and nobody to take it: the pump an
// L2 asker once had waited for ever there.
func TestPumpEndsWithItsContextWhileHoldingAMessage(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	received := make(chan struct{})
	_, _ = Pump(ctx, func() (string, error) {
		select {
		case <-received:
			<-ctx.Done() // as a gRPC stream's Recv returns once its context ends
			return "", ctx.Err()
		default:
			close(received)
			return "grant", nil
		}
	}, 0)
	<-received
	time.Sleep(10 * time.Millisecond) // the pump now waits to hand "grant" on
	cancel()
}

// A Send that failed because the server ended the stream reports the
// status the server ended it with, which Recv alone returns.
func TestSendErrorIsTheServersStatus(t *testing.T) {
	refused := errors.New("rpc error: code = Unauthenticated desc = no node token")
	// Answers the session no longer reads come first.
	msgs, errs := make(chan int, 2), make(chan error, 1)
	msgs <- 1
	msgs <- 2
	go func() {
		for len(msgs) > 0 {
			time.Sleep(time.Millisecond)
		}
		errs <- refused
	}()
	if err := SendError(context.Background(), io.EOF, msgs, errs); err != refused {
		t.Errorf("Send's io.EOF reported as %v, want the stream's status %v", err, refused)
	}
	other := errors.New("message too large")
	if err := SendError(context.Background(), other, make(chan int), make(chan error)); err != other {
		t.Errorf("Send's own failure reported as %v, want it as it is", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := SendError(ctx, io.EOF, make(chan int), make(chan error)); !errors.Is(err, io.EOF) {
		t.Errorf("with the session over and no status: %v, want io.EOF", err)
	}
}
