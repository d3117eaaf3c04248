// Command kubeproxy measures the real kube-proxy nftables proxier
// (k8s.io/kubernetes/pkg/proxy/nftables, the version in go.mod) on the
// workload of test/bench/datapath, so the two can be read side by side: a
// full sync into an empty table, a forced full resync, their peak memory
// with nft, and the latency of a one-endpoint change and of adding a
// service on that table.
//
// The proxier gets the Services and EndpointSlices through its event
// handlers, as kube-proxy's informers would hand them over, with no
// apiserver. This is its own Go module, so run it from its directory, as
// root:
//
//	cd test/bench/kubeproxy && go run . -services 10000
//
// With -storm it then makes test/bench/endtoend's storms (storm.go).
//
// It runs itself inside a network namespace it creates and removes. Into
// the empty table kube-proxy's first sync logs "Failed to list existing
// nftables objects" (the table is not there yet); that error is expected,
// and any other, or a failed transaction, stops the bench.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	proxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/metrics"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

const insideEnv = "WEIR_BENCH_NETNS"

const (
	nodeName    = "bench"
	clusterCIDR = "10.128.0.0/9" // holds every endpoint address below
	serviceCIDR = "10.96.0.0/12" // holds every cluster IP below
)

var nodeIP = addr4(192, 0, 2, 11)

func main() {
	services := flag.Int("services", 10000, "services to program")
	changes := flag.Int("changes", 50, "one-endpoint changes to time")
	verbosity := flag.Int("v", 0, "kube-proxy's log verbosity (its errors show at any level)")
	storms := flag.String("storm", "", "after the changes, storms at these rates of endpoint changes a second, comma-separated (as test/bench/endtoend's -storm)")
	stormFor := flag.Duration("storm-for", 10*time.Second, "how long each storm of -storm lasts")
	burst := flag.Int("storm-burst", 0, "after the storms, a burst of this many endpoint changes handed over at once")
	minSync := flag.Duration("min-sync-period", time.Second, "during storms, the least time from one sync's start to the next (kube-proxy's --min-sync-period; its default)")
	programNodeIP := flag.String("program-node", "", "for test/bench/packetrate: program this node (its address) in the current network namespace and exit, with -services fillers and -program-ports")
	programPod := flag.String("program-pod", "", "with -program-node: the pod behind every -program-ports service")
	programPorts := flag.String("program-ports", "", "with -program-node: node-port services, protocol:nodePort:podPort, comma-separated")
	flag.Parse()
	if *programNodeIP != "" {
		node, err1 := netip.ParseAddr(*programNodeIP)
		pod, err2 := netip.ParseAddr(*programPod)
		if err1 != nil || err2 != nil {
			fmt.Fprintln(os.Stderr, "bench: -program-node and -program-pod take IPv4 addresses")
			os.Exit(2)
		}
		if err := programNode(node, pod, *programPorts, *services); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	phases, err := parseStorms(*storms, *stormFor, *burst)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if os.Getenv(insideEnv) == "" {
		os.Exit(reexec())
	}
	if err := run(*services, *changes, *verbosity, phases, *minSync); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// reexec runs this program again inside a fresh network namespace, so the
// nft processes kube-proxy starts touch only that namespace.
func reexec() int {
	ns := fmt.Sprintf("weir-bench-kubeproxy-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: ip netns add: %v: %s (run as root)\n", err, out)
		return 1
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	// The node's address on an interface, as on a real node: kube-proxy's
	// default --nodeport-addresses (primary) finds it there for its
	// nodeport-ips set. Loopback needs no kernel module, as dummy would.
	for _, args := range [][]string{
		{"addr", "add", nodeIP.String() + "/32", "dev", "lo"},
		{"link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: ip %s: %v: %s\n", strings.Join(args, " "), err, out)
			return 1
		}
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), insideEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// A signal here goes on to the child and this process lives to delete
	// the namespace, instead of dying and leaving it behind.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	if err := cmd.Wait(); err != nil {
		return 1
	}
	return 0
}

// rssPeak is the largest resident memory seen, of this process alone and
// together with the nft processes it runs at that moment.
type rssPeak struct{ self, total atomic.Int64 }

var peak rssPeak

