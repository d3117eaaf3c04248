package agentsync

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/l2owner"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// An agent that stops reading its Leases stream, and then goes away,
// leaves nothing of the stream behind on the server: not the handler
// blocked sending an answer the agent does not read, not a receive pump
// holding an ask that nobody takes any more.
func TestALeasesStreamWhoseAgentStopsReadingLeavesNoGoroutine(t *testing.T) {
	reg := registrytest.Open(t)
	if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: "n1"}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}); err != nil {
		t.Fatal(err)
	}
	owners := l2owner.NewOwners(clock.RealClock{}, 10*time.Second, time.Second, slog.New(slog.DiscardHandler), nil)
	leadCtx, stopLeading := context.WithCancel(context.Background())
	led := make(chan struct{})
	go func() { owners.Lead(leadCtx, nil); close(led) }()
	defer func() { stopLeading(); <-led }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if s, err := owners.Open("probe", false); err == nil {
			s.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the owners never lead")
		}
	}

	h := New(reg, Config{L2: owners})
	hubCtx, stopHub := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { h.Run(hubCtx); close(ran) }()
	defer func() { stopHub(); <-ran }()
	// The server takes every ask the agent sends; the agent's window
	// (64 KiB, no growth) is what fills.
	srv := grpc.NewServer(grpc.InitialWindowSize(8<<20), grpc.InitialConnWindowSize(8<<20))
	weirv1.RegisterAgentServiceServer(srv, h)
	defer srv.Stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := weirv1.NewAgentServiceClient(conn)

	// A first stream that ends cleanly: the connection's own goroutines
	// are up before the count starts.
	warm, err := client.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Send(&weirv1.LeasesRequest{NodeName: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := warm.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := warm.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := warm.Recv(); err != nil {
			break
		}
	}
	before := goleak.IgnoreCurrent()

	ctx, goAway := context.WithCancel(context.Background())
	defer goAway()
	stream, err := client.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Asks, none of whose answers is read: the server blocks sending one,
	// and its pump fills with the asks after it.
	for seq := range uint64(20000) {
		if err := stream.Send(&weirv1.LeasesRequest{NodeName: "n1", Sequence: seq + 1}); err != nil {
			t.Fatal(err)
		}
	}
	blocked := func() bool {
		if !blockedAnswering() {
			return false
		}
		time.Sleep(50 * time.Millisecond) // still there: blocked, not passing through
		return blockedAnswering()
	}
	for deadline := time.Now().Add(10 * time.Second); !blocked(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server never blocked answering the agent that does not read: the case was not made")
		}
	}
	goAway()
	goleak.VerifyNone(t, before)
}

// blockedAnswering says whether a Leases handler is sending an answer.
func blockedAnswering() bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "agentsync.(*Hub).Leases") && strings.Contains(g, "SendMsg") {
			return true
		}
	}
	return false
}

// What a node can answer for is read whole when sent, and its absence
// leaves the last one standing; an address that is none is refused,
// naming the field.
func TestAskedOfReadsWhatTheNodeCanAnswerFor(t *testing.T) {
	asked, err := askedOf("node1", &weirv1.LeasesRequest{NodeName: "node1"})
	if err != nil || asked.HasAnswerable {
		t.Fatalf("an ask without the field: %+v %v", asked, err)
	}
	asked, err = askedOf("node1", &weirv1.LeasesRequest{Answerable: &weirv1.L2Answerable{}})
	if err != nil || !asked.HasAnswerable || len(asked.Answerable) != 0 {
		t.Fatalf("an empty set: %+v %v", asked, err)
	}
	asked, err = askedOf("node1", &weirv1.LeasesRequest{Answerable: &weirv1.L2Answerable{Addresses: []string{"192.0.2.200", "2001:db8::1"}}})
	if err != nil || len(asked.Answerable) != 2 {
		t.Fatalf("two addresses: %+v %v", asked, err)
	}
	_, err = askedOf("node1", &weirv1.LeasesRequest{Answerable: &weirv1.L2Answerable{Addresses: []string{"192.0.2.200", "fe80::1%eth0"}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `answerable.addresses[1]: "fe80::1%eth0" is not an IP address`) {
		t.Fatalf("an address with a zone: %v", err)
	}
}
