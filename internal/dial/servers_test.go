package dial_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/certs"
)

// replica is a weir-server replica as the load-balancer tier sees it: it
// sends targets to a watch (or, when not current, refuses one that does not
// accept stale targets) and takes reports.
type replica struct {
	weirv1.UnimplementedLoadBalancerTierServiceServer
	addr       string
	g          *grpc.Server
	notCurrent atomic.Bool

	mu      sync.Mutex // guards the fields below
	watches []*weirv1.WatchTargetsRequest
	reports []string // the speakers that reported here
}

func (r *replica) WatchTargets(req *weirv1.WatchTargetsRequest, stream weirv1.LoadBalancerTierService_WatchTargetsServer) error {
	r.mu.Lock()
	r.watches = append(r.watches, req)
	r.mu.Unlock()
	if r.notCurrent.Load() && !req.GetAcceptStale() {
		return status.Error(codes.Unavailable, dial.NotCurrent+": the store is away")
	}
	if err := stream.Send(&weirv1.WatchTargetsResponse{Revision: 1}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (r *replica) ReportSpeaker(_ context.Context, req *weirv1.ReportSpeakerRequest) (*weirv1.ReportSpeakerResponse, error) {
	r.mu.Lock()
	r.reports = append(r.reports, req.GetStatus().GetName())
	r.mu.Unlock()
	return &weirv1.ReportSpeakerResponse{}, nil
}

// reported is the number of reports from speaker.
func (r *replica) reported(speaker string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.reports {
		if s == speaker {
			n++
		}
	}
	return n
}

// watched returns the accept_stale of each watch so far.
func (r *replica) watched() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []bool
	for _, w := range r.watches {
		out = append(out, w.GetAcceptStale())
	}
	return out
}

// startReplicas runs n replicas on loopback ports, with opts.
func startReplicas(t *testing.T, n int, opts ...grpc.ServerOption) []*replica {
	t.Helper()
	var out []*replica
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{addr: lis.Addr().String(), g: grpc.NewServer(opts...)}
		weirv1.RegisterLoadBalancerTierServiceServer(r.g, r)
		go r.g.Serve(lis)
		t.Cleanup(r.g.Stop)
		out = append(out, r)
	}
	return out
}

func list(rs []*replica) string {
	var addrs []string
	for _, r := range rs {
		addrs = append(addrs, r.addr)
	}
	return strings.Join(addrs, ",")
}

func newServers(t *testing.T, list string) *dial.Servers {
	t.Helper()
	s, err := dial.NewServers(list, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// follow is a speaker's client, as lbtier.Follow: it watches the targets
// and, on each new watch, reports once, through the same conn.
func follow(t *testing.T, conn grpc.ClientConnInterface, name string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	client := weirv1.NewLoadBalancerTierServiceClient(conn)
	go func() {
		defer close(done)
		retry := dial.NewReconnect(conn, time.Second)
		for ctx.Err() == nil {
			got, err := watchOnce(ctx, client, name, retry.AcceptStale(), retry.WaitForReady())
			wait := retry.Ended(err, got)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}()
}

func watchOnce(ctx context.Context, client weirv1.LoadBalancerTierServiceClient, name string, acceptStale, waitForReady bool) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.WatchTargets(ctx, &weirv1.WatchTargetsRequest{Speaker: name, AcceptStale: acceptStale}, grpc.WaitForReady(waitForReady))
	if err != nil {
		return false, err
	}
	if _, err := stream.Recv(); err != nil {
		return false, err
	}
	if _, err := client.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: name}}); err != nil {
		return true, err
	}
	_, err = stream.Recv()
	return true, err
}

