package agentsync

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// TestTheLockOrderHolds runs, at once, every path that takes two of the
// locks the Hub's and the Cache's comments order: registry changes queued
// under the registry's lock, batches worked out under it and applied to
// the cache, nodes forgotten as they are deleted, agents connecting to
// the cache under the hub's lock and leaving, their deltas built and
// encoded, status read and published, the replica losing and regaining
// the store, metrics scraped. A path that took two of them the other way
// round would sooner or later hold one while its counterpart holds the
// other: everything then stops, and the test says where.
func TestTheLockOrderHolds(t *testing.T) {
	reg := registrytest.Open(t)
	nodes := []string{"n1", "n2", "n3", "n4"}
	node := func(name string) *model.Node {
		return &model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	}
	service := func(i int) *model.Service {
		return &model.Service{Meta: model.Meta{Namespace: "shop", Name: fmt.Sprintf("s%d", i)}, Type: model.ClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	}
	for _, n := range nodes {
		if _, err := reg.Nodes.Create(node(n)); err != nil {
			t.Fatal(err)
		}
	}
	metrics := prometheus.NewRegistry()
	h := New(reg, Config{Metrics: metrics, RemovalLogLimit: 2})
	// Served as serve does, but a hub that stopped is not waited for:
	// the test reports where it stopped instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ran := make(chan struct{})
	go func() { h.Run(ctx); close(ran) }()
	defer func() {
		cancel()
		select {
		case <-ran:
		case <-time.After(5 * time.Second):
		}
	}()
	srv := grpc.NewServer()
	weirv1.RegisterAgentServiceServer(srv, h)
	defer srv.Stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := weirv1.NewAgentServiceClient(conn)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	repeat := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f(i)
			}
		}()
	}
	// Agents that connect (some of them to a replica that is not
	// current), take their first state and a delta or two, answer, leave.
	// Two per node: a stream also displaces its node's older one.
	for _, n := range append(nodes, nodes...) {
		repeat(func(i int) {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			stream, err := client.Sync(sctx)
			if err != nil {
				return
			}
			if stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: n, AcceptStale: i%2 == 0}}}) != nil {
				return
			}
			for range i % 3 {
				msg, err := stream.Recv()
				if err != nil {
					return
				}
				if stream.Send(ack(msg.GetVersion())) != nil {
					return
				}
			}
		})
	}
	// The registry: a node deleted (while its agent may be connected)
	// and registered again, services created and deleted.
	repeat(func(i int) {
		if i%2 == 0 {
			_, _ = reg.Nodes.Delete("n4", 0, model.SourceNative)
		} else {
			_, _ = reg.Nodes.Create(node("n4"))
		}
		if _, err := reg.Services.Create(service(i % 8)); err != nil {
			_, _ = reg.Services.Delete(fmt.Sprintf("shop/s%d", i%8), 0, model.SourceNative)
		}
		time.Sleep(time.Millisecond)
	})
	// The readers of the status, and a scrape.
	repeat(func(int) {
		h.Status()
		h.Progress()
		h.Applying(h.Version())
		h.LocalStatus()
		h.Connected()
		_ = h.CurrentErr(false)
		if _, err := metrics.Gather(); err != nil {
			t.Error(err)
		}
	})
	// Another replica's status, and the store lost and found again.
	repeat(func(i int) {
		if i%2 == 0 {
			h.SetRemoteStatus("n1", &observed.Node{Node: "n1", Connected: true})
			h.SetNotCurrent("the store is away")
		} else {
			h.SetRemoteStatus("n1", nil)
			h.SetNotCurrent("")
		}
		time.Sleep(time.Millisecond)
	})

	time.Sleep(2 * time.Second)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<22)
		t.Fatalf("the hub stopped: two locks taken in opposite orders?\n%s", buf[:runtime.Stack(buf, true)])
	}
}
