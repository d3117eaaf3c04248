package agentsync_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/api"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/resourcewire"
	"github.com/weirlb/weir/server/store"
)

// benchNodes is how many nodes, each with its agent connected, the bench
// serves: few, so that what it measures is what grows with the services.
const benchNodes = 10

// benchService is service i and its endpoint slice, the agent's bench
// workload (agent/syncer): one TCP port, 10 ready endpoints spread over
// the nodes, and every hundredth a LoadBalancer with a node port and an
// address from a pool that limits its announcing nodes. variant changes
// the first endpoint's address: one endpoint changed.
func benchService(i, variant int) (*model.Service, *model.EndpointSlice) {
	addr := func(a, b, c, d int) netip.Addr { return netip.AddrFrom4([4]byte{byte(a), byte(b), byte(c), byte(d)}) }
	ip := func(base, n int) netip.Addr { return addr(base, n>>16&0xff, n>>8&0xff, n&0xff) }
	name := fmt.Sprintf("svc-%d", i)
	svc := &model.Service{Meta: model.Meta{Namespace: "bench", Name: name}, Type: model.ClusterIP,
		ClusterIPs:            []netip.Addr{addr(10, 96+((i+1)>>16), (i+1)>>8&0xff, (i+1)&0xff)}, // not the range's network address
		Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	if i%100 == 0 {
		svc.Type = model.LoadBalancer
		svc.Ports[0].NodePort = int32(30000 + i/100)
		svc.LoadBalancerIPs = []netip.Addr{ip(172, 16<<16+i/100)}
	}
	slice := &model.EndpointSlice{Meta: model.Meta{Namespace: "bench", Name: name + "-1"}, ServiceName: name,
		Ports: []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}}}
	for j := range 10 {
		a := ip(10, 16*i+j) // 10.0.0.0/8 holds 16 addresses per service up to a million
		if j == 0 && variant != 0 {
			a = ip(10, 16*i+10+variant)
		}
		slice.Endpoints = append(slice.Endpoints, model.Endpoint{Addresses: []netip.Addr{a}, NodeName: fmt.Sprintf("node%d", (i+j)%benchNodes)})
	}
	return svc, slice
}

// benchWorld is a registry on its own bbolt store holding n services,
// the hub fed by it, and an agent per node connected to the hub.
type benchWorld struct {
	dir    string
	st     *store.Bolt
	api    *api.RegistryService
	hub    *agentsync.Hub
	agents []*benchAgent
	stop   context.CancelFunc
	done   chan struct{} // closed when the hub and every session have returned
	// changes are the writes the bench makes in turn, next the next one:
	// kept across the sub-benchmark's runs, so that every write changes
	// the service it writes.
	changes []*weirv1.UpdateEndpointSliceRequest
	next    int
}

func newBenchWorld(b *testing.B, dir string, n int) *benchWorld {
	st, err := store.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	reg, err := registry.Open(st)
	if err != nil {
		b.Fatal(err)
	}
	w := &benchWorld{dir: dir, st: st, api: api.NewRegistryService(reg)}
	objs := []model.Object{&model.AddressPool{Meta: model.Meta{Name: "lb"},
		Ranges: []model.AddressRange{{First: netip.MustParseAddr("172.16.0.0"), Last: netip.MustParseAddr("172.16.255.255")}},
		BGP:    model.BGPAdvertisement{MaxAnnouncingNodes: 2}}}
	for k := range benchNodes {
		objs = append(objs, &model.Node{Meta: model.Meta{Name: fmt.Sprintf("node%d", k)}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + k)})}})
	}
	// In batches: one write per service would take an fsync each.
	const batch = 2000
	for i := range n {
		svc, slice := benchService(i, 0)
		objs = append(objs, svc, slice)
		if len(objs) >= batch || i == n-1 {
			if _, _, err := reg.Apply(objs, false); err != nil {
				b.Fatal(err)
			}
			objs = objs[:0]
		}
	}
	// The hub loads what the registry holds, as at a server's start.
	// MinSyncPeriod 0: every change is a round of its own, as a lone
	// change is with the server's default period.
	w.hub = agentsync.New(reg, agentsync.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	w.stop, w.done = cancel, make(chan struct{})
	running := make(chan struct{}, benchNodes+1)
	go func() { w.hub.Run(ctx); running <- struct{}{} }()
	for k := range benchNodes {
		a := newBenchAgent(ctx, fmt.Sprintf("node%d", k))
		w.agents = append(w.agents, a)
		go func() {
			if err := w.hub.Sync(&grpc.GenericServerStream[weirv1.SyncRequest, weirv1.SyncResponse]{ServerStream: a}); err != nil {
				a.failed <- err
			}
			running <- struct{}{}
		}()
	}
	go func() {
		for range benchNodes + 1 {
			<-running
		}
		close(w.done)
	}()
	w.waitAll(b, reg.Revision())
	// Changes to 256 services spread over the range, each there and
	// back.
	const spread = 256
	for variant := range 2 {
		for k := range spread {
			_, slice := benchService((k*7919)%n, 1-variant)
			w.changes = append(w.changes, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: resourcewire.EndpointSliceToProto(slice)})
		}
	}
	return w
}

