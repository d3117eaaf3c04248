// Command datapath measures the node datapath at scale against the real
// kernel: a full sync of the datapath issue's workload (services with one
// TCP port and 10 ready endpoints each, 1 % of them LoadBalancer with a
// node port), its peak memory with nft, a periodic resync, and the latency
// of a one-endpoint change and of adding a service on that table.
//
//	go run ./test/bench/datapath -services 10000
//
// It runs itself inside a network namespace it creates and removes.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/datapath/benchhook"
	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

const insideEnv = "WEIR_BENCH_NETNS"

var cpuProfile, memProfile string

func main() {
	services := flag.Int("services", 10000, "services to program")
	changes := flag.Int("changes", 200, "one-endpoint changes to time")
	adds := flag.Int("adds", 40, "services to add, one at a time, half over netlink and half through nft")
	restarts := flag.Int("restarts", 10, "agent restarts to time (a new Datapath over the table, on the same state, then with one service changed meanwhile)")
	pairs := flag.Int("pairs", 5, "full syncs and resyncs to time again, each paired with the kernel's own cost")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the full sync and the resync to this file")
	flag.StringVar(&memProfile, "memprofile", "", "write a heap profile to this file after the full sync and the resync (in use: what the datapath keeps; allocated: what the syncs allocated)")
	flag.Parse()
	if os.Getenv(insideEnv) == "" {
		os.Exit(reexec())
	}
	if err := run(*services, *changes, *adds, *restarts, *pairs); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// reexec runs this program again inside a fresh network namespace, so the
// nft processes it starts touch only that namespace.
func reexec() int {
	ns := fmt.Sprintf("weir-bench-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: ip netns add: %v: %s (run as root)\n", err, out)
		return 1
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), insideEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return 1
	}
	return 0
}

// rssPeak is the largest resident memory seen, of this process alone and
// together with the nft processes it runs at that moment.
type rssPeak struct{ self, total atomic.Int64 }

var peak rssPeak

// sampleRSS watches this process's nft children until the returned func is
// called, every 10 ms: getrusage cannot tell a child's own peak from the
// memory it shared with this process until it exec'ed. This process's own
// peak is the kernel's high-water mark, exact. A process once seen not to
// be nft is not read again, so the sampling takes little of the CPU the
// syncs it measures run on.
func sampleRSS(p *rssPeak) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	me := os.Getpid()
	notNft := map[int]bool{}
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				self := hwmOf(me)
				p.self.Store(self)
				p.total.Store(max(p.total.Load(), self))
				return
			case <-time.After(10 * time.Millisecond):
			}
			total := rssOf(me)
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				pid, err := strconv.Atoi(e.Name())
				if err != nil || pid == me || notNft[pid] {
					continue
				}
				stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				// "pid (comm) state ppid ..."
				if err != nil {
					continue
				}
				if !strings.Contains(string(stat), "(nft)") {
					notNft[pid] = true
					continue
				}
				fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
				if len(fields) > 1 && fields[1] == strconv.Itoa(me) {
					total += rssOf(pid)
				}
			}
			if total > p.total.Load() {
				p.total.Store(total)
			}
		}
	}()
	return func() { close(done); <-finished }
}

// hwmOf reads a process's peak resident memory in bytes.
func hwmOf(pid int) int64 { return statusField(pid, "VmHWM:") }

// rssOf reads a process's resident memory in bytes.
func rssOf(pid int) int64 { return statusField(pid, "VmRSS:") }

func statusField(pid int, name string) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
func addr4(a, b, c, d int) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(a), byte(b), byte(c), byte(d)})
}

