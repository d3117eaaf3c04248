// Command endtoend measures what a user making one change waits for: from
// a write accepted by weir-server to the change committed in the kernel of
// every node.
//
// A real weir-server and real weir-agents run in a lab of network
// namespaces (test/weirlab) and program real nftables; the rest of the
// fan-out are simulated agents over real gRPC and mTLS, each its own
// connection and stream, acknowledging every state as it arrives (as in
// the controlplane bench). The bench loads services through the API, waits
// until every agent holds all of them, then changes one endpoint of one
// service at a time, a gap apart so that each is a lone change, and
// reports per change and node: when each simulated agent received it, when
// each real node's agent committed it to the kernel, when every node had
// it, and where that time goes (the server's and the agents' own
// metrics). With -gap 0 the changes go back to back instead, and the
// server's coalescing shows.
//
// With -storm it then makes storms (storm.go): endpoint changes at steady
// rates, many in each write, and a burst, and reports for each the
// throughput, every node's lag, CPU per change on both sides and memory.
//
// It runs as root (namespaces, nft) and tears the lab down on exit, on
// failure and on SIGINT:
//
//	go run ./test/bench/endtoend -services 10000 -agents 500
//	go run ./test/bench/endtoend -services 10000 -agents 500 -changes 0 -decode=false -storm 1000,10000,50000 -storm-burst 50000
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/test/bench/fanoutfloor"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// config is what one run measures.
type config struct {
	services int           // services, 10 endpoints each
	agents   int           // agents in all, real and simulated
	nodes    int           // real nodes among them
	changes  int           // single-endpoint changes timed
	gap      time.Duration // from one write's answer to the next write; 0: back to back
	minSync  time.Duration // the server's --min-sync-period
	storms   []stormPhase
	profiles string // where the server's profiles over storms go; "" for none
	decode   bool   // the simulated agents decode every message whole
}

func main() {
	var cfg config
	flag.IntVar(&cfg.services, "services", 10000, "services, 10 endpoints each, spread over every node")
	flag.IntVar(&cfg.agents, "agents", 500, "agents in all: the real nodes' and the simulated ones")
	flag.IntVar(&cfg.nodes, "nodes", 2, "real nodes among the agents: weir-agent programming nftables in a namespace")
	flag.IntVar(&cfg.changes, "changes", 100, "single-endpoint changes to time")
	flag.DurationVar(&cfg.gap, "gap", 300*time.Millisecond, "time from one change's write returning to the next write, so that each is a lone change (0: back to back, as fast as the API accepts them)")
	flag.DurationVar(&cfg.minSync, "min-sync-period", 50*time.Millisecond, "the server's --min-sync-period")
	storms := flag.String("storm", "", "after the lone changes, storms at these rates of endpoint changes a second, comma-separated (e.g. 1000,10000,50000)")
	stormFor := flag.Duration("storm-for", 10*time.Second, "how long each storm of -storm lasts")
	burst := flag.Int("storm-burst", 0, "after the storms, a burst of this many endpoint changes written as fast as the API takes them")
	flag.BoolVar(&cfg.decode, "decode", true, "simulated agents decode every message whole, as an agent does on its own node; false: only its envelope, so that storms are not limited by 498 agents decoding on this machine's cores")
	flag.StringVar(&cfg.profiles, "storm-profiles", "", "a directory for a CPU profile of the server over each storm")
	flag.Parse()
	var err error
	if cfg.storms, err = parseStorms(*storms, *stormFor, *burst); err != nil {
		fmt.Fprintln(os.Stderr, "endtoend:", err)
		os.Exit(2)
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "endtoend:", err)
		os.Exit(2)
	}
	// SIGINT and SIGTERM end ctx: every wait returns, and the deferred
	// teardown stops the lab's processes and deletes its namespaces.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		if ctx.Err() != nil {
			err = errors.New("interrupted; the lab is torn down")
		}
		fmt.Fprintln(os.Stderr, "endtoend:", err)
		os.Exit(1)
	}
}

