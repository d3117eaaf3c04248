package main

// Storms: sustained endpoint churn, as a rolling update of large
// Deployments or a node failure that moves thousands of pods makes it,
// written through the API and timed into every node.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bench/fanoutfloor"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// stormPhase is one storm: rate endpoint changes a second for dur, or,
// with rate 0, a burst of burst changes written as fast as the API takes
// them (a cluster restart, a rack's pods moved at once).
type stormPhase struct {
	rate  int
	dur   time.Duration
	burst int
}

func (p stormPhase) String() string {
	if p.rate == 0 {
		return fmt.Sprintf("a burst of %d changes", p.burst)
	}
	return fmt.Sprintf("%d changes/s for %v", p.rate, p.dur)
}

// parseStorms reads -storm: rates a second, comma-separated, each run for
// dur, then a burst when burst > 0.
func parseStorms(rates string, dur time.Duration, burst int) ([]stormPhase, error) {
	var phases []stormPhase
	for f := range strings.SplitSeq(rates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.Atoi(f)
		if err != nil || r < 1 {
			return nil, fmt.Errorf("-storm %q: rates are positive numbers of changes a second", rates)
		}
		phases = append(phases, stormPhase{rate: r, dur: dur})
	}
	if len(phases) > 0 && dur <= 0 {
		return nil, errors.New("-storm-for: a positive duration")
	}
	if burst > 0 {
		phases = append(phases, stormPhase{burst: burst})
	}
	return phases, nil
}

// Writes carry a tick's changes: every stormTick the pacer hands the
// writers what is due, at most maxBatch slices in one Apply (one
// revision), and what the writers could not take yet joins the next
// tick's, so the batches grow when the API falls behind.
const (
	stormTick     = 10 * time.Millisecond
	maxBatch      = 1000
	stormWriters  = 4
	stormDrainFor = 3 * time.Minute
)

// stormWrite is one Apply of a storm.
type stormWrite struct {
	revision         uint64
	changes          int
	called, accepted time.Time
}

// stormer makes the changes: each moves the first endpoint of one
// service to its next generation (a replaced pod), services taken round
// robin so that no two writes in flight touch the same one.
type stormer struct {
	reg      weirv1.RegistryServiceClient
	nodes    []string
	services int

	mu   sync.Mutex // guards next and gen
	next int
	gen  []int
}

func newStormer(reg weirv1.RegistryServiceClient, nodes []string, services int, gens map[int]int) *stormer {
	s := &stormer{reg: reg, nodes: nodes, services: services, gen: make([]int, services)}
	for i, g := range gens {
		s.gen[i] = g
	}
	return s
}

// request is n changes as one Apply.
func (s *stormer) request(n int) *weirv1.ApplyRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := &weirv1.ApplyRequest{Resources: make([]*weirv1.ApplyResource, 0, n)}
	for range n {
		i := s.next
		s.next = (s.next + 1) % s.services
		s.gen[i]++
		req.Resources = append(req.Resources, &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_EndpointSlice{EndpointSlice: endpointSlice(i, s.gen[i], s.nodes)}})
	}
	return req
}

// run writes one phase and returns its writes in the order they were
// accepted.
func (s *stormer) run(ctx context.Context, p stormPhase) ([]stormWrite, error) {
	jobs := make(chan int)
	var (
		mu     sync.Mutex
		writes []stormWrite
		errs   = make([]error, stormWriters)
		wg     sync.WaitGroup
	)
	for w := range stormWriters {
		wg.Go(func() {
			for n := range jobs {
				req := s.request(n)
				called := time.Now()
				resp, err := s.reg.Apply(ctx, req)
				if err != nil {
					errs[w] = fmt.Errorf("a write of %d changes: %w", n, err)
					// Drain so the pacer never blocks on a dead writer.
					for range jobs {
					}
					return
				}
				mu.Lock()
				writes = append(writes, stormWrite{revision: resp.GetRevision(), changes: n, called: called, accepted: time.Now()})
				mu.Unlock()
			}
		})
	}
	pace(ctx, p, jobs)
	close(jobs)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(writes, func(a, b stormWrite) int { return cmp.Compare(a.revision, b.revision) })
	return writes, ctx.Err()
}