// service is the i-th service of the workload as the agent holds it: sent
// over the wire and decoded, its endpoints on 500 nodes other than this one.
func service(i int) *datapath.Service {
	svc := &datapath.Service{
		Key:        datapath.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)},
		ClusterIPs: []netip.Addr{addr4(10, 96+i>>16, i>>8, i)},
		Ports:      []datapath.ServicePort{{Name: "http", Protocol: datapath.TCP, Port: 80}},
	}
	if i%100 == 0 {
		k := i / 100 // one address each (100.64.0.0/10 holds them all)
		svc.LoadBalancerIPs = []netip.Addr{addr4(100, 64+k>>16, k>>8, k)}
		svc.Ports[0].NodePort = uint16(30000 + i/100)
	}
	for j := range 10 {
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, datapath.Endpoint{
			Addr: addr4(10, 128+j, i>>8, i), Port: 8080, NodeName: fmt.Sprintf("node-%d", (i+j)%500), Ready: true, Serving: true,
		})
	}
	wire, err := proto.Marshal(nodewire.EncodeService(svc))
	if err != nil {
		panic(err)
	}
	var m weirv1.NodeService
	if err := proto.Unmarshal(wire, &m); err != nil {
		panic(err)
	}
	decoded, err := nodewire.DecodeService(&m, "bench")
	if err != nil {
		panic(err)
	}
	return decoded
}