// sampleRSS samples /proc every 2 ms until the returned func is called:
// getrusage cannot tell a child's own peak from the memory it shared with
// this process until it exec'ed. (The same sampling as test/bench/datapath,
// which is another module's main package.)
func sampleRSS(p *rssPeak) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	me := os.Getpid()
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			self := rssOf(me)
			total := self
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				pid, err := strconv.Atoi(e.Name())
				if err != nil || pid == me {
					continue
				}
				stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				// "pid (comm) state ppid ..."
				if err != nil || !strings.Contains(string(stat), "(nft)") {
					continue
				}
				fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
				if len(fields) > 1 && fields[1] == strconv.Itoa(me) {
					total += rssOf(pid)
				}
			}
			if self > p.self.Load() {
				p.self.Store(self)
			}
			if total > p.total.Load() {
				p.total.Store(total)
			}
		}
	}()
	return func() { close(done); <-finished }
}

// rssOf reads a process's resident memory in bytes.
func rssOf(pid int) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func addr4(a, b, c, d int) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(a), byte(b), byte(c), byte(d)})
}

// service is test/bench/datapath's service(i) as the apiserver would hand
// it to kube-proxy: the Service with the fields its defaulting fills in,
// and one EndpointSlice with the 10 ready endpoints.
func service(i int) (*v1.Service, *discovery.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	clusterIP := addr4(10, 96+i>>16, i>>8, i).String()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeClusterIP,
			ClusterIP:             clusterIP,
			ClusterIPs:            []string{clusterIP},
			IPFamilies:            []v1.IPFamily{v1.IPv4Protocol},
			IPFamilyPolicy:        ptr.To(v1.IPFamilyPolicySingleStack),
			SessionAffinity:       v1.ServiceAffinityNone,
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
			Ports: []v1.ServicePort{{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	if i%100 == 0 {
		k := i / 100 // one address each (100.64.0.0/10 holds them all)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
		svc.Spec.Ports[0].NodePort = int32(30000 + i/100)
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{
			IP: addr4(100, 64+k>>16, k>>8, k).String(), IPMode: ptr.To(v1.LoadBalancerIPModeVIP),
		}}
	}
	slice := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: name + "-bench",
			Labels: map[string]string{discovery.LabelServiceName: name},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080),
		}},
	}
	for j := range 10 {
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
			Addresses: []string{addr4(10, 128+j, i>>8, i).String()},
			Conditions: discovery.EndpointConditions{
				Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false),
			},
		})
	}
	return svc, slice
}

// errorLogs counts the errors kube-proxy logs: it logs a failed sync
// instead of returning it to whoever asked for it.
type errorLogs struct {
	all atomic.Int64
	// notFound are errors nft gave because an object did not exist: the
	// first sync lists its table before creating it and logs that.
	notFound atomic.Int64
}

// countErrors passes every log line on and counts the errors.
type countErrors struct {
	logr.LogSink
	counts *errorLogs
}

func (c countErrors) Error(err error, msg string, kv ...any) {
	c.counts.all.Add(1)
	if knftables.IsNotFound(err) {
		c.counts.notFound.Add(1)
	}
	c.LogSink.Error(err, msg, kv...)
}

func (c countErrors) WithValues(kv ...any) logr.LogSink {
	return countErrors{c.LogSink.WithValues(kv...), c.counts}
}

func (c countErrors) WithName(name string) logr.LogSink {
	return countErrors{c.LogSink.WithName(name), c.counts}
}

// WithCallDepth keeps the counting when klog asks for its callers' lines.
func (c countErrors) WithCallDepth(depth int) logr.LogSink {
	if s, ok := c.LogSink.(logr.CallDepthLogSink); ok {
		return countErrors{s.WithCallDepth(depth), c.counts}
	}
	return c
}

// logToStderr sends klog, and the proxier's contextual logger with it, to
// stderr at the given verbosity, and counts the errors logged.
func logToStderr(verbosity int) *errorLogs {
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	flags.Set("v", strconv.Itoa(verbosity))
	counts := new(errorLogs)
	text := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(verbosity), textlogger.Output(os.Stderr)))
	klog.SetLoggerWithOptions(logr.New(countErrors{text.GetSink(), counts}), klog.ContextualLogger(true))
	return counts
}

// syncRecord is what kube-proxy has recorded about its syncs so far.
type syncRecord struct {
	full, partial uint64  // syncs that reached the end, by kind
	failures      float64 // nftables transactions that failed, stale-chain deletions too
	errorLogs     int64
	notFoundLogs  int64
}

