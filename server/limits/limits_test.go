package limits_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/bounded"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/certs"
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

// A caller's unary calls in flight (read, waiting for the rate limiter, or
// running) are bounded; the next is refused from its headers, and another
// caller is not held up.
func TestCallsInFlightAreBoundedPerCaller(t *testing.T) {
	dir := servertest.PKI(t)
	ts := servertest.Start(t, t.TempDir(), servertest.TLS(t, dir), func(c *server.Config) {
		c.Limits = limits.Config{CallsPerSecond: 0.001, Burst: 1, MaxCallsInFlightPerCaller: 4}
	})
	viewer := weirv1.NewRegistryServiceClient(servertest.Dial(t, ts.Addr, dir, "victor"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The burst's one call, then calls that wait for the rate limiter.
	if _, err := viewer.ListServices(ctx, &weirv1.ListServicesRequest{}); err != nil {
		t.Fatal(err)
	}
	// Without a deadline a call waits for the rate limiter (with one it
	// would be refused at once, as it could not be served in time).
	parked, release := context.WithCancel(context.Background())
	defer release()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			viewer.ListServices(parked, &weirv1.ListServicesRequest{})
		}()
	}
	// call makes one more call, given a second to be refused.
	call := func() error {
		cctx, ccancel := context.WithCancel(context.Background())
		defer ccancel()
		stop := time.AfterFunc(time.Second, ccancel)
		defer stop.Stop()
		_, err := viewer.ListServices(cctx, &weirv1.ListServicesRequest{})
		return err
	}
	// Once the four are in flight, the fifth is refused at once, naming
	// the limit.
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if err = call(); status.Code(err) == codes.ResourceExhausted {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "4 calls in flight") {
		t.Fatalf("a fifth call in flight: %v; want ResourceExhausted naming the limit of 4", err)
	}
	// Another caller is served.
	admin := weirv1.NewRegistryServiceClient(servertest.Dial(t, ts.Addr, dir, "alice"))
	if _, err := admin.ListServices(ctx, &weirv1.ListServicesRequest{}); err != nil {
		t.Fatalf("another caller: %v", err)
	}
	// When the parked calls end, their places are free again: a call is
	// admitted, and waits.
	release()
	wg.Wait()
	if err := call(); status.Code(err) != codes.Canceled {
		t.Fatalf("after the parked calls ended, a call: %v; want it admitted and waiting for the rate limiter (cancelled after a second)", err)
	}
}

// A certificate identity's connections are bounded: past the limit a new
// one is closed after its handshake; another identity still connects, and
// one closed makes room.
func TestConnectionsAreBoundedPerCaller(t *testing.T) {
	dir := servertest.PKI(t)
	ts := servertest.Start(t, t.TempDir(), servertest.TLS(t, dir), func(c *server.Config) {
		c.Limits = limits.Config{MaxConnectionsPerCaller: 3}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(conn *grpc.ClientConn) error {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		_, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	var conns []*grpc.ClientConn
	for i := range 3 {
		conns = append(conns, servertest.Dial(t, ts.Addr, dir, "victor"))
		if err := call(conns[i]); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	fourth := servertest.Dial(t, ts.Addr, dir, "victor")
	if err := call(fourth); status.Code(err) != codes.Unavailable {
		t.Fatalf("a fourth connection of one caller: %v; want it closed (Unavailable)", err)
	}
	if err := call(servertest.Dial(t, ts.Addr, dir, "alice")); err != nil {
		t.Fatalf("another caller's connection: %v", err)
	}
	// The agents' shared certificate is one caller per address: each
	// node's agent connects.
	for _, from := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		local := &net.TCPAddr{IP: net.ParseIP(from)}
		dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: local}).DialContext(ctx, "tcp", addr)
		})
		if err := call(servertest.Dial(t, ts.Addr, dir, certs.FleetAgentName, dialer)); err != nil {
			t.Fatalf("the fleet agent certificate from %s: %v", from, err)
		}
	}
	conns[0].Close()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = call(fourth); err == nil {
			return
		}
	}
	t.Fatalf("after one connection closed, a new one: %v", err)
}

// The attack that once took the server from 44 MiB to 2.7 GiB: one viewer
// certificate, 4 connections × 128 concurrent requests of 3.5 MB each,
// looping. The server's heap must stay within what the limits allow (8
// requests in flight, each read and decoded), and another caller must be
// answered meanwhile.
func TestOneCallerCannotTakeTheServersMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("sends gigabytes over loopback")
	}
	dir := servertest.PKI(t)
	ts := servertest.Start(t, t.TempDir(), servertest.TLS(t, dir))
	req, err := proto.Marshal(&weirv1.GetServiceRequest{Namespace: "default", Name: strings.Repeat("a", 3_500_000)})
	if err != nil {
		t.Fatal(err)
	}
	admin := weirv1.NewStatusServiceClient(servertest.Dial(t, ts.Addr, dir, "alice"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.GetServerInfo(ctx, &weirv1.GetServerInfoRequest{}); err != nil {
		t.Fatal(err)
	}

	runtime.GC()
	before := heapLive()
	peak := before
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			peak = max(peak, heapLive())
			time.Sleep(10 * time.Millisecond)
		}
	}()

	attack, stopAttack := context.WithTimeout(ctx, 4*time.Second)
	defer stopAttack()
	var wg sync.WaitGroup
	var refused, other atomic.Int64
	var firstOther atomic.Value
	for range 4 {
		conn := servertest.Dial(t, ts.Addr, dir, "victor", grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		for range 128 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for attack.Err() == nil {
					err := conn.Invoke(attack, "/weir.v1.RegistryService/GetService", rawRequest(req), &weirv1.GetServiceResponse{})
					switch {
					case status.Code(err) == codes.ResourceExhausted:
						refused.Add(1)
					case attack.Err() == nil && status.Code(err) != codes.DeadlineExceeded:
						other.Add(1)
						firstOther.CompareAndSwap(nil, status.Code(err).String()+" "+bounded.String(status.Convert(err).Message(), 200))
					}
				}
			}()
		}
	}
	// Another caller is answered during the attack.
	time.Sleep(time.Second)
	start := time.Now()
	if _, err := admin.GetServerInfo(ctx, &weirv1.GetServerInfoRequest{}); err != nil {
		t.Errorf("another caller during the attack: %v", err)
	}
	answered := time.Since(start)
	wg.Wait()
	stopSampling()
	<-sampled

	grew := float64(peak-before) / (1 << 20)
	t.Logf("live heap grew by %.0f MiB at most; %d calls refused for the in-flight limit, %d ended otherwise (%v); another caller answered in %v",
		grew, refused.Load(), other.Load(), firstOther.Load(), answered.Round(time.Millisecond))
	// 8 in flight × (3.5 MB read + 3.5 MB decoded) is 56 MB; the rest is
	// gRPC's buffer pools (measured: 88-104 MiB in all). Without the limit
	// it grew by 1.4 GiB in these 4 s.
	if grew > 256 {
		t.Errorf("one caller's requests grew the server's heap by %.0f MiB; want at most 256", grew)
	}
	if refused.Load() == 0 {
		t.Error("no call was refused for the in-flight limit")
	}
}

// heapLive is the heap the last collection found live: what the server
// holds, not garbage waiting for the next one.
func heapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// rawRequest is a request already encoded; rawCodec sends it as it is, so
// the attacking client holds one copy of it, not one per call.
type rawRequest []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return nil, fmt.Errorf("rawCodec marshals rawRequest only, not %T", v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