// debugLog shows the datapath's phases when WEIR_BENCH_DEBUG is set.
var debugLog = func() *slog.Logger {
	if os.Getenv("WEIR_BENCH_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}()

func run(n, changes, adds, restarts, pairs int) error {
	ctx := context.Background()
	state := datapath.NodeState{
		Node:     datapath.NodeInfo{Name: "bench", Addresses: []netip.Addr{addr4(192, 0, 2, 11)}, Registered: true},
		Services: map[datapath.ServiceKey]*datapath.Service{},
	}
	for i := range n {
		s := service(i)
		state.Services[s.Key] = s
	}
	dp, err := datapath.NewForNode(datapath.Config{Log: debugLog})
	if err != nil {
		return err
	}
	stopSampling := sampleRSS(&peak)
	fmt.Printf("workload: %d services x 1 TCP port x 10 endpoints, %d LoadBalancer with node ports, IPv4\n", n, (n+99)/100)
	if err := fullSyncs(ctx, dp, state, stopSampling); err != nil {
		return err
	}
	if pairs > 0 {
		if err := pairedSyncs(ctx, dp, state, pairs); err != nil {
			return err
		}
	}
	next, err := partialSyncs(ctx, &state, n, changes, adds)
	if err != nil {
		return err
	}
	return restartRuns(ctx, state, next, restarts)
}

// fullSyncs times a full sync into an empty table and a resync replacing
// it (profiled when asked), with the peak memory of both (stopSampling
// ends its sampling), and compares them with the kernel's floor.
func fullSyncs(ctx context.Context, dp *datapath.Datapath, state datapath.NodeState, stopSampling func()) error {
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := dp.Apply(ctx, state); err != nil {
		return err
	}
	fullSync := time.Since(start)
	fmt.Printf("full sync into an empty table:       %v\n", fullSync.Round(time.Millisecond))
	start = time.Now()
	if err := dp.Resync(ctx); err != nil {
		return err
	}
	resync := time.Since(start)
	fmt.Printf("full resync replacing the table:     %v\n", resync.Round(time.Millisecond))

	stopSampling()
	pprof.StopCPUProfile()
	fmt.Printf("peak RSS during the syncs: this process + its nft processes together %d MiB (this process alone %d MiB)\n",
		peak.total.Load()>>20, peak.self.Load()>>20)
	if err := writeHeapProfile(state); err != nil {
		return err
	}

	// The floor: the kernel alone committing the same elements into a
	// bare table, encoded beforehand.
	floor, err := benchhook.KernelLoadFloor(ctx, state, datapath.Config{})
	if err != nil {
		return err
	}
	replace := floor.Load + floor.Delete
	fmt.Printf("the kernel alone, the same %d elements over netlink: load %v, delete %v\n",
		floor.Elements, floor.Load.Round(time.Millisecond), floor.Delete.Round(time.Millisecond))
	fmt.Printf("  full sync / kernel load: %.2f;  resync / kernel load + delete: %.2f\n",
		fullSync.Seconds()/floor.Load.Seconds(), resync.Seconds()/replace.Seconds())
	return nil
}

// writeHeapProfile prints the live heap after the syncs, the state handed in
// included (as the agent holds it), and writes it to memProfile if asked.
func writeHeapProfile(state datapath.NodeState) error {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("live heap after the syncs (the state handed in included): %d MiB\n", ms.HeapAlloc>>20)
	runtime.KeepAlive(state)
	if memProfile == "" {
		return nil
	}
	f, err := os.Create(memProfile)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}

// pairedSyncs times the same two syncs again, each paired with the
// kernel's own cost measured just before it, and each measurement started
// once the kernel has freed what the one before deleted (see settle): the
// pairs see the machine alike, where the figures of fullSyncs are single.
func pairedSyncs(ctx context.Context, dp *datapath.Datapath, state datapath.NodeState, pairs int) error {
	var syncs, resyncs pairedRuns
	for range pairs {
		if err := syncs.add(ctx, state, false, func() error {
			if err := dp.Cleanup(ctx); err != nil {
				return err
			}
			settle()
			return nil
		}, func() error { return dp.Apply(ctx, state) }); err != nil {
			return err
		}
		if err := resyncs.add(ctx, state, true, nil, func() error { return dp.Resync(ctx) }); err != nil {
			return err
		}
	}
	syncs.print("full sync into an empty table", "load")
	resyncs.print("full resync replacing the table", "load + delete")
	return nil
}

// partialSyncs times one endpoint of one service changing, and one service
// added, as the agent would apply them: over the netlink socket the
// datapath keeps for element changes, and, as the baseline in the same
// run, through nft as before it (a new Datapath over the same table each
// time the way changes), in turns. It returns the number of the next
// service to add.
func partialSyncs(ctx context.Context, state *datapath.NodeState, n, changes, adds int) (next int, err error) {
	change := func(c int) {
		key := datapath.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", (c*7919)%n)}
		svc := *state.Services[key]
		port := svc.Ports[0]
		port.Endpoints = slices.Clone(port.Endpoints)
		port.Endpoints[c%10].Addr = addr4(10, 250, c>>8, c)
		svc.Ports = []datapath.ServicePort{port}
		state.Services[key] = &svc
		state.Changed = []datapath.ServiceKey{key} // as the agent's syncer names it
	}
	took, added := map[bool][]time.Duration{}, map[bool][]time.Duration{}
	c, next := 0, n
	changesPerRound, addsPerRound := max(changes/4, 1), max(adds/4, 1)
	for round := range 4 {
		overNft := round%2 == 1
		dp, err := newDatapath(datapath.Config{Log: debugLog}, overNft)
		if err != nil {
			return next, err
		}
		if err := dp.Apply(ctx, *state); err != nil {
			return next, err
		}
		for range changesPerRound {
			change(c)
			c++
			start := time.Now()
			if err := dp.Apply(ctx, *state); err != nil {
				return next, err
			}
			took[overNft] = append(took[overNft], time.Since(start))
		}
		for range addsPerRound {
			add := service(next)
			next++
			state.Services[add.Key] = add
			state.Changed = []datapath.ServiceKey{add.Key}
			start := time.Now()
			if err := dp.Apply(ctx, *state); err != nil {
				return next, err
			}
			added[overNft] = append(added[overNft], time.Since(start))
		}
	}
	for _, overNft := range []bool{false, true} {
		how := "over netlink"
		if overNft {
			how = "through nft (baseline)"
		}
		printPercentiles(fmt.Sprintf("one endpoint change, %-22s", how), took[overNft])
		printPercentiles(fmt.Sprintf("adding one service, %-22s", how), added[overNft])
	}
	return next, nil
}

// printPercentiles prints what took d's durations.
func printPercentiles(what string, d []time.Duration) {
	slices.Sort(d)
	fmt.Printf("%s (%d samples): p50 %v  p90 %v  p99 %v  max %v\n", what, len(d),
		d[len(d)/2].Round(10*time.Microsecond), d[len(d)*9/10].Round(10*time.Microsecond),
		d[len(d)*99/100].Round(10*time.Microsecond), d[len(d)-1].Round(10*time.Microsecond))
}

// restartRuns times a restarted agent: a new Datapath that finds the
// table and converges on the state. Twice per restart: on the state the
// table holds (adopted, paired with the kernel's load of it), then on the
// state changed a little while it was away (service next-1, the last one
// added: loaded into the other generation, paired like the syncs of
// pairedSyncs).
func restartRuns(ctx context.Context, state datapath.NodeState, next, restarts int) error {
	var unchanged, changed pairedRuns
	var firstChange []time.Duration
	var dp *datapath.Datapath
	restart := func() error {
		var err error
		if dp, err = datapath.NewForNode(datapath.Config{Log: debugLog}); err != nil {
			return err
		}
		return dp.Apply(ctx, state)
	}
	for r := range restarts {
		if err := unchanged.add(ctx, state, false, nil, restart); err != nil {
			return err
		}
		// A change right after an adopting restart waits for the
		// bookkeeping the adoption left to the background.
		c := service(next - 1)
		c.Ports[0].Endpoints[1].Addr = addr4(10, 252, r>>8, r)
		state.Services[c.Key] = c
		state.Changed = []datapath.ServiceKey{c.Key}
		start := time.Now()
		if err := dp.Apply(ctx, state); err != nil {
			return err
		}
		firstChange = append(firstChange, time.Since(start))
		state.Changed = nil
		c = service(next - 1) // the last one added, changed while the agent was away
		c.Ports[0].Endpoints[0].Addr = addr4(10, 251, r>>8, r)
		state.Services[c.Key] = c
		if err := changed.add(ctx, state, true, nil, restart); err != nil {
			return err
		}
	}
	unchanged.print("agent restart to converged, state unchanged (adopted)", "load")
	if len(firstChange) > 0 {
		printPercentiles("one endpoint change right after it", firstChange)
	}
	changed.print("agent restart to converged, state changed", "load + delete")
	return nil
}

// settle waits until the kernel has freed what nf_tables transactions
// deleted: closing a netfilter netlink socket waits for that.
func settle() {
	if c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil); err == nil {
		c.Close()
	}
}

// pairedRuns are timed runs, each with the kernel's own cost of the same
// elements measured just before it.
type pairedRuns struct {
	took, floor []time.Duration
}

// add measures the kernel's load (and delete, withDelete) of state's
// elements, then, after prepare, times run; each from a settled kernel.
func (p *pairedRuns) add(ctx context.Context, state datapath.NodeState, withDelete bool, prepare, run func() error) error {
	settle()
	f, err := benchhook.KernelLoadFloor(ctx, state, datapath.Config{})
	if err != nil {
		return err
	}
	floor := f.Load
	if withDelete {
		floor += f.Delete
	}
	settle()
	if prepare != nil {
		if err := prepare(); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := run(); err != nil {
		return err
	}
	p.took = append(p.took, time.Since(start))
	p.floor = append(p.floor, floor)
	return nil
}

func (p *pairedRuns) print(what, floorWhat string) {
	n := len(p.took)
	if n == 0 {
		return
	}
	ratios := make([]float64, n)
	for i := range n {
		ratios[i] = p.took[i].Seconds() / p.floor[i].Seconds()
	}
	took, floor := slices.Sorted(slices.Values(p.took)), slices.Sorted(slices.Values(p.floor))
	slices.Sort(ratios)
	fmt.Printf("%s (%d, each after the kernel's own): p50 %v  max %v;  kernel %s p50 %v;  ratio p50 %.2f  max %.2f\n",
		what, n, took[n/2].Round(time.Millisecond), took[n-1].Round(time.Millisecond), floorWhat,
		floor[n/2].Round(time.Millisecond), ratios[n/2], ratios[n-1])
}

// newDatapath is the node's datapath; overNft commits its element changes
// through nft, as every change went before.
func newDatapath(cfg datapath.Config, overNft bool) (*datapath.Datapath, error) {
	if overNft {
		return benchhook.NewForNodeOverNft(cfg)
	}
	return datapath.NewForNode(cfg)
}
