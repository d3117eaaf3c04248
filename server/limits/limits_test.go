package limits_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/limits"
	"github.com/weirlb/weir/server/servertest"
)

func start(t *testing.T, cfg limits.Config) *servertest.Server {
	t.Helper()
	return servertest.Start(t, t.TempDir(), func(c *server.Config) { c.Limits = cfg })
}

// A caller looping as fast as it can is held to its rate.
func TestCallsAreRateLimitedPerCaller(t *testing.T) {
	ts := start(t, limits.Config{CallsPerSecond: 20, Burst: 20})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	calls := 0
	for ctx.Err() == nil {
		if _, err := ts.Registry.ListServices(ctx, &weirv1.ListServicesRequest{}); err == nil {
			calls++
		}
	}
	// 20 at once, then 20 a second: about 40 in a second; unlimited, this
	// loop makes thousands.
	if calls > 50 {
		t.Errorf("%d calls in a second at 20 a second with a burst of 20", calls)
	}
	if calls < 5 {
		t.Errorf("only %d calls in a second: the burst was not served", calls)
	}
}

func TestWatchesPerCallerAreBounded(t *testing.T) {
	ts := start(t, limits.Config{MaxWatchesPerCaller: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cancels []context.CancelFunc
	open := func() error {
		wctx, wcancel := context.WithCancel(ctx)
		cancels = append(cancels, wcancel)
		w, err := ts.Registry.WatchServices(wctx, &weirv1.WatchServicesRequest{})
		if err != nil {
			return err
		}
		_, err = w.Recv() // the initial state, or the refusal
		return err
	}
	for i := range 3 {
		if err := open(); err != nil {
			t.Fatalf("watch %d: %v", i+1, err)
		}
	}
	if err := open(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a fourth watch: %v; want ResourceExhausted", err)
	}
	cancels[0]()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := open()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after one watch closed, a new one: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A connection that never says anything is closed after the handshake
// timeout instead of being held (gRPC's default is two minutes).
func TestSilentConnectionsAreClosed(t *testing.T) {
	ts := start(t, limits.Config{HandshakeTimeout: 500 * time.Millisecond})
	c, err := net.Dial("tcp", ts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("a silent connection was still open after 5 s")
			}
			return
		}
	}
}

// A speaker's reports are its state: they are never held to the
// operators' rate, which would leave its status stale.
func TestSpeakerReportsAreNotRateLimited(t *testing.T) {
	ts := start(t, limits.Config{CallsPerSecond: 1, Burst: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lb := weirv1.NewLoadBalancerTierServiceClient(ts.Conn)
	start := time.Now()
	for i := range 20 {
		if _, err := lb.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: "lb1"}}); err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("20 reports took %v at an operators' rate of 1 a second; they must not wait for it", d)
	}
}
