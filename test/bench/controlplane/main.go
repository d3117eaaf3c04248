// Command controlplane measures the server against many agents: it starts
// weir-server on loopback, loads services and endpoints through the API,
// connects simulated agents over real gRPC (each its own connection and
// stream, acknowledging every version at once), then changes one endpoint
// at a time and measures, per agent, the time from the change's acceptance
// to the agent receiving it, and how many bytes each agent got per change.
// With -replicas N it runs N replicas on a three-member etcd cluster
// instead, the agents spread over them, writes through each in turn, and
// then kills one replica and times its agents' return on the others.
//
// The simulated agents read only what a message says of itself (its
// version, whether it is whole, whether more parts follow), not the
// services: thousands of agents decoding on the server's cores would
// measure their decoding (an agent's own, on its own node; see
// agent/syncer's benchmarks), not the server. -decode makes them decode.
//
//	go run ./test/bench/controlplane -services 10000 -agents 500
//	go run ./test/bench/controlplane -services 10000 -agents 1500 -replicas 3
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weirlb/weir/internal/dial"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bench/fanoutfloor"
	"github.com/weirlb/weir/test/bench/internal/envelope"
	"github.com/weirlb/weir/test/etcdcluster"
	"github.com/weirlb/weir/test/weirlab"
)

var (
	restartFlag      *bool
	simulatedRestart *bool
	replicas         int
	decode           *bool
)

func main() {
	services := flag.Int("services", 10000, "services (10 endpoints each)")
	agents := flag.Int("agents", 500, "simulated agents")
	changes := flag.Int("changes", 100, "single-endpoint changes to time")
	minSync := flag.Duration("min-sync-period", 50*time.Millisecond, "the server's --min-sync-period")
	restartFlag = flag.Bool("server-restart", true, "then run real agent syncers, restart the server and time their return (one server)")
	simulatedRestart = flag.Bool("restart-simulated", false, "time the server restart with the simulated agents instead of real syncers (which hold a decoded state each: about 4.7 MB, too much for thousands in one process)")
	decode = flag.Bool("decode", false, "simulated agents decode every message, on the server's cores")
	flag.IntVar(&replicas, "replicas", 1, "replicas of the server on a three-member etcd cluster (1: one server on its embedded store)")
	flag.Parse()
	if err := run(*services, *agents, *changes, *minSync); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// agent is one simulated agent: it acknowledges every version and records
// when each arrived and how big it was.
type agent struct {
	name     string
	mu       sync.Mutex
	received map[uint64]time.Time
	bytes    map[uint64]int
	full     atomic.Int64 // bytes of the first, full state
	ready    chan struct{}
	// applied and history are what the agent last acknowledged, to
	// resume on another replica; back is when a later stream's first
	// message came, and whether it was a whole state.
	applied  uint64
	history  string
	back     time.Time
	backFull bool
}

func (a *agent) run(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
	codec := &envelope.Codec{Decode: *decode}
	stream, err := weirv1.NewAgentServiceClient(conn).Sync(ctx, append(opts, grpc.MaxCallRecvMsgSize(1<<30), grpc.ForceCodecV2(codec))...)
	if err != nil {
		return err
	}
	a.mu.Lock()
	hello := &weirv1.Hello{NodeName: a.name, AppliedVersion: a.applied, AppliedHistory: a.history}
	resuming := a.applied != 0
	a.mu.Unlock()
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: hello}}); err != nil {
		return err
	}
	first := !resuming
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		size := codec.Size
		a.mu.Lock()
		if resuming && a.back.IsZero() {
			a.back, a.backFull = now, msg.GetFull()
		}
		if !msg.GetMore() {
			a.applied, a.history = msg.GetVersion(), msg.GetHistory()
		}
		a.bytes[msg.GetVersion()] += size
		total := a.bytes[msg.GetVersion()]
		if !msg.GetMore() {
			a.received[msg.GetVersion()] = now
		}
		a.mu.Unlock()
		if msg.GetMore() {
			continue // a state in parts: answer the last one
		}
		if first {
			// Before the answer: an agent whose answer fails resumes
			// from this version, and is not sent it again.
			a.full.Store(int64(total))
			close(a.ready)
			first = false
		}
		if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: msg.GetVersion()}}}); err != nil {
			return err
		}
	}
}

