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