// waitAll waits until every agent has been sent version rev.
func (w *benchWorld) waitAll(b *testing.B, rev uint64) {
	for _, a := range w.agents {
		for a.version < rev {
			select {
			case a.version = <-a.got:
			case err := <-a.failed:
				b.Fatalf("%s's stream: %v", a.node, err)
			case <-time.After(time.Minute):
				b.Fatalf("%s was not sent version %d (last %d)", a.node, rev, a.version)
			}
		}
	}
}

func (w *benchWorld) close(b *testing.B) {
	w.stop()
	<-w.done
	if err := w.st.Close(); err != nil {
		b.Error(err)
	}
	os.RemoveAll(w.dir) // the next world's setup needs the disk more
}

// benchAgent is one agent's stream as the hub sees it, without a
// network: what the hub sends is encoded as gRPC's codec would, and each
// whole message is acknowledged at once.
type benchAgent struct {
	ctx    context.Context
	node   string
	hello  bool
	acks   chan uint64
	got    chan uint64 // the version of every whole message sent
	failed chan error
	bytes  int // sent, read by the bench between changes only
	// version is the last one the bench saw in got.
	version uint64
}

func newBenchAgent(ctx context.Context, node string) *benchAgent {
	return &benchAgent{ctx: ctx, node: node, acks: make(chan uint64, 16), got: make(chan uint64, 16), failed: make(chan error, 1)}
}

func (a *benchAgent) SendMsg(m any) error {
	raw, err := proto.Marshal(m.(proto.Message))
	if err != nil {
		return err
	}
	a.bytes += len(raw)
	version, more, err := versionAndMore(raw)
	if err != nil || more {
		return err
	}
	select {
	case a.acks <- version:
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
	select {
	case a.got <- version:
		return nil
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

// versionAndMore reads a SyncResponse's version and more fields without
// decoding the rest: the bench measures the server, not an agent.
func versionAndMore(raw []byte) (version uint64, more bool, err error) {
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return 0, false, protowire.ParseError(n)
		}
		raw = raw[n:]
		if typ == protowire.VarintType && (num == 1 || num == 6) {
			v, n := protowire.ConsumeVarint(raw)
			if n < 0 {
				return 0, false, protowire.ParseError(n)
			}
			if num == 1 {
				version = v
			} else {
				more = v != 0
			}
		}
		n = protowire.ConsumeFieldValue(num, typ, raw)
		if n < 0 {
			return 0, false, protowire.ParseError(n)
		}
		raw = raw[n:]
	}
	return version, more, nil
}

func (a *benchAgent) RecvMsg(m any) error {
	req := m.(*weirv1.SyncRequest)
	if !a.hello {
		a.hello = true
		req.Message = &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: a.node}}
		return nil
	}
	select {
	case v := <-a.acks:
		req.Message = &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: v}}
		return nil
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

func (a *benchAgent) Context() context.Context     { return a.ctx }
func (a *benchAgent) SetHeader(metadata.MD) error  { return nil }
func (a *benchAgent) SendHeader(metadata.MD) error { return nil }
func (a *benchAgent) SetTrailer(metadata.MD)       {}

// cpuTime is the CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOneEndpointChange is the server's cost for one endpoint change
// at a growing number of services, with benchNodes agents connected: the
// endpoint slice written through the API's handler (validated, committed
// to bbolt, published), the hub's fanout working out the service for the
// nodes and marking every agent, and each agent's session building its
// delta and sending it, encoded, on a stream that only reads the version
// and acknowledges it. cpu-ns/op is the process's CPU time (all
// goroutines); ns/op also holds the commit's fsync.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		var w *benchWorld
		dir := filepath.Join(b.TempDir(), fmt.Sprintf("services-%d", n))
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			if w == nil {
				// Built once for the sub-benchmark's runs.
				w = newBenchWorld(b, dir, n)
			}
			ctx := context.Background()
			sent := 0
			for _, a := range w.agents {
				sent += a.bytes
			}
			var written time.Duration
			runtime.GC()
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for op := range b.N {
				start := time.Now()
				req := w.changes[w.next%len(w.changes)]
				w.next++
				resp, err := w.api.UpdateEndpointSlice(ctx, req)
				if err != nil {
					b.Fatalf("change %d: %v", op, err)
				}
				written += time.Since(start)
				w.waitAll(b, resp.GetEndpointSlice().GetMetadata().GetRevision())
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(written)/float64(b.N), "write-ns/op")
			for _, a := range w.agents {
				sent -= a.bytes
			}
			b.ReportMetric(float64(-sent)/float64(b.N*benchNodes), "B-sent/agent/op")
		})
		if w != nil {
			w.close(b)
		}
	}
}
