package l2

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/utils/clock"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/wait"
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

// handoverServer grants vip, and once the node says it is stopping keeps
// listing vip until hold is closed (the next owner is not ready yet),
// then drops it and records the release.
type handoverServer struct {
	weirv1.UnimplementedAgentServiceServer
	vip      string
	stopping chan struct{} // closed at the first stopping ask
	hold     chan struct{}
	released chan struct{} // closed when the node gives vip up
	closed   chan struct{}
}

func (h *handoverServer) Leases(stream grpc.BidiStreamingServer[weirv1.LeasesRequest, weirv1.LeasesResponse]) error {
	defer close(h.closed)
	lease := []*weirv1.L2Lease{{Address: h.vip, Epoch: 7}}
	sawStop, gone := false, false
	asks := make(chan *weirv1.LeasesRequest)
	go func() {
		defer close(asks)
		for {
			q, err := stream.Recv()
			if err != nil {
				return
			}
			asks <- q
		}
	}()
	hold := h.hold
	for {
		select {
		case q, ok := <-asks:
			if !ok {
				return nil
			}
			if q.GetStopping() && !sawStop {
				sawStop = true
				close(h.stopping)
			}
			for _, r := range q.GetReleased() {
				if r.GetAddress() == h.vip && !gone {
					gone = true
					close(h.released)
				}
			}
			out := &weirv1.LeasesResponse{Sequence: q.GetSequence(), Ttl: durationpb.New(2 * time.Second)}
			if hold != nil {
				out.Leases = lease
			}
			if err := stream.Send(out); err != nil {
				return err
			}
		case <-hold:
			// The next owner is ready: ask the node to ask.
			hold = nil
			if err := stream.Send(&weirv1.LeasesResponse{}); err != nil {
				return err
			}
		}
	}
}

// A stopping agent keeps answering for what the server still lists, and
// gives it up once the server drops it (the next owner can take it).
func TestAStoppingAgentAnswersUntilTheServerDropsTheAddress(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.200")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	h := &handoverServer{vip: vip.String(), stopping: make(chan struct{}), hold: make(chan struct{}),
		released: make(chan struct{}), closed: make(chan struct{})}
	weirv1.RegisterAgentServiceServer(srv, h)
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leases := NewLeases(clock.RealClock{}, func(Owned) error { return nil })
	a := NewAsker(conn, "node1", leases, clock.RealClock{}, slog.New(slog.DiscardHandler))
	a.ifaces = map[netip.Addr][]string{vip: {"eth0"}}

	ctx, stop := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		a.session(ctx, true)
	}()
	wait.Until(t, 5*time.Second, "the lease granted", func() bool { return leases.Valid(vip) })
	stop() // SIGTERM
	<-h.stopping
	for range 5 {
		time.Sleep(50 * time.Millisecond)
		if !leases.Valid(vip) {
			t.Fatal("the stopping agent stopped answering while the server still listed the address")
		}
	}
	close(h.hold)
	select {
	case <-h.released:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent did not give the address up once the server dropped it")
	}
	if leases.Valid(vip) {
		t.Error("the agent still answers after giving the address up")
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not end after the handover")
	}
}
