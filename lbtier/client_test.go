package lbtier

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/dial"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// targetsReplica is a server replica that refuses watches as not current,
// or sends targets at revision.
type targetsReplica struct {
	weirv1.UnimplementedLoadBalancerTierServiceServer
	notCurrent bool
	revision   uint64
	watches    chan *weirv1.WatchTargetsRequest
}

func (r *targetsReplica) WatchTargets(req *weirv1.WatchTargetsRequest, stream weirv1.LoadBalancerTierService_WatchTargetsServer) error {
	r.watches <- req
	if r.notCurrent {
		return status.Error(codes.Unavailable, dial.NotCurrent+": lost the store")
	}
	if err := stream.Send(&weirv1.WatchTargetsResponse{Revision: r.revision}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func serveTargets(t *testing.T, r *targetsReplica) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.watches = make(chan *weirv1.WatchTargetsRequest, 8)
	g := grpc.NewServer()
	weirv1.RegisterLoadBalancerTierServiceServer(g, r)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestFollowMovesToTheNextReplicaWhenItsIsNotCurrent: the speaker takes
// its targets from the next replica when its own refuses as not current.
func TestFollowMovesToTheNextReplicaWhenItsIsNotCurrent(t *testing.T) {
	stale, current := &targetsReplica{notCurrent: true}, &targetsReplica{revision: 7}
	addrStale, addrCurrent := serveTargets(t, stale), serveTargets(t, current)
	var conn *dial.Servers
	for conn == nil || conn.Current() != addrStale { // each client starts at random
		if conn != nil {
			conn.Close()
		}
		var err error
		if conn, err = dial.NewServers(addrStale+","+addrCurrent, nil); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.Close()
	sp := New(Config{Name: "lb1"}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Follow(ctx, conn, sp, slog.New(slog.DiscardHandler)); close(done) }()
	defer func() { cancel(); <-done }()

	if w := <-stale.watches; w.GetSpeaker() != "lb1" || w.GetAcceptStale() {
		t.Errorf("watch on the replica not current: %v", w)
	}
	deadline := time.Now().Add(time.Second)
	for {
		sp.mu.Lock()
		revision := sp.revision
		sp.mu.Unlock()
		if revision == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no targets from the current replica a second after the other refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w := <-current.watches; w.GetAcceptStale() {
		t.Errorf("watch on the current replica asks for stale targets: %v", w)
	}
}

// A pool's attributes reach each target as the server sends them: local
// preference, standard and large communities.
func TestTargetsKeepThePoolsAttributes(t *testing.T) {
	got := TargetsFromProto([]*weirv1.VipTargets{{Address: "203.0.113.5", Service: "shop/web", Communities: []uint32{64500<<16 | 1},
		LargeCommunities: []*weirv1.LargeCommunity{{GlobalAdmin: 4200000001, LocalData1: 1, LocalData2: 4294967295}}, LocalPreference: 4000000000,
		Targets: []*weirv1.Target{{Node: "node1", Address: "192.0.2.11", HealthCheckPort: 10256}}}}, slog.Default())
	want := bgpcommunity.Large{Global: 4200000001, Local1: 1, Local2: 4294967295}
	if len(got) != 1 || len(got[0].LargeCommunities) != 1 || got[0].LargeCommunities[0] != want || got[0].LocalPref != 4000000000 ||
		len(got[0].Communities) != 1 || got[0].Communities[0] != 64500<<16|1 {
		t.Errorf("targets %+v; want one with 64500:1, %v and local preference 4000000000", got, want)
	}
}