// pace hands jobs what is due every tick until the phase ends: the rate
// times the time elapsed, less what was handed already; a burst, all of
// it as fast as the writers take it. A steady storm ends at its duration
// even when the writers could not take all of it: what the API accepted
// is then its throughput.
func pace(ctx context.Context, p stormPhase, jobs chan<- int) {
	total := p.burst
	if p.rate > 0 {
		total = int(int64(p.rate) * int64(p.dur) / int64(time.Second))
	}
	start := time.Now()
	tick := time.NewTicker(stormTick)
	defer tick.Stop()
	handed := 0
	for handed < total && (p.rate == 0 || time.Since(start) < p.dur) {
		due := total
		if p.rate > 0 {
			due = min(total, int(int64(p.rate)*int64(time.Since(start))/int64(time.Second)))
		}
		// Hand over what is due, maxBatch at a time, while a writer is
		// free (a burst waits for one); the rest waits for the next tick.
		for handed < due && offer(ctx, jobs, min(due-handed, maxBatch), p.rate == 0) {
			handed += min(due-handed, maxBatch)
		}
		if ctx.Err() != nil {
			return
		}
		if handed >= total {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// offer hands n to a writer: at once if one is free, or when one is with
// wait; it reports whether one took it.
func offer(ctx context.Context, jobs chan<- int, n int, wait bool) bool {
	if !wait {
		select {
		case jobs <- n:
			return true
		default:
			return false
		}
	}
	select {
	case jobs <- n:
		return true
	case <-ctx.Done():
		return false
	}
}

// usage is a process's CPU time and memory at one moment.
type usage struct {
	cpu      time.Duration
	rss, hwm int64 // bytes: resident now, and the peak so far
}

// usageOf reads pid's CPU time and memory from /proc.
func usageOf(pid int) (usage, error) {
	u := usage{cpu: fanoutfloor.CPUTime(pid)}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		for key, into := range map[string]*int64{"VmRSS:": &u.rss, "VmHWM:": &u.hwm} {
			if v, ok := strings.CutPrefix(line, key); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				*into = kb << 10
			}
		}
	}
	return u, nil
}

// selfCPU is this program's CPU time: the simulated agents and the writers.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// labUsage is the server's and each real agent's usage, this program's
// CPU, and what the simulated agents received.
type labUsage struct {
	server usage
	// serverHeap is the server's Go heap in use (go_memstats_heap_inuse_bytes).
	serverHeap      int64
	agents          []usage
	self            time.Duration
	bytes, messages int
}

func usageOfLab(c *weirlab.Cluster, sims []*simAgent) (labUsage, error) {
	var u labUsage
	for _, a := range sims {
		a.mu.Lock()
		u.bytes += a.bytes
		u.messages += a.messages
		a.mu.Unlock()
	}
	var err error
	if u.server, err = usageOf(c.Server.Cmd.Process.Pid); err != nil {
		return u, fmt.Errorf("weir-server: %w", err)
	}
	for _, p := range c.Agents {
		a, err := usageOf(p.Cmd.Process.Pid)
		if err != nil {
			return u, fmt.Errorf("weir-agent: %w", err)
		}
		u.agents = append(u.agents, a)
	}
	u.self = selfCPU()
	m, err := scrape(context.Background(), c.Control.HTTPClient(10*time.Second), serverMetrics)
	if err != nil {
		return u, fmt.Errorf("weir-server's metrics: %w", err)
	}
	u.serverHeap = int64(m["go_memstats_heap_inuse_bytes"])
	return u, nil
}

// agentLog follows a real agent's JSON log (it runs with --log-level
// debug --log-format json during storms): each state it applied, when its
// kernel transaction had returned, and each stream it opened. update
// reads what was written since the last call.
type agentLog struct {
	path    string
	off     int64
	applied []arrival
	took    []time.Duration // each apply's own time, as the agent logged it
	streams []time.Time
}

func (l *agentLog) update() error {
	f, err := os.Open(l.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(l.off, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			// A line still being written is read again next time.
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		l.off += int64(len(line))
		applied := bytes.Contains(line, []byte(`"msg":"applied state"`))
		if !applied && !bytes.Contains(line, []byte(`"msg":"streaming state from server"`)) {
			continue
		}
		var rec struct {
			Time    time.Time     `json:"time"`
			Version uint64        `json:"version"`
			Took    time.Duration `json:"took"` // slog writes a duration as nanoseconds
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("%s: %w", l.path, err)
		}
		if applied {
			l.applied = append(l.applied, arrival{rec.Version, rec.Time})
			l.took = append(l.took, rec.Took)
		} else {
			l.streams = append(l.streams, rec.Time)
		}
	}
}

// newest is the newest version the agent applied, 0 if none.
func (l *agentLog) newest() uint64 {
	if len(l.applied) == 0 {
		return 0
	}
	return l.applied[len(l.applied)-1].version
}

// runStorms runs each phase and reports it: throughput, the lag at every
// node, CPU per change on each side, memory, and whether any stream was
// reset.
func runStorms(ctx context.Context, c *weirlab.Cluster, phases []stormPhase, st *stormer, sims []*simAgent, failed *failure, profiles string) error {
	logs := make([]*agentLog, len(c.Agents))
	for i, p := range c.Agents {
		logs[i] = &agentLog{path: p.LogPath}
	}
	fmt.Printf("\nstorms: each change moves one endpoint of one service (a replaced pod); a write carries what a %v tick made due,\n"+
		"  at most %d slices in one Apply (one revision), %d writers; services taken round robin\n", stormTick, maxBatch, stormWriters)
	for _, p := range phases {
		before, err := usageOfLab(c, sims)
		if err != nil {
			return err
		}
		profiled := make(chan error, 1)
		if profiles != "" {
			go func() { profiled <- profileServer(ctx, c, p, profiles) }()
		} else {
			profiled <- nil
		}
		start := time.Now()
		writes, err := st.run(ctx, p)
		if err != nil {
			return fmt.Errorf("storm of %v: %w", p, err)
		}
		wrote := time.Now()
		last := writes[len(writes)-1].revision
		if err := waitFor(ctx, failed, stormDrainFor, fmt.Sprintf("every node has revision %d, the storm's last", last), func() bool {
			for _, a := range sims {
				if _, ok := a.receivedAt(last); !ok {
					return false
				}
			}
			for _, l := range logs {
				if l.update() != nil || l.newest() < last {
					return false
				}
			}
			return true
		}); err != nil {
			return fmt.Errorf("storm of %v: %w", p, err)
		}
		drained := time.Now()
		after, err := usageOfLab(c, sims)
		if err != nil {
			return err
		}
		for _, l := range logs {
			if err := l.update(); err != nil {
				return err
			}
		}
		if err := <-profiled; err != nil {
			return err
		}
		reportStorm(p, writes, start, wrote, drained, sims, c.Nodes, logs, before, after)
		if err := stormFloor(ctx, len(sims), after.messages-before.messages, after.bytes-before.bytes, after.server.cpu-before.server.cpu); err != nil {
			return err
		}
		// The next phase starts from a quiet lab.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

// stormFloor measures what the bytes the simulated agents received cost
// over bare TLS sockets on this machine (fanoutfloor): as many messages of
// their mean size to as many agents, back to back.
func stormFloor(ctx context.Context, agents, messages, bytes int, serverCPU time.Duration) error {
	if agents == 0 || messages == 0 {
		return nil
	}
	per := max(1, messages/agents)
	size := bytes / messages
	// At most 1 GB sent: the CPU of the rest is the same per message.
	measured := max(1, min(per, int(1e9/int64(size*agents+1))))
	floor, err := fanoutfloor.Measure(ctx, agents, measured, size, true)
	if err != nil {
		return err
	}
	fmt.Printf("  fanned out: %d messages of %d bytes on average to each of %d simulated agents (%.1f MB in all)\n", per, size, agents, float64(bytes)/1e6)
	fmt.Printf("  the floor for those bytes over bare TLS sockets here: %v of CPU, both ends (%d of the messages measured; the server used %v)\n",
		round(floor.CPU*time.Duration(per)), measured, round(serverCPU))
	return nil
}

// profileServer writes CPU profiles of the server and of the first real
// node's agent over phase p (its first 5 s for a burst) into dir.
func profileServer(ctx context.Context, c *weirlab.Cluster, p stormPhase, dir string) error {
	secs := int(p.dur / time.Second)
	name := fmt.Sprintf("%d-per-s.pprof", p.rate)
	if p.rate == 0 {
		secs, name = 5, fmt.Sprintf("burst-%d.pprof", p.burst)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, who := range []struct {
		name string
		ns   *lab.Netns
		addr string
	}{{"server", c.Control, serverMetrics}, {"agent", c.Nodes[0].Netns, agentMetrics}} {
		wg.Go(func() {
			prof, err := get(ctx, who.ns.HTTPClient(time.Duration(secs+30)*time.Second),
				fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", who.addr, max(1, secs)))
			if err != nil {
				errs[i] = fmt.Errorf("profiling the %s: %w", who.name, err)
				return
			}
			path := filepath.Join(dir, who.name+"-"+name)
			if errs[i] = os.WriteFile(path, prof, 0o644); errs[i] == nil {
				fmt.Printf("  (the %s's CPU profile over %v: %s)\n", who.name, p, path)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// lags are latencies each standing for some changes: a write's lag at a
// node counts once for every change it carried.
type lags []lag

type lag struct {
	d       time.Duration
	changes int
}

// quantile is the lag below which q of the changes were.
func (l lags) quantile(q float64) time.Duration {
	s := slices.SortedFunc(slices.Values(l), func(a, b lag) int { return cmp.Compare(a.d, b.d) })
	total := 0
	for _, x := range s {
		total += x.changes
	}
	seen := 0
	for _, x := range s {
		if seen += x.changes; float64(seen) >= q*float64(total) {
			return x.d
		}
	}
	return s[len(s)-1].d
}

func (l lags) String() string {
	if len(l) == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %8v  p99 %8v  max %8v", round(l.quantile(0.5)), round(l.quantile(0.99)), round(l.quantile(1)))
}

func reportStorm(p stormPhase, writes []stormWrite, start, wrote, drained time.Time, sims []*simAgent, nodes []*lab.Node, logs []*agentLog, before, after labUsage) {
	changes := 0
	var writeTook durations
	for _, w := range writes {
		changes += w.changes
		writeTook = append(writeTook, w.accepted.Sub(w.called))
	}
	span := wrote.Sub(start)
	fmt.Printf("\n%v: %d changes in %d writes accepted in %v (%.0f changes/s); every node had the last %v after its write returned\n",
		p, changes, len(writes), round(span), float64(changes)/span.Seconds(), round(drained.Sub(wrote)))
	fmt.Printf("  %-44s %v\n", "a write (Apply, call to answer)", writeTook)
	// Each write's lag at each node: from its call to the node first
	// holding its revision (a later one when the server or the stream
	// coalesced it). The server sends a change before it answers the
	// write, so the call bounds the lag from above and the answer from
	// below.
	perNode := make([]lags, len(sims)+len(logs))
	var simLag, kernelLag, simFromAnswer, kernelFromAnswer lags
	for _, w := range writes {
		for i, a := range sims {
			at, _ := a.receivedAt(w.revision)
			perNode[i] = append(perNode[i], lag{at.Sub(w.called), w.changes})
			simFromAnswer = append(simFromAnswer, lag{at.Sub(w.accepted), w.changes})
		}
		for i, l := range logs {
			if at, ok := firstFrom(l.applied, w.revision); ok {
				perNode[len(sims)+i] = append(perNode[len(sims)+i], lag{at.Sub(w.called), w.changes})
				kernelFromAnswer = append(kernelFromAnswer, lag{at.Sub(w.accepted), w.changes})
			}
		}
	}
	for i, l := range perNode {
		if i < len(sims) {
			simLag = append(simLag, l...)
		} else {
			kernelLag = append(kernelLag, l...)
		}
	}
	fmt.Println("  each change's lag at every node, from its write's call (an upper bound) to:")
	fmt.Printf("  %-44s %v\n", "a simulated agent has it (all of them)", simLag)
	fmt.Printf("  %-44s %v\n", "a real node's kernel has it", kernelLag)
	fmt.Println("  the same from the write's answer (a lower bound: the change can be out before):")
	fmt.Printf("  %-44s %v\n", "a simulated agent has it", simFromAnswer)
	fmt.Printf("  %-44s %v\n", "a real node's kernel has it", kernelFromAnswer)
	var worst time.Duration
	worstName := ""
	for i, l := range perNode {
		if len(l) == 0 {
			continue
		}
		if p99 := l.quantile(0.99); p99 > worst {
			worst = p99
			if i < len(sims) {
				worstName = sims[i].name
			} else {
				worstName = nodes[i-len(sims)].Name
			}
		}
	}
	fmt.Printf("  %-44s %v (%s)\n", "the worst node's p99", round(worst), worstName)
	during := func(t time.Time) bool { return !t.Before(start) && !t.After(drained) }
	for i, n := range nodes {
		states, streams := 0, 0
		var took durations
		for k, a := range logs[i].applied {
			if during(a.at) {
				states++
				took = append(took, logs[i].took[k])
			}
		}
		for _, t := range logs[i].streams {
			if during(t) {
				streams++
			}
		}
		cpu := after.agents[i].cpu - before.agents[i].cpu
		fmt.Printf("  %s: kernel lag %v; applied %d states for %d writes; %d streams opened; CPU %v per change (%v in all); RSS %d -> %d MiB (peak so far %d MiB)\n",
			n.Name, perNode[len(sims)+i], states, len(writes), streams, perChange(cpu, changes), round(cpu),
			before.agents[i].rss>>20, after.agents[i].rss>>20, after.agents[i].hwm>>20)
		fmt.Printf("    %s's applies (the datapath's transaction and building it): %v\n", n.Name, took)
	}
	states := 0
	for _, a := range sims {
		a.mu.Lock()
		for _, s := range a.arrivals {
			if during(s.at) {
				states++
			}
		}
		a.mu.Unlock()
	}
	fmt.Printf("  simulated agents: %.1f states each on average for %d writes\n", float64(states)/float64(max(1, len(sims))), len(writes))
	serverCPU := after.server.cpu - before.server.cpu
	fmt.Printf("  weir-server: CPU %v per change (%v in all, %.0f%% of a core over the storm and its drain); RSS %d -> %d MiB (peak so far %d MiB); Go heap in use %d -> %d MiB\n",
		perChange(serverCPU, changes), round(serverCPU), 100*serverCPU.Seconds()/drained.Sub(start).Seconds(),
		before.server.rss>>20, after.server.rss>>20, after.server.hwm>>20, before.serverHeap>>20, after.serverHeap>>20)
	self := after.self - before.self
	fmt.Printf("  this program (writers and %d simulated agents): CPU %v per change (%v in all)\n",
		len(sims), perChange(self, changes), round(self))
}

// perChange is d shared among n changes, to the 10 ns.
func perChange(d time.Duration, n int) time.Duration {
	return (d / time.Duration(max(1, n))).Round(10 * time.Nanosecond)
}
