// Command kubepath measures the Kubernetes path end to end: EndpointSlice
// updates applied to a real kube-apiserver, mirrored by weir-server's
// Kubernetes source, streamed to an agent. It reports the time from the
// apiserver accepting each update to the agent receiving it.
//
//	go run ./test/bench/kubepath -updates 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/test/kubeapi"
)

func main() {
	updates := flag.Int("updates", 1000, "EndpointSlice updates")
	minSync := flag.Duration("min-sync-period", 50*time.Millisecond, "the server's --min-sync-period")
	flag.Parse()
	if err := run(*updates, *minSync); err != nil {
		fmt.Fprintln(os.Stderr, "kubepath:", err)
		os.Exit(1)
	}
}

func run(updates int, minSync time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster, err := kubeapi.Start(ctx)
	if err != nil {
		return err
	}
	defer cluster.Close()
	rc, err := kubernetes.RestConfig(cluster.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 1000, 1000
	kc, err := clientset.NewForConfig(rc)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "weir-kubepath-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := server.New(server.Config{DataDir: dir, Log: slog.New(slog.DiscardHandler), MinSyncPeriod: minSync,
		Kubernetes: &kubernetes.Config{Kubeconfig: cluster.Kubeconfig, Classes: kubernetes.Classes{Default: true}}})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(ctx, lis)

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := kc.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	slice := func(i int) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+i>>16, (i>>8)&255, i&255)}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
		}
	}
	created, err := kc.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(0), metav1.CreateOptions{})
	if err != nil {
		return err
	}

	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond) // let the source mirror the node

	// The agent: records when each endpoint address first arrives.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := weirv1.NewAgentServiceClient(conn).Sync(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "node1"}}}); err != nil {
		return err
	}
	var mu sync.Mutex
	seen := map[string]time.Time{}
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			for _, s := range msg.GetUpserts() {
				for _, p := range s.GetPorts() {
					for _, e := range p.GetEndpoints() {
						if _, ok := seen[e.GetAddress()]; !ok {
							seen[e.GetAddress()] = now
						}
					}
				}
			}
			mu.Unlock()
			stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: msg.GetVersion()}}})
		}
	}()
	wait := func(addr string, limit time.Duration) (time.Time, error) {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			mu.Lock()
			at, ok := seen[addr]
			mu.Unlock()
			if ok {
				return at, nil
			}
			time.Sleep(200 * time.Microsecond)
		}
		return time.Time{}, fmt.Errorf("%s never reached the agent", addr)
	}
	if _, err := wait("10.100.0.0", 30*time.Second); err != nil {
		return err
	}

	var lat []time.Duration
	rv := created.ResourceVersion
	for i := 1; i <= updates; i++ {
		s := slice(i)
		s.ResourceVersion = rv
		// Timed from before the call: an upper bound on "from acceptance".
		sent := time.Now()
		got, err := kc.DiscoveryV1().EndpointSlices("default").Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		rv = got.ResourceVersion
		at, err := wait(s.Endpoints[0].Addresses[0], 10*time.Second)
		if err != nil {
			return err
		}
		lat = append(lat, at.Sub(sent))
	}
	slices.Sort(lat)
	q := func(p int) time.Duration { return lat[min(len(lat)-1, len(lat)*p/100)].Round(100 * time.Microsecond) }
	fmt.Printf("%d EndpointSlice updates (back to back, min-sync-period %v): update sent to the apiserver -> agent received: p50 %v  p90 %v  p99 %v  max %v\n",
		len(lat), minSync, q(50), q(90), q(99), lat[len(lat)-1].Round(100*time.Microsecond))
	return nil
}

func ptr[T any](v T) *T { return &v }