// waitFor returns the first replica where speaker has reported, within limit.
func waitFor(t *testing.T, rs []*replica, speaker string, limit time.Duration) *replica {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for _, r := range rs {
			if r.reported(speaker) > 0 {
				return r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("speaker %s reported to no replica within %v", speaker, limit)
	return nil
}

// TestServersFailOverWithinASecond: the speaker watches one replica and
// reports there only; when that replica stops, it is on another within a
// second, and reports there.
func TestServersFailOverWithinASecond(t *testing.T) {
	rs := startReplicas(t, 3)
	follow(t, newServers(t, list(rs)), "lb1")
	first := waitFor(t, rs, "lb1", 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	for _, r := range rs {
		if r != first && (len(r.watched()) > 0 || r.reported("lb1") > 0) {
			t.Errorf("replica %s was called (watches %v, reports %d), want only %s", r.addr, r.watched(), r.reported("lb1"), first.addr)
		}
	}

	first.g.Stop()
	stopped := time.Now()
	var rest []*replica
	for _, r := range rs {
		if r != first {
			rest = append(rest, r)
		}
	}
	second := waitFor(t, rest, "lb1", time.Second)
	t.Logf("on %s %v after %s stopped", second.addr, time.Since(stopped).Round(time.Millisecond), first.addr)
}

// TestServersBackSoonAfterEveryReplicaWasAway: with every replica away
// for long enough that the waits reached their cap, the client is back
// within a second or so of one returning (streams to several replicas do
// not wait for a connection, so the client relies on its own retries).
func TestServersBackSoonAfterEveryReplicaWasAway(t *testing.T) {
	rs := startReplicas(t, 2)
	follow(t, newServers(t, list(rs)), "lb1")
	first := waitFor(t, rs, "lb1", 5*time.Second)
	for _, r := range rs {
		r.g.Stop()
	}
	time.Sleep(3 * time.Second)
	lis, err := net.Listen("tcp", first.addr)
	if err != nil {
		t.Fatal(err)
	}
	back := &replica{addr: first.addr, g: grpc.NewServer()}
	weirv1.RegisterLoadBalancerTierServiceServer(back.g, back)
	go back.g.Serve(lis)
	defer back.g.Stop()
	start := time.Now()
	waitFor(t, []*replica{back}, "lb1", 3*time.Second)
	t.Logf("back on %s %v after it listened again", back.addr, time.Since(start).Round(time.Millisecond))
}

// TestServersMoveOnFromAReplicaNotCurrent: a replica that refuses as not
// current sends the client straight on to another one.
func TestServersMoveOnFromAReplicaNotCurrent(t *testing.T) {
	rs := startReplicas(t, 3)
	s := newServers(t, list(rs))
	i := at(t, rs, s.Current())
	rs[i].notCurrent.Store(true)
	start := time.Now()
	follow(t, s, "lb1")
	if on := waitFor(t, rs, "lb1", time.Second); on == rs[i] {
		t.Errorf("on %s after it refused, want another replica", on.addr)
	}
	t.Logf("on the next replica after %v", time.Since(start).Round(time.Millisecond))
	if got := rs[i].watched(); len(got) != 1 || got[0] {
		t.Errorf("the replica not current saw watches with accept_stale %v, want one without", got)
	}
}

// TestServersAcceptStaleWhenNoReplicaIsCurrent: when every replica refused
// as not current, the next watch accepts stale targets, and gets them.
func TestServersAcceptStaleWhenNoReplicaIsCurrent(t *testing.T) {
	rs := startReplicas(t, 3)
	for _, r := range rs {
		r.notCurrent.Store(true)
	}
	s := newServers(t, list(rs))
	follow(t, s, "lb1")
	// Each replica refused one watch without accept_stale; the first of
	// the next round (in a new order) took one with it.
	i := at(t, rs, waitFor(t, rs, "lb1", 3*time.Second).addr)
	for j, r := range rs {
		want := []bool{false}
		if j == i {
			want = []bool{false, true}
		}
		if got := r.watched(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("replica %d saw watches with accept_stale %v, want %v", j, got, want)
		}
	}
}

// at is the index of the replica at addr.
func at(t *testing.T, rs []*replica, addr string) int {
	t.Helper()
	for i, r := range rs {
		if r.addr == addr {
			return i
		}
	}
	t.Fatalf("no replica at %s", addr)
	return -1
}

// TestServersDNSName: an entry may be a DNS name; its addresses are the
// replicas (localhost may also be ::1, where nothing listens: the client
// moves on).
func TestServersDNSName(t *testing.T) {
	rs := startReplicas(t, 1)
	_, port, _ := net.SplitHostPort(rs[0].addr)
	s := newServers(t, "localhost:"+port)
	if host, _, _ := net.SplitHostPort(s.Current()); net.ParseIP(host) == nil {
		t.Errorf("current %q, want an address of localhost", s.Current())
	}
	follow(t, s, "lb1")
	waitFor(t, rs, "lb1", 3*time.Second)
}

// TestServersCheckTheCertificateAgainstTheEntry: with TLS, a replica
// reached through a DNS name is checked against that name, and one given
// as an address against the address.
func TestServersCheckTheCertificateAgainstTheEntry(t *testing.T) {
	dir := t.TempDir()
	for _, err := range []error{certs.InitCA(dir), certs.IssueServer(dir, []string{"localhost"})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	tlsCfg, err := tlsconfig.Server(tlsconfig.Files{Cert: filepath.Join(dir, "server.crt"), Key: filepath.Join(dir, "server.key")})
	if err != nil {
		t.Fatal(err)
	}
	rs := startReplicas(t, 1, grpc.Creds(credentials.NewTLS(tlsCfg)))
	_, port, _ := net.SplitHostPort(rs[0].addr)
	report := func(entry string) error {
		src, err := tlsconfig.Load(tlsconfig.Files{CA: filepath.Join(dir, "ca.crt")}, tlsconfig.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := dial.NewServers(entry, src)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for s.Current() != rs[0].addr { // localhost may also be ::1
			s.Next()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = weirv1.NewLoadBalancerTierServiceClient(s).ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: "lb1"}})
		return err
	}
	if err := report("localhost:" + port); err != nil {
		t.Errorf("through localhost, with a certificate for localhost: %v", err)
	}
	if err := report(rs[0].addr); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("through %s, with a certificate for localhost only: %v, want a certificate error", rs[0].addr, err)
	}
}

// TestServersStartAtRandom: a rack's clients, all given the same list,
// spread over the replicas.
func TestServersStartAtRandom(t *testing.T) {
	rs := startReplicas(t, 3)
	for i := range 30 {
		s := newServers(t, list(rs))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := weirv1.NewLoadBalancerTierServiceClient(s).ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: "lb"}})
		cancel()
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	var counts []int
	used := 0
	for _, r := range rs {
		counts = append(counts, r.reported("lb"))
		if r.reported("lb") > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("30 clients reached %v of the replicas, want more than one used", counts)
	}
}

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "127.0.0.1:7443", want: "[127.0.0.1:7443]"},
		{in: "a.example:7443, [2001:db8::1]:7443,", want: "[a.example:7443 [2001:db8::1]:7443]"},
		{in: "a.example", wantErr: true},
		{in: "a.example:http", wantErr: true},
		{in: ":7443", wantErr: true},
		{in: " , ", wantErr: true},
	} {
		got, err := dial.ParseList(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && fmt.Sprint(got) != tc.want) {
			t.Errorf("ParseList(%q) = %v, %v; want %s (error: %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