func run(nServices, nAgents, nChanges int, minSync time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := weirlab.ModuleRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "weir-bench-cp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "weir-server")
	build := exec.Command("go", "build", "-o", bin, "./server/cmd/weir-server")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v: %s", err, out)
	}
	var etcd *etcdcluster.Cluster
	if replicas > 1 {
		if etcd, err = etcdcluster.Start(ctx, 3); err != nil {
			return err
		}
		defer etcd.Close()
	}
	servers := make([]*server, max(1, replicas))
	for i := range servers {
		port, err := freePort()
		if err != nil {
			return err
		}
		mport, err := freePort()
		if err != nil {
			return err
		}
		sv := &server{addr: "127.0.0.1:" + strconv.Itoa(port), mport: mport}
		args := []string{"--insecure", "--api-calls-per-second", "0", "--listen", sv.addr,
			"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(mport), "--profiling", "--log-level", "warn", "--min-sync-period", minSync.String()}
		if etcd != nil {
			args = append(args, "--etcd-endpoints", strings.Join(etcd.Endpoints(), ","), "--replica-name", fmt.Sprintf("replica%d", i))
		} else {
			args = append(args, "--data-dir", filepath.Join(dir, "data"))
		}
		sv.start = func() (*exec.Cmd, error) {
			cmd := exec.Command(bin, args...)
			cmd.Stderr = os.Stderr
			return cmd, cmd.Start()
		}
		if sv.cmd, err = sv.start(); err != nil {
			return err
		}
		defer func() { sv.cmd.Process.Kill(); sv.cmd.Wait() }()
		servers[i] = sv
	}
	addr, mport, startServer := servers[0].addr, servers[0].mport, servers[0].start
	srv := servers[0].cmd
	memories := func() string {
		var out []string
		for i, sv := range servers {
			if sv.cmd.ProcessState == nil {
				out = append(out, fmt.Sprintf("replica %d: %s", i, memory(sv.cmd.Process.Pid)))
			}
		}
		if len(servers) == 1 {
			return memory(srv.Process.Pid)
		}
		return strings.Join(out, "; ")
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	reg := weirv1.NewRegistryServiceClient(conn)
	var regs []weirv1.RegistryServiceClient
	for _, sv := range servers {
		c, err := grpc.NewClient(sv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer c.Close()
		r := weirv1.NewRegistryServiceClient(c)
		for start := time.Now(); ; {
			if _, err := r.ListNodes(ctx, &weirv1.ListNodesRequest{}); err == nil {
				break
			}
			if time.Since(start) > 30*time.Second {
				return fmt.Errorf("server %s did not start", sv.addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		regs = append(regs, r)
	}

	// Load: 8 writers in parallel (the store serialises them anyway).
	start := time.Now()
	slice := func(i, gen int) *weirv1.EndpointSlice {
		s := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, ServiceName: fmt.Sprintf("svc-%d", i),
			Ports: []*weirv1.EndpointPort{{Name: "http", Port: 8080}}}
		for j := range 10 {
			s.Endpoints = append(s.Endpoints, &weirv1.Endpoint{
				Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 128+j, (i>>8)&255, i&255)},
				NodeName:  fmt.Sprintf("node-%d", (i*10+j+gen)%nAgents),
			})
		}
		return s
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < nServices; i += 8 {
				svc := &weirv1.Service{Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)},
					Spec: &weirv1.ServiceSpec{ClusterIps: []string{fmt.Sprintf("10.%d.%d.%d", 96+(i+1)>>16, ((i+1)>>8)&255, (i+1)&255)},
						Ports: []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}}}
				if _, err := reg.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
					errs <- err
					return
				}
				if _, err := reg.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice(i, 0)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("loaded %d services and %d endpoints through the API in %v (%s)\n", nServices, nServices*10, time.Since(start).Round(time.Millisecond), memories())

	for i := range nAgents {
		if _, err := reg.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}}}); err != nil {
			return err
		}
	}

	// Agents: each its own connection and stream.
	agentsCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	start = time.Now()
	cpuBefore := fanoutfloor.CPUTime(srv.Process.Pid)
	var all []*agent
	for i := range nAgents {
		a := &agent{name: fmt.Sprintf("node-%d", i), received: map[uint64]time.Time{}, bytes: map[uint64]int{}, ready: make(chan struct{})}
		go func() {
			if len(servers) == 1 {
				// One server: as a real agent, one connection with the
				// agent's own dialer (its reconnect backoff), each new
				// stream waiting for it, resuming from what it holds;
				// thousands connecting at once can outlast the server's
				// handshake timeout.
				c, err := dial.Server(servers[0].addr, nil)
				if err != nil {
					fmt.Fprintln(os.Stderr, a.name, err)
					return
				}
				defer c.Close()
				for agentsCtx.Err() == nil {
					if err := a.run(agentsCtx, c, grpc.WaitForReady(true)); agentsCtx.Err() == nil {
						fmt.Fprintln(os.Stderr, a.name, "again after:", err)
					}
				}
				return
			}
			// Agent i is on replica i mod N; when its replica goes, on the
			// next one.
			for k := i; agentsCtx.Err() == nil; k++ {
				c, err := grpc.NewClient(servers[k%len(servers)].addr, append(dial.Windows(), grpc.WithTransportCredentials(insecure.NewCredentials()),
					grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))...)
				if err != nil {
					fmt.Fprintln(os.Stderr, a.name, err)
					return
				}
				a.run(agentsCtx, c)
				c.Close()
			}
		}()
		all = append(all, a)
	}
	// One deadline for all: the server sends a bounded number of whole
	// states at once, so the last agents wait for all the others.
	fullDeadline := time.After(20 * time.Minute)
	for _, a := range all {
		select {
		case <-a.ready:
		case <-fullDeadline:
			return fmt.Errorf("%s got no full state in 20 minutes", a.name)
		}
	}
	fmt.Printf("%d agents connected and received their full state (%d KiB each) in %v (%s)\n", nAgents, all[0].full.Load()>>10, time.Since(start).Round(time.Millisecond), memories())
	cpuAfter := fanoutfloor.CPUTime(srv.Process.Pid)
	fmt.Printf("server CPU while they took it: %v\n", cpuAfter-cpuBefore)
	cpuBefore = cpuAfter

	// Changes: one endpoint of one service at a time.
	benchBefore := fanoutfloor.CPUTime(os.Getpid())
	gen := map[int]int{} // each service's generation; all are loaded at 0
	var lat []time.Duration
	var perChange []int
	for c := range nChanges {
		i := (c * 7919) % nServices
		// The service's next generation: one a change's number would
		// give could be one the service had, a change that changes
		// nothing, which no agent is sent.
		gen[i]++
		s := slice(i, gen[i])
		accepted := time.Now()
		resp, err := regs[c%len(regs)].UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s})
		if err != nil {
			return err
		}
		v, _ := strconv.ParseUint(resp.GetEndpointSlice().GetMetadata().GetResourceVersion(), 10, 64)
		deadline := time.Now().Add(10 * time.Second)
		for _, a := range all {
			for {
				a.mu.Lock()
				at, ok := a.received[v]
				bytes := a.bytes[v]
				a.mu.Unlock()
				if ok {
					lat = append(lat, at.Sub(accepted))
					if a == all[0] {
						perChange = append(perChange, bytes)
					}
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%s never received version %d", a.name, v)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	slices.Sort(lat)
	slices.Sort(perChange)
	q := func(p int) time.Duration { return lat[min(len(lat)-1, len(lat)*p/100)].Round(100 * time.Microsecond) }
	fmt.Printf("one endpoint change -> every agent has it (%d changes x %d agents, changes back to back, min-sync-period %v): p50 %v  p99 %v  max %v\n",
		nChanges, nAgents, minSync, q(50), q(99), lat[len(lat)-1].Round(100*time.Microsecond))
	fmt.Printf("bytes per agent per change: median %d (the whole state is %d)\n", perChange[len(perChange)/2], all[0].full.Load())
	// The server's own share, apart from the simulated agents on the same
	// CPUs: its CPU time over the changes (write, fan-out, answers).
	fmt.Printf("server CPU per change: %v; the simulated agents': %v\n", ((fanoutfloor.CPUTime(srv.Process.Pid) - cpuBefore) / time.Duration(nChanges)).Round(100*time.Microsecond),
		((fanoutfloor.CPUTime(os.Getpid()) - benchBefore) / time.Duration(nChanges)).Round(100*time.Microsecond))
	floor, err := fanoutfloor.Measure(ctx, nAgents, nChanges, perChange[len(perChange)/2], false)
	if err != nil {
		return err
	}
	fmt.Println(floor)
	if floor, err = fanoutfloor.MeasureGRPC(ctx, nAgents, nChanges, perChange[len(perChange)/2], false); err != nil {
		return err
	}
	fmt.Println(floor)
	fmt.Printf("%s\n", memories())
	if len(servers) > 1 {
		return measureReplicaLoss(servers, all)
	}
	if *restartFlag && *simulatedRestart {
		srv, err = measureServerRestartSimulated(ctx, addr, srv, startServer, all)
		servers[0].cmd = srv
		if err != nil {
			return err
		}
	} else if *restartFlag {
		stopAgents()
		srv, err = measureServerRestart(ctx, addr, nAgents, srv, startServer)
		servers[0].cmd = srv // the restarted server is the one to stop at the end
		if err != nil {
			return err
		}
	}
	if path := os.Getenv("WEIR_BENCH_HEAP_PROFILE"); path != "" {
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", "-sample_index=inuse_space",
			fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", mport)).CombinedOutput()
		os.WriteFile(path, out, 0o644)
		if err != nil {
			return err
		}
	}
	return nil
}

// server is one server process.
type server struct {
	addr  string
	mport int
	cmd   *exec.Cmd
	start func() (*exec.Cmd, error)
}

// measureReplicaLoss kills replica 0 and times its agents' return on the
// others: until each has its first message there, a delta from the
// version it holds or a whole state.
func measureReplicaLoss(servers []*server, all []*agent) error {
	var gone []*agent
	for i, a := range all {
		if i%len(servers) == 0 {
			gone = append(gone, a)
		}
	}
	servers[0].cmd.Process.Kill()
	killed := time.Now()
	servers[0].cmd.Wait()
	var lat []time.Duration
	full := 0
	deadline := time.Now().Add(2 * time.Minute)
	for _, a := range gone {
		for {
			a.mu.Lock()
			back, wasFull := a.back, a.backFull
			a.mu.Unlock()
			if !back.IsZero() {
				lat = append(lat, back.Sub(killed))
				if wasFull {
					full++
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not back 2 minutes after its replica was killed", a.name)
			}
			time.Sleep(time.Millisecond)
		}
	}
	slices.Sort(lat)
	q := func(p int) time.Duration { return lat[min(len(lat)-1, len(lat)*p/100)].Round(100 * time.Microsecond) }
	fmt.Printf("replica 0 killed: its %d agents on the others, first message there: p50 %v  p99 %v  max %v; %d of them sent a whole state, the rest resumed\n",
		len(gone), q(50), q(99), lat[len(lat)-1].Round(100*time.Microsecond), full)
	for i, sv := range servers[1:] {
		fmt.Printf("replica %d: %s\n", i+1, memory(sv.cmd.Process.Pid))
	}
	return nil
}

// memory reads a process's resident and peak resident memory.
func memory(pid int) string {
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	var out []string
	for line := range strings.SplitSeq(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") || strings.HasPrefix(line, "VmRSS:") {
			out = append(out, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(out, ", ")
}