func recordOf(logs *errorLogs) (syncRecord, error) {
	family := string(v1.IPv4Protocol)
	var r syncRecord
	var errs [4]error
	var syncFailures, cleanupFailures float64
	r.full, errs[0] = testutil.GetHistogramMetricCount(metrics.SyncFullProxyRulesLatency.WithLabelValues(family))
	r.partial, errs[1] = testutil.GetHistogramMetricCount(metrics.SyncPartialProxyRulesLatency.WithLabelValues(family))
	syncFailures, errs[2] = testutil.GetCounterMetricValue(metrics.NFTablesSyncFailuresTotal.WithLabelValues(family))
	cleanupFailures, errs[3] = testutil.GetCounterMetricValue(metrics.NFTablesCleanupFailuresTotal.WithLabelValues(family))
	r.failures = syncFailures + cleanupFailures
	r.errorLogs = logs.all.Load()
	r.notFoundLogs = logs.notFound.Load()
	for _, err := range errs {
		if err != nil {
			return r, fmt.Errorf("reading kube-proxy's metrics: %w", err)
		}
	}
	return r, nil
}

// checkSync fails unless exactly one sync of the wanted kind ran between
// the two records without a failed transaction or an error logged, so a
// sync that did nothing or failed is never reported as a fast one. Into an
// empty table kube-proxy first lists a table that is not there yet and logs
// nft's "No such file or directory" as an error; only that is let through.
func checkSync(before, after syncRecord, wantFull, tableMissing bool) error {
	errors := after.errorLogs - before.errorLogs
	if tableMissing {
		errors -= after.notFoundLogs - before.notFoundLogs
	}
	switch {
	case after.failures > before.failures:
		return fmt.Errorf("kube-proxy's nftables transaction failed (its log is above)")
	case errors > 0:
		return fmt.Errorf("kube-proxy logged %d errors during the sync (above)", errors)
	case after.full+after.partial != before.full+before.partial+1:
		return fmt.Errorf("kube-proxy ran %d syncs, want 1", after.full+after.partial-before.full-before.partial)
	case wantFull && after.full == before.full:
		return fmt.Errorf("kube-proxy ran a partial sync, want a full one")
	case !wantFull && after.partial == before.partial:
		return fmt.Errorf("kube-proxy ran a full sync, want a partial one")
	}
	return nil
}

