package l2

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/utils/clock"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// floodingServer answers a node's first ask with "ask again", then with
// more answers than the asker's receive buffer holds, and ends the
// stream.
type floodingServer struct {
	weirv1.UnimplementedAgentServiceServer
	done chan struct{}
}

func (f *floodingServer) Leases(stream grpc.BidiStreamingServer[weirv1.LeasesRequest, weirv1.LeasesResponse]) error {
	defer close(f.done)
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&weirv1.LeasesResponse{Sequence: 0}); err != nil {
		return err
	}
	for range 64 {
		// An answer to an ask never made: the asker ignores it.
		if err := stream.Send(&weirv1.LeasesResponse{Sequence: 1 << 40}); err != nil {
			return err
		}
	}
	return nil
}

// gatedClock holds every Now after the first until gate is closed: the
// asker is then busy with an ask while answers keep arriving.
type gatedClock struct {
	clock.RealClock
	calls atomic.Int32
	gate  chan struct{}
}

func (c *gatedClock) Now() time.Time {
	if c.calls.Add(1) > 1 {
		<-c.gate
	}
	return c.RealClock.Now()
}

// A session that ends while answers are still arriving (here: the next
// ask fails, the server having closed the stream) leaves no goroutine
// behind, however many answers nobody reads any more.
func TestASessionThatEndsLeavesNoReceiverBehind(t *testing.T) {
	before := goleak.IgnoreCurrent()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	server := &floodingServer{done: make(chan struct{})}
	weirv1.RegisterAgentServiceServer(srv, server)
	go srv.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	clk := &gatedClock{gate: make(chan struct{})}
	leases := NewLeases(clock.RealClock{}, func(Owned) error { return nil })
	a := NewAsker(conn, "node1", leases, clk, slog.New(slog.DiscardHandler))

	ended := make(chan error, 1)
	go func() {
		_, err := a.session(context.Background(), true)
		ended <- err
	}()
	<-server.done
	// Every answer reaches the node while its asker is held in an ask.
	time.Sleep(300 * time.Millisecond)
	close(clk.gate)
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the session ended without an error on a closed stream")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end when its stream did")
	}
	conn.Close()
	srv.Stop()
	goleak.VerifyNone(t, before)
}