func (cfg config) check() error {
	switch {
	case cfg.nodes < 1:
		return errors.New("-nodes: at least one real node")
	case cfg.agents < cfg.nodes:
		return fmt.Errorf("-agents %d: at least the %d real nodes", cfg.agents, cfg.nodes)
	case cfg.services < 1 || cfg.services > 65535:
		return errors.New("-services: 1 to 65535 (their addresses come from 10.96.0.0/16)")
	case cfg.changes < 0 || cfg.changes == 0 && len(cfg.storms) == 0:
		return errors.New("-changes: at least one, or none with -storm or -storm-burst")
	case os.Geteuid() != 0:
		return errors.New("needs root: the lab creates network namespaces and its agents program nftables")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("needs %s in PATH for the lab", tool)
		}
	}
	return nil
}

// Where the lab's processes serve /metrics, each inside its own namespace.
const (
	serverMetrics = "127.0.0.1:7444"
	agentMetrics  = "127.0.0.1:10249"
)

func run(ctx context.Context, cfg config) (err error) {
	dir, err := os.MkdirTemp("", "weir-bench-endtoend-")
	if err != nil {
		return err
	}
	// The lab's logs stay for reading when the run fails; the binaries go.
	defer func() {
		logs := filepath.Join(dir, "lab")
		if _, serr := os.Stat(logs); serr == nil && err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "endtoend: the lab's logs are in %s\n", logs)
			return
		}
		os.RemoveAll(dir)
	}()
	start := time.Now()
	binDir := filepath.Join(dir, "bin")
	defer os.RemoveAll(binDir)
	bin, err := build(ctx, binDir)
	if err != nil {
		return err
	}
	fmt.Printf("built weir-server and weir-agent in %v\n", since(start))

	start = time.Now()
	c, err := weirlab.Start(ctx, lab.Config{Nodes: cfg.nodes, Dir: filepath.Join(dir, "lab")}, bin, func(c *weirlab.Cluster) {
		// The simulated agents share one fleet certificate from one
		// address (the router's), where real ones each have their node:
		// the server counts a fleet certificate's connections per address.
		c.ServerArgs = []string{"--api-calls-per-second", "0", "--min-sync-period", cfg.minSync.String(), "--metrics-bind-address", serverMetrics,
			"--api-connections-per-caller", strconv.Itoa(cfg.agents + 8), "--profiling"}
		c.AgentArgs = func(*lab.Node) []string {
			args := []string{"--metrics-bind-address", agentMetrics}
			if len(cfg.storms) > 0 {
				// Each apply's version and end, to time storms by.
				args = append(args, "--log-level", "debug", "--log-format", "json")
			}
			if cfg.profiles != "" {
				args = append(args, "--profiling")
			}
			return args
		}
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil {
			// Said at once: an interrupted run's error says only that.
			fmt.Fprintln(os.Stderr, "endtoend: tearing down the lab:", cerr)
			err = errors.Join(err, cerr)
		}
	}()
	nSim := cfg.agents - cfg.nodes
	fmt.Printf("lab: weir-server and %d real nodes (weir-agent, nftables) in %v; %d simulated agents to come; %d CPUs for all of it and this program\n",
		cfg.nodes, since(start), nSim, runtime.NumCPU())

	// Every node's name, the real ones first: endpoints are spread over all.
	var names []string
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	for i := range nSim {
		names = append(names, fmt.Sprintf("sim-%d", i))
	}
	var revision atomic.Uint64 // the newest write's store revision
	wrote := func(meta *weirv1.ObjectMeta) {
		v := revisionOf(meta)
		for old := revision.Load(); v > old && !revision.CompareAndSwap(old, v); old = revision.Load() {
		}
	}
	for _, name := range names[cfg.nodes:] {
		resp, err := c.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: name}}})
		if err != nil {
			return fmt.Errorf("registering %s: %w", name, err)
		}
		wrote(resp.GetNode().GetMetadata())
	}
	start = time.Now()
	if err := load(ctx, c.Registry, cfg.services, names, wrote); err != nil {
		return err
	}
	fmt.Printf("loaded %d services and %d endpoints through the API in %v (the real nodes applying as they came)\n",
		cfg.services, cfg.services*10, since(start))
	loadEnded := time.Now()

	// The simulated agents connect once everything is loaded, each to get
	// it as one whole state.
	failed := &failure{done: make(chan struct{})}
	agentsCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	tlsCfg, err := fleetTLS(c)
	if err != nil {
		return err
	}
	start = time.Now()
	sims := make([]*simAgent, nSim)
	var retried atomic.Int64
	for i := range sims {
		a := &simAgent{name: names[cfg.nodes+i], decode: cfg.decode}
		sims[i] = a
		go func() {
			conn, err := dialServer(c, tlsCfg)
			if err != nil {
				failed.set(fmt.Errorf("%s: %w", a.name, err))
				return
			}
			defer conn.Close()
			for {
				err := a.run(agentsCtx, conn)
				switch _, got := a.receivedAt(1); {
				case agentsCtx.Err() != nil:
					return
				case !got:
					// Not connected yet (a handshake that outlasted the
					// server's timeout while hundreds arrive at once on
					// two cores): again, as a real agent would.
					retried.Add(1)
					time.Sleep(dial.Backoff.MaxDelay)
					continue
				}
				failed.set(fmt.Errorf("%s: stream ended: %w", a.name, err))
				return
			}
		}()
	}
	loaded := revision.Load()
	if err := waitFor(ctx, failed, 10*time.Minute, "every simulated agent has the full state", func() bool {
		for _, a := range sims {
			if _, ok := a.receivedAt(loaded); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	fmt.Printf("%d simulated agents connected and received the full state in %v (%d attempts again after a stream that ended before its first state)\n", nSim, since(start), retried.Load())
	status := weirv1.NewStatusServiceClient(c.Conn)
	if err := waitProgrammed(ctx, status, loaded, cfg.agents); err != nil {
		return err
	}
	fmt.Printf("every node (%d real, %d simulated) programmed through revision %d, %v after loading ended\n", cfg.nodes, nSim, loaded, since(loadEnded))

	gens := map[int]int{} // each service's generation; all are loaded at 0
	var size int          // a lone change's delta, in bytes
	if cfg.changes > 0 {
		if size, err = timeLoneChanges(ctx, c, cfg, names, sims, failed, gens); err != nil {
			return err
		}
	}
	if len(cfg.storms) > 0 {
		if err := runStorms(ctx, c, cfg.storms, newStormer(c.Registry, names, cfg.services, gens), sims, failed, cfg.profiles); err != nil {
			return err
		}
	}
	stopAgents()
	if cfg.changes == 0 {
		return nil
	}
	// The floor: as many agents, the same delta, over bare TLS sockets.
	floor, err := fanoutfloor.Measure(ctx, cfg.agents, cfg.changes, size, true)
	if err != nil {
		return err
	}
	fmt.Printf("%v\n  (back to back, on loopback in this program: the same 2 CPUs, without gRPC, HTTP/2, the hub or the lab's veths)\n", floor)
	// And through gRPC alone: what its transport adds, without the hub.
	floor, err = fanoutfloor.MeasureGRPC(ctx, cfg.agents, cfg.changes, size, true)
	if err != nil {
		return err
	}
	fmt.Printf("%v\n  (the same, each agent on a gRPC stream of its own, a change encoded once: without the hub, Weir's messages or the lab's veths)\n", floor)
	return nil
}

// timeLoneChanges makes cfg.changes single-endpoint changes, times each
// into every node and reports them; gens are the services' generations,
// which it moves on.
func timeLoneChanges(ctx context.Context, c *weirlab.Cluster, cfg config, names []string, sims []*simAgent, failed *failure, gens map[int]int) (deltaBytes int, err error) {
	status := weirv1.NewStatusServiceClient(c.Conn)
	// The status stream and the real agents' metrics are followed from
	// before the first change.
	reals := make([]*realNode, len(c.Nodes))
	for i, n := range c.Nodes {
		reals[i] = &realNode{node: n, metrics: n.HTTPClient(2 * time.Second)}
	}
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	watching := make(chan struct{})
	go func() {
		if err := watchStatuses(watchCtx, status, reals, watching); watchCtx.Err() == nil {
			failed.set(fmt.Errorf("watching node statuses: %w", err))
		}
	}()
	select {
	case <-watching:
	case <-failed.done:
		return 0, failed.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	before, err := scrapeAll(ctx, c, reals)
	if err != nil {
		return 0, err
	}

	var gcBefore, gcAfter runtime.MemStats
	runtime.ReadMemStats(&gcBefore)
	changes, err := makeChanges(ctx, c.Registry, status, cfg, names, gens)
	if err != nil {
		return 0, err
	}
	last := changes[len(changes)-1].revision
	if err := waitFor(ctx, failed, 30*time.Second, "every node has the last change", func() bool {
		for _, a := range sims {
			if _, ok := a.receivedAt(last); !ok {
				return false
			}
		}
		for _, r := range reals {
			if _, _, ok := r.committedAt(last); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		return 0, err
	}
	for _, ch := range changes {
		if err := ch.waited.Wait(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&gcAfter)
	after, err := scrapeAll(ctx, c, reals)
	if err != nil {
		return 0, err
	}
	report(cfg, changes, sims, reals, before, after)
	reportStalls(changes, sims, before, after, gcOf(&gcBefore, &gcAfter))
	sims[0].mu.Lock()
	defer sims[0].mu.Unlock()
	return sims[0].deltaBytes, nil
}

// build compiles weir-server and weir-agent as they ship: the e2e tests'
// agent has fault hooks (-tags weirfaults) that a benchmark should not
// carry.
func build(ctx context.Context, dir string) (weirlab.Binaries, error) {
	root, err := weirlab.ModuleRoot()
	if err != nil {
		return weirlab.Binaries{}, err
	}
	bin := weirlab.Binaries{Server: filepath.Join(dir, "weir-server"), Agent: filepath.Join(dir, "weir-agent")}
	for _, b := range []struct{ out, pkg string }{{bin.Server, "./server/cmd/weir-server"}, {bin.Agent, "./agent/cmd/weir-agent"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return bin, fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return bin, nil
}

// load creates the services and their endpoint slices, 4 writers in
// parallel (the store serialises them anyway). Well below the server's 8
// calls in flight per caller: the server counts a call until its handler
// has returned, which can be after the client has its answer and sent
// the next.
func load(ctx context.Context, reg weirv1.RegistryServiceClient, n int, nodes []string, wrote func(*weirv1.ObjectMeta)) error {
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for w := range errs {
		wg.Go(func() {
			for i := w; i < n; i += len(errs) {
				svc := &weirv1.Service{Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: serviceName(i)},
					Spec: &weirv1.ServiceSpec{ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", (i+1)>>8, (i+1)&255)},
						Ports: []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}}}
				s, err := reg.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
				if err != nil {
					errs[w] = fmt.Errorf("creating %s: %w", svc.Metadata.Name, err)
					return
				}
				wrote(s.GetService().GetMetadata())
				e, err := reg.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: endpointSlice(i, 0, nodes)})
				if err != nil {
					errs[w] = fmt.Errorf("creating the endpoints of %s: %w", svc.Metadata.Name, err)
					return
				}
				wrote(e.GetEndpointSlice().GetMetadata())
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func serviceName(i int) string { return fmt.Sprintf("svc-%d", i) }

// endpointSlice is service i's ten endpoints, spread over the nodes; gen
// moves the first one to another address, as a replaced pod would, and
// leaves the others as they are. Generations 64 apart are the same slice:
// a change must take the service's next generation, or it changes nothing
// an agent is sent (the 64th change of a run was once such a no-op, which
// the agents saw only with the next change and the bench took for a
// stall).
func endpointSlice(i, gen int, nodes []string) *weirv1.EndpointSlice {
	s := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: serviceName(i)}, ServiceName: serviceName(i),
		Ports: []*weirv1.EndpointPort{{Name: "http", Port: 8080}}}
	for j := range 10 {
		block := 128 + j // 10.128.0.0 to 10.137.255.255
		if j == 0 {
			block = 192 + gen%64 // 10.192.0.0 to 10.255.255.255, a /16 per generation
		}
		s.Endpoints = append(s.Endpoints, &weirv1.Endpoint{
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", block, i>>8, i&255)},
			NodeName:  nodes[(i*10+j)%len(nodes)],
		})
	}
	return s
}

// revisionOf is the store revision a write returned.
func revisionOf(meta *weirv1.ObjectMeta) uint64 {
	v, _ := strconv.ParseUint(meta.GetResourceVersion(), 10, 64)
	return v
}

// fleetTLS is the simulated agents' mTLS configuration: one agent
// certificate that may speak for any node (certs.FleetAgentName), as a
// DaemonSet's agents share.
func fleetTLS(c *weirlab.Cluster) (*tls.Config, error) {
	if err := certs.IssueClient(c.CertDir, certs.FleetAgentName, certs.RoleAgent); err != nil {
		return nil, err
	}
	file := func(name string) string { return filepath.Join(c.CertDir, name) }
	return tlsconfig.Client(tlsconfig.Files{CA: file("ca.crt"), Cert: file(certs.FleetAgentName + ".crt"), Key: file(certs.FleetAgentName + ".key")})
}

// dialServer connects to the lab's server from the router's namespace, as
// the lab's own client does: across the rack LAN, not over loopback.
func dialServer(c *weirlab.Cluster, tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+weirlab.ServerAddr(0).String(), append(dial.Windows(),
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.Router.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))...)
}

// waitProgrammed waits until the server says every one of the agents
// (all connected) has everything through revision rev in its kernel.
func waitProgrammed(ctx context.Context, status weirv1.StatusServiceClient, rev uint64, agents int) error {
	resp, err := status.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(10 * time.Minute)})
	if err != nil {
		return fmt.Errorf("waiting for revision %d to be programmed: %w", rev, err)
	}
	done := 0
	for _, n := range resp.GetNodes() {
		if n.GetConnected() && n.GetProgrammedVersion() >= rev {
			done++
		} else if n.GetReason() != "" {
			return fmt.Errorf("node %s not programmed through revision %d: %s", n.GetName(), rev, n.GetReason())
		}
	}
	if !resp.GetProgrammed() || done != agents {
		return fmt.Errorf("%d of %d nodes programmed through revision %d", done, agents, rev)
	}
	return nil
}

// change is one timed write.
type change struct {
	revision uint64
	// called and accepted are when the UpdateEndpointSlice call was made
	// and when it returned: every end-to-end time starts at accepted.
	called, accepted time.Time
	// programmed is when WaitProgrammed, called at once, said every node
	// had it; waited reports its error.
	programmed time.Time
	waited     errWait
}

// makeChanges writes cfg.changes single-endpoint changes, cfg.gap apart
// (or back to back), and for each asks WaitProgrammed at once, as a user
// waiting for it would.
func makeChanges(ctx context.Context, reg weirv1.RegistryServiceClient, status weirv1.StatusServiceClient, cfg config, nodes []string, gen map[int]int) ([]*change, error) {
	changes := make([]*change, cfg.changes)
	for k := range changes {
		// The gap runs from the previous write's answer: a slow write
		// does not bring the next one closer.
		if k > 0 && cfg.gap > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(cfg.gap):
			}
		}
		i := (k * 7919) % cfg.services // a prime stride: a different service each time
		gen[i]++
		ch := &change{called: time.Now()}
		resp, err := reg.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: endpointSlice(i, gen[i], nodes)})
		if err != nil {
			return nil, fmt.Errorf("change %d: %w", k, err)
		}
		ch.accepted = time.Now()
		ch.revision = revisionOf(resp.GetEndpointSlice().GetMetadata())
		ch.waited.start(func() error {
			err := waitProgrammed(ctx, status, ch.revision, cfg.agents)
			ch.programmed = time.Now()
			return err
		})
		changes[k] = ch
	}
	return changes, nil
}

// errWait runs one function in its own goroutine and keeps its error.
type errWait struct {
	done chan struct{}
	err  error
}

func (w *errWait) start(f func() error) {
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		w.err = f()
	}()
}

func (w *errWait) Wait() error {
	<-w.done
	return w.err
}

// failure holds the first error of the goroutines beside the main one.
type failure struct {
	once sync.Once
	err  error
	done chan struct{} // closed once err is set
}

func (f *failure) set(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.done)
	})
}

// waitFor polls done until it holds, failing after timeout, when ctx ends
// or when another goroutine failed.
func waitFor(ctx context.Context, failed *failure, timeout time.Duration, what string, done func() bool) error {
	deadline := time.Now().Add(timeout)
	for !done() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %v: %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-failed.done:
			return failed.err
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