// checkProgrammed reads kube-proxy's table back with nft and fails unless
// every service has its chain dispatching to exactly its endpoints, and its
// addresses and node ports are in the maps: a sync that quietly wrote less
// would look fast. want holds each service's slice, for services 0 to n-1.
func checkProgrammed(want []*discovery.EndpointSlice) (string, error) {
	out, err := exec.Command("nft", "list", "table", "ip", "kube-proxy").Output()
	if err != nil {
		return "", fmt.Errorf("nft list table: %w", err)
	}
	// The table's objects open with "\t<kind> <name> {" and close with
	// "\t}"; keep each one's text by "<kind> <name>".
	body := map[string]string{}
	var open string
	var text strings.Builder
	for line := range strings.SplitSeq(string(out), "\n") {
		switch {
		case open == "" && strings.HasPrefix(line, "\t") && strings.HasSuffix(line, " {"):
			open = strings.TrimSuffix(strings.TrimPrefix(line, "\t"), " {")
			text.Reset()
		case open != "" && line == "\t}":
			body[open] = text.String()
			open = ""
		case open != "":
			text.WriteString(line + "\n")
		}
	}
	// A service chain "service-HASH-bench/svc-1/tcp/http" DNATs to its
	// endpoints, each written "10.128.0.1 . 8080".
	endpoint := regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. 8080`)
	got := map[string][]string{}
	external := 0
	for key, text := range body {
		name, ok := strings.CutPrefix(key, "chain ")
		parts := strings.Split(name, "/")
		if !ok || len(parts) != 4 {
			continue
		}
		switch {
		case strings.HasPrefix(name, "service-"):
			got[parts[1]] = []string{}
			for _, m := range endpoint.FindAllStringSubmatch(text, -1) {
				got[parts[1]] = append(got[parts[1]], m[1])
			}
		case strings.HasPrefix(name, "external-"):
			external++
		}
	}
	if len(got) != len(want) {
		return "", fmt.Errorf("kube-proxy's table has %d service chains, want %d", len(got), len(want))
	}
	for _, slice := range want {
		name := slice.Labels[discovery.LabelServiceName]
		var addrs []string
		for _, e := range slice.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		slices.Sort(addrs)
		slices.Sort(got[name])
		if !slices.Equal(got[name], addrs) {
			return "", fmt.Errorf("kube-proxy's chain for %s sends to %v, want %v", name, got[name], addrs)
		}
	}
	lbs := (len(want) + 99) / 100
	serviceIPs := strings.Count(body["map service-ips"], " : goto ")
	nodePorts := strings.Count(body["map service-nodeports"], " : goto ")
	if external != lbs || serviceIPs != len(want)+lbs || nodePorts != lbs {
		return "", fmt.Errorf("kube-proxy's table has %d external chains, %d service-ips and %d service-nodeports elements, want %d, %d and %d",
			external, serviceIPs, nodePorts, lbs, len(want)+lbs, lbs)
	}
	if !strings.Contains(body["set nodeport-ips"], nodeIP.String()) {
		return "", fmt.Errorf("kube-proxy's nodeport-ips set lacks the node's address %s", nodeIP)
	}
	return fmt.Sprintf("%d service chains each to its own 10 endpoints, %d external chains, %d service-ips and %d service-nodeports elements",
		len(got), external, serviceIPs, nodePorts), nil
}

// versions names the kube-proxy built in and the nft it runs.
func versions() string {
	kubernetes := "k8s.io/kubernetes (version unknown)"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "k8s.io/kubernetes" {
				kubernetes = m.Path + " " + m.Version
			}
		}
	}
	nft, _ := exec.Command("nft", "--version").Output()
	return fmt.Sprintf("kube-proxy nftables proxier from %s, %s", kubernetes, strings.TrimSpace(string(nft)))
}

func run(n, changes, verbosity int, phases []stormPhase, minSync time.Duration) error {
	logs := logToStderr(verbosity)
	metrics.RegisterMetrics(proxyconfig.ProxyModeNFTables)
	ctx := context.Background()
	// kube-proxy's defaults where the brief leaves them open: masquerade bit
	// 14, the node IP as the only node-port address (--nodeport-addresses
	// primary); a 1 h sync period so no timer sync lands in a measurement.
	proxier, err := nftables.NewProxier(ctx, v1.IPv4Protocol, time.Hour, 0, false, 14,
		proxyutil.NewDetectLocalByCIDR(clusterCIDR), nodeName, net.IP(nodeIP.AsSlice()),
		&events.FakeRecorder{}, nil, []string{nodeIP.String() + "/32"}, false)
	if err != nil {
		return err
	}
	// timedSync times events, handed to the proxier, and the one sync that
	// takes them in. The proxier exports no synchronous sync: Sync only
	// queues a run for SyncLoop's goroutine, which this program does not
	// start. What the informers do last at startup, OnEndpointSlicesSynced,
	// marks slices synced (already true after the first call) and then runs
	// syncProxyRules itself, so calling it again is one plain sync.
	timedSync := func(wantFull bool, events func()) (time.Duration, error) {
		before, err := recordOf(logs)
		if err != nil {
			return 0, err
		}
		tableMissing := exec.Command("nft", "list", "table", "ip", "kube-proxy").Run() != nil
		start := time.Now()
		events()
		proxier.OnEndpointSlicesSynced()
		took := time.Since(start)
		after, err := recordOf(logs)
		if err != nil {
			return took, err
		}
		return took, checkSync(before, after, wantFull, tableMissing)
	}

	stopSampling := sampleRSS(&peak)
	fmt.Println(versions())
	fmt.Printf("workload: %d services x 1 TCP port x 10 endpoints, %d LoadBalancer with node ports, IPv4\n", n, (n+99)/100)

	current := make([]*discovery.EndpointSlice, n) // what the proxier was last handed, by service
	start := time.Now()
	for i := range n {
		svc, slice := service(i)
		proxier.OnServiceAdd(svc)
		proxier.OnEndpointSliceAdd(slice)
		current[i] = slice
	}
	// A cluster hands over its ServiceCIDRs too; kube-proxy drops traffic
	// to unallocated addresses in them.
	proxier.OnServiceCIDRsChanged([]string{serviceCIDR})
	// Services first: the proxier syncs nothing until both kinds are in.
	proxier.OnServiceSynced()
	fmt.Printf("objects handed to its handlers:      %v\n", time.Since(start).Round(time.Millisecond))

	took, err := timedSync(true, func() {})
	if err != nil {
		return fmt.Errorf("full sync into an empty table: %w", err)
	}
	fmt.Printf("full sync into an empty table:       %v\n", took.Round(time.Millisecond))

	// kube-proxy resyncs everything when something may have gone out of
	// step (a failed sync, a topology change, FullSyncPeriod); a topology
	// change is the exported way to ask for one.
	took, err = timedSync(true, func() { proxier.OnTopologyChange(map[string]string{}) })
	if err != nil {
		return fmt.Errorf("full resync: %w", err)
	}
	fmt.Printf("full resync of the same state:       %v\n", took.Round(time.Millisecond))

	stopSampling()
	fmt.Printf("peak RSS during the syncs: this process + its nft processes together %d MiB (this process alone %d MiB)\n",
		peak.total.Load()>>20, peak.self.Load()>>20)
	programmed, err := checkProgrammed(current)
	if err != nil {
		return fmt.Errorf("after the full syncs: %w", err)
	}
	fmt.Println("programmed:", programmed)

	// One endpoint of one service changes, as in test/bench/datapath: the
	// proxier is handed the updated slice and syncs only that service.
	var changed []time.Duration
	for c := range changes {
		i := (c * 7919) % n
		old := current[i]
		updated := old.DeepCopy()
		updated.Endpoints[c%10].Addresses = []string{addr4(10, 250, c>>8, c).String()}
		current[i] = updated
		took, err := timedSync(false, func() { proxier.OnEndpointSliceUpdate(old, updated) })
		if err != nil {
			return fmt.Errorf("endpoint change %d: %w", c, err)
		}
		changed = append(changed, took)
	}
	const adds = 5
	var added []time.Duration
	for range adds {
		svc, slice := service(len(current))
		current = append(current, slice)
		took, err := timedSync(false, func() {
			proxier.OnServiceAdd(svc)
			proxier.OnEndpointSliceAdd(slice)
		})
		if err != nil {
			return fmt.Errorf("adding %s: %w", svc.Name, err)
		}
		added = append(added, took)
	}
	if programmed, err = checkProgrammed(current); err != nil {
		return fmt.Errorf("after the changes: %w", err)
	}
	fmt.Println("programmed:", programmed)

	const how = "kube-proxy (nft)"
	if d := changed; len(d) > 0 {
		slices.Sort(d)
		fmt.Printf("one endpoint change, %-22s (%d samples): p50 %v  p90 %v  p99 %v  max %v\n", how, len(d),
			d[len(d)/2].Round(10*time.Microsecond), d[len(d)*9/10].Round(10*time.Microsecond),
			d[len(d)*99/100].Round(10*time.Microsecond), d[len(d)-1].Round(10*time.Microsecond))
	}
	a := added
	slices.Sort(a)
	fmt.Printf("adding one service, %-22s (%d samples): p50 %v  max %v\n", how, len(a),
		a[len(a)/2].Round(10*time.Microsecond), a[len(a)-1].Round(10*time.Microsecond))
	if len(phases) == 0 {
		return nil
	}

	// Storms: the same churn as test/bench/endtoend's, handed over while
	// the proxier syncs as its loop would.
	st := &stormer{current: current, gen: make([]int, len(current)), update: proxier.OnEndpointSliceUpdate}
	var full, partial uint64
	stormSync := func() error {
		before, err := recordOf(logs)
		if err != nil {
			return err
		}
		proxier.OnEndpointSlicesSynced()
		after, err := recordOf(logs)
		if err != nil {
			return err
		}
		full += after.full - before.full
		partial += after.partial - before.partial
		switch {
		case after.failures > before.failures:
			return fmt.Errorf("kube-proxy's nftables transaction failed (its log is above)")
		case after.errorLogs > before.errorLogs:
			return fmt.Errorf("kube-proxy logged %d errors during a sync (above)", after.errorLogs-before.errorLogs)
		}
		return nil
	}
	fmt.Printf("\nstorms: each change moves one endpoint of one service, services round robin; every %v the changes due are handed\n"+
		"  to OnEndpointSliceUpdate, while this program syncs as kube-proxy's loop does (once changes are pending, starts %v apart at least)\n", stormTick, minSync)
	for _, p := range phases {
		full, partial = 0, 0
		peak.self.Store(0)
		peak.total.Store(0)
		stopSampling := sampleRSS(&peak)
		self0, children0 := cpuTime()
		start := time.Now()
		batches, runs, err := runStorm(p, st, minSync, stormSync)
		took := time.Since(start)
		self1, children1 := cpuTime()
		stopSampling()
		if err != nil {
			return fmt.Errorf("storm of %v: %w", p, err)
		}
		reportStorm(p, minSync, batches, runs, took, self1-self0, children1-children0)
		fmt.Printf("  %d full syncs and %d partial; peak RSS this process + its nft processes %d MiB (this process alone %d MiB)\n",
			full, partial, peak.total.Load()>>20, peak.self.Load()>>20)
	}
	if programmed, err = checkProgrammed(current); err != nil {
		return fmt.Errorf("after the storms: %w", err)
	}
	fmt.Println("programmed:", programmed)
	return nil
}
