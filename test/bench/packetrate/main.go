// Command packetrate checks, with real packets in a lab, that the datapath's
// per-packet cost does not grow with the number of services, and that the
// random endpoint choice is uniform:
//
//   - the rate of new TCP connections through a node port with 10,000
//     services programmed, against the rate with 10 (phases alternate, in
//     one run, so the ratio survives a noisy machine);
//
//   - 10,000 connections to a service with 10 endpoints, counted per
//     endpoint, and a chi-square test of uniformity at p = 0.001;
//
//   - with -distinct K (and -endpoints above K), the same rates when the
//     filler services have K distinct endpoint counts, each with a node
//     port: the measured service's rule is then the last of K+1 a new
//     connection walks in the node ports' pick chain (the worst case of
//     the layout, which holds one rule per distinct count);
//
//   - round trips of one byte on established connections, and new
//     connections, with the rules that pass moved connections on and
//     without them (phases alternate): what those rules cost the packets
//     they do not move.
//
//     go run ./test/bench/packetrate
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/test/lab"
)

const (
	programEnv = "WEIR_PACKETRATE_PROGRAM" // set in the child that programs the node
	flowsEnv   = "WEIR_PACKETRATE_FLOWS"   // "1": the child programs the rules of moved connections
	nodePort   = 30100
	echoPort   = 30101 // a service whose one endpoint echoes (podPort+endpoints)
	podPort    = 8000  // endpoints listen on podPort .. podPort+endpoints-1
)

var (
	endpoints = 10 // of the measured service
	distinct  = 0  // distinct endpoint counts of the filler services; 0: all have 10
)

func main() {
	many := flag.Int("services", 10000, "services in the large phase")
	phase := flag.Duration("phase", 4*time.Second, "length of one rate measurement")
	rounds := flag.Int("rounds", 3, "small/large phase pairs")
	conns := flag.Int("connections", 10000, "connections for the uniformity test")
	flag.IntVar(&endpoints, "endpoints", endpoints, "endpoints of the measured service")
	flag.IntVar(&distinct, "distinct", distinct, "distinct endpoint counts among the filler services, each with a node port (0: every filler has 10 and none)")
	cmp := flag.Bool("compare", false, "instead: the per-packet cost of Weir's ruleset against routing to the pod with no table, against the floor of any NAT proxy (conntrack and one static DNAT rule) and against kube-proxy's (with -kube-proxy), in many short interleaved phases, with 95 % intervals (compare.go)")
	cmpRounds := flag.Int("compare-rounds", 80, "with -compare: rounds in all, each a phase of every ruleset and kind of traffic in a shuffled order")
	cmpPhase := flag.Duration("compare-phase", 300*time.Millisecond, "with -compare: one phase's length")
	kubeProxy := flag.String("kube-proxy", "", "with -compare: test/bench/kubeproxy's binary (cd test/bench/kubeproxy && go build -o /tmp/kpbench .), which programs kube-proxy's ruleset on a node of its own")
	cmpFlows := flag.Bool("compare-flows", false, "with -compare: also Weir with the rules of moved connections, on a node of its own")
	cmpLabs := flag.Int("compare-labs", 8, "with -compare: labs made in turn, each with its own draw of which node carries which ruleset, the rounds shared among them; intervals are over the labs")
	cmpProfile := flag.Duration("compare-profile", 0, "with -compare: after each lab's rounds, each ruleset's new connections for this long under perf record -a, giving nf_tables' CPU per connection with intervals over the labs (profile.go; apt-get install linux-perf); -compare-rounds 0 for the profiles alone")
	cmpProfileDir := flag.String("compare-profile-dir", filepath.Join(os.TempDir(), "weir-packetrate-perf"), "with -compare-profile: where perf's data goes while it is read")
	flag.Parse()
	if os.Getenv(programEnv) == "" && *cmp {
		o := compareOptions{fillers: *many, rounds: *cmpRounds, labs: *cmpLabs, phase: *cmpPhase, kubeProxy: *kubeProxy, flows: *cmpFlows,
			profile: *cmpProfile, profileDir: *cmpProfileDir}
		if err := compare(o); err != nil {
			fmt.Fprintln(os.Stderr, "packetrate:", err)
			os.Exit(1)
		}
		return
	}
	if distinct > 0 && distinct >= endpoints {
		fmt.Fprintln(os.Stderr, "packetrate: -distinct must be below -endpoints, so that the measured service's rule comes last")
		os.Exit(2)
	}
	if n := os.Getenv(programEnv); n != "" {
		os.Exit(program(n))
	}
	if err := run(*many, *phase, *rounds, *conns); err != nil {
		fmt.Fprintln(os.Stderr, "packetrate:", err)
		os.Exit(1)
	}
}

// program runs inside the node's namespace: it programs n filler services
// plus the measured one, then exits, leaving the rules in place.
func program(arg string) int {
	n, _ := strconv.Atoi(arg)
	if os.Getenv(compareEnv) != "" {
		return programCompareChild(n)
	}
	endpoints, _ = strconv.Atoi(os.Getenv("WEIR_PACKETRATE_ENDPOINTS"))
	distinct, _ = strconv.Atoi(os.Getenv("WEIR_PACKETRATE_DISTINCT"))
	podIP := netip.MustParseAddr(os.Getenv("WEIR_PACKETRATE_POD"))
	nodeIP := netip.MustParseAddr(os.Getenv("WEIR_PACKETRATE_NODE"))
	st := datapath.NodeState{
		Node:     datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{nodeIP}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, Registered: true},
		Services: map[datapath.ServiceKey]*datapath.Service{},
	}
	target := &datapath.Service{Key: datapath.ServiceKey{Namespace: "bench", Name: "target"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.95.0.1")},
		Ports:      []datapath.ServicePort{{Name: "tcp", Protocol: datapath.TCP, Port: 80, NodePort: nodePort}}}
	for i := range endpoints {
		target.Ports[0].Endpoints = append(target.Ports[0].Endpoints, datapath.Endpoint{Addr: podIP, Port: uint16(podPort + i), Local: true, Ready: true, Serving: true})
	}
	st.Services[target.Key] = target
	echo := &datapath.Service{Key: datapath.ServiceKey{Namespace: "bench", Name: "echo"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.95.0.2")},
		Ports: []datapath.ServicePort{{Name: "tcp", Protocol: datapath.TCP, Port: 80, NodePort: echoPort,
			Endpoints: []datapath.Endpoint{{Addr: podIP, Port: uint16(podPort + endpoints), Local: true, Ready: true, Serving: true}}}}}
	st.Services[echo.Key] = echo
	for i := range n {
		count := 10
		if distinct > 0 {
			count = 1 + i%distinct
		}
		s := filler(i, count)
		if distinct > 0 && i < 2000 {
			s.Ports[0].NodePort = uint16(30200 + i)
		}
		st.Services[s.Key] = s
	}
	return applyHere(st, "10.244.0.0/16")
}

// filler is the i-th filler service: one TCP port, count ready endpoints
// on other nodes.
func filler(i, count int) *datapath.Service {
	s := &datapath.Service{Key: datapath.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})},
		Ports:      []datapath.ServicePort{{Name: "http", Protocol: datapath.TCP, Port: 80}}}
	for j := range count {
		s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, datapath.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + j), byte(i >> 8), byte(i)}), Port: 8080, Ready: true, Serving: true})
	}
	return s
}

// applyHere programs st on the node whose namespace this runs in, its
// pods in clusterCIDR, with the rules of moved connections when the
// parent asks (flowsEnv); it returns the exit code.
func applyHere(st datapath.NodeState, clusterCIDR string) int {
	cfg := datapath.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(clusterCIDR)}}
	if os.Getenv(flowsEnv) == "1" {
		cfg.Flows = &datapath.FlowRedirect{Interface: "weir-flows"}
	}
	dp, err := datapath.NewForNode(cfg)
	if err == nil {
		err = dp.Apply(context.Background(), st)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "program:", err)
		return 1
	}
	return 0
}

func run(many int, phase time.Duration, rounds, conns int) error {
	ctx := context.Background()
	l, err := lab.New(ctx, lab.Config{Nodes: 1, PodsPerNode: []int{1}})
	if err != nil {
		return err
	}
	l.CloseOnInterrupt()
	defer l.Close()
	node, pod := l.Nodes[0], l.Nodes[0].Pods[0]
	b := &bench{l: l, node: node, pod: pod, phase: phase, flows: "0",
		dst: netip.AddrPortFrom(node.IPv4, nodePort).String()}
	closeEndpoints, err := b.startEndpoints()
	defer closeEndpoints()
	if err != nil {
		return err
	}
	echoLn, err := b.startEcho()
	if err != nil {
		return err
	}
	defer echoLn.Close()
	if err := b.tableSize(rounds, many); err != nil {
		return err
	}
	if err := b.movedRules(rounds); err != nil {
		return err
	}
	b.flows = "0"
	if err := b.programNode(many); err != nil {
		return err
	}
	return b.uniformity(conns)
}

// bench is one node of a lab with one pod behind its node port.
type bench struct {
	l     *lab.Lab
	node  *lab.Node
	pod   *lab.Pod
	phase time.Duration
	dst   string // the node port
	flows string // "1": the node has the rules of moved connections
	// accepted counts each endpoint's connections.
	accepted []atomic.Int64
}

// startEndpoints starts the endpoints: one listener per port in the pod,
// counting accepts. The function returned closes those started.
func (b *bench) startEndpoints() (func(), error) {
	b.accepted = make([]atomic.Int64, endpoints)
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	for i := range endpoints {
		var ln net.Listener
		if err := b.pod.Do(func() error {
			var err error
			ln, err = net.Listen("tcp", fmt.Sprintf(":%d", podPort+i))
			return err
		}); err != nil {
			return closeAll, err
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				b.accepted[i].Add(1)
				c.Close()
			}
		}()
	}
	return closeAll, nil
}

// startEcho starts the echo endpoint, which sends back every byte.
func (b *bench) startEcho() (net.Listener, error) {
	var echoLn net.Listener
	if err := b.pod.Do(func() error {
		var err error
		echoLn, err = net.Listen("tcp", fmt.Sprintf(":%d", podPort+endpoints))
		return err
	}); err != nil {
		return nil, err
	}
	go echoEach(echoLn)
	return echoLn, nil
}

// programNode programs n services on the node, from a copy of this
// program in the node's namespace.
func (b *bench) programNode(n int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", b.node.Netns.Name, self)
	cmd.Env = append(os.Environ(), programEnv+"="+strconv.Itoa(n), "WEIR_PACKETRATE_POD="+b.pod.IPv4.String(), "WEIR_PACKETRATE_NODE="+b.node.IPv4.String(), flowsEnv+"="+b.flows,
		"WEIR_PACKETRATE_ENDPOINTS="+strconv.Itoa(endpoints), "WEIR_PACKETRATE_DISTINCT="+strconv.Itoa(distinct))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("programming %d services: %w: %s", n, err, out)
	}
	return nil
}

// rate runs 4 client workers for a phase; each calls work until the
// phase ends, and every call is counted.
func (b *bench) rate(work func(end time.Time, count *atomic.Int64) error) (float64, error) {
	var count atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	end := time.Now().Add(b.phase)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.l.Client.Do(func() error { return work(end, &count) })
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(count.Load()) / b.phase.Seconds(), nil
}

// newConns is the rate of new connections through the node port.
func (b *bench) newConns() (float64, error) {
	return b.rate(func(end time.Time, count *atomic.Int64) error {
		d := net.Dialer{Timeout: time.Second}
		for time.Now().Before(end) {
			c, err := d.Dial("tcp", b.dst)
			if err != nil {
				return err
			}
			closeAbortively(c)
			count.Add(1)
		}
		return nil
	})
}

// roundTrips is the rate of one-byte round trips on established
// connections to the echo endpoint.
func (b *bench) roundTrips() (float64, error) {
	echoDst := netip.AddrPortFrom(b.node.IPv4, echoPort).String()
	return b.rate(func(end time.Time, count *atomic.Int64) error {
		c, err := net.DialTimeout("tcp", echoDst, time.Second)
		if err != nil {
			return err
		}
		defer closeAbortively(c)
		buf := []byte{1}
		for time.Now().Before(end) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
			if _, err := c.Read(buf); err != nil {
				return err
			}
			count.Add(1)
		}
		return nil
	})
}

// tableSize compares the rate of new connections with 10 services and
// with many, in turns.
func (b *bench) tableSize(rounds, many int) error {
	fmt.Printf("new TCP connections per second through a node port (4 client workers, %v phases):\n", b.phase)
	var small, large []float64
	for r := range rounds {
		for _, n := range []int{10, many} {
			if err := b.programNode(n); err != nil {
				return err
			}
			rate, err := b.newConns()
			if err != nil {
				return err
			}
			fmt.Printf("  round %d, %5d services: %8.0f conn/s\n", r+1, n, rate)
			if n == 10 {
				small = append(small, rate)
			} else {
				large = append(large, rate)
			}
		}
	}
	ms, ml := mean(small), mean(large)
	fmt.Printf("mean: 10 services %.0f conn/s, %d services %.0f conn/s: ratio %.3f\n", ms, many, ml, ml/ms)
	return nil
}

// movedRules compares the rates with the rules of moved connections on
// and off, on the small table.
func (b *bench) movedRules(rounds int) error {
	fmt.Printf("with and without the rules that pass moved connections on (10 services, 4 client workers, %v phases):\n", b.phase)
	rates := map[string][2][]float64{}
	for r := range rounds {
		for _, on := range []string{"0", "1"} {
			b.flows = on
			if err := b.programNode(10); err != nil {
				return err
			}
			rt, err := b.roundTrips()
			if err != nil {
				return err
			}
			nc, err := b.newConns()
			if err != nil {
				return err
			}
			label := map[string]string{"0": "without", "1": "with   "}[on]
			fmt.Printf("  round %d, %s: %8.0f round trips/s on established connections, %8.0f new conn/s\n", r+1, label, rt, nc)
			i := map[string]int{"0": 0, "1": 1}[on]
			v := rates["rt"]
			v[i] = append(v[i], rt)
			rates["rt"] = v
			v = rates["nc"]
			v[i] = append(v[i], nc)
			rates["nc"] = v
		}
	}
	fmt.Printf("mean ratio with/without: round trips %.3f, new connections %.3f\n",
		mean(rates["rt"][1])/mean(rates["rt"][0]), mean(rates["nc"][1])/mean(rates["nc"][0]))
	return nil
}

// uniformity checks that conns connections spread uniformly over the
// endpoints, on the table as programmed.
func (b *bench) uniformity(conns int) error {
	for i := range b.accepted {
		b.accepted[i].Store(0)
	}
	if err := b.l.Client.Do(func() error {
		for range conns {
			c, err := net.DialTimeout("tcp", b.dst, time.Second)
			if err != nil {
				return err
			}
			closeAbortively(c)
		}
		return nil
	}); err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond) // let the last accepts land
	var total int64
	for i := range b.accepted {
		total += b.accepted[i].Load()
	}
	expected := float64(total) / float64(endpoints)
	chi2 := 0.0
	fmt.Printf("%d connections over %d endpoints:", total, endpoints)
	for i := range b.accepted {
		n := float64(b.accepted[i].Load())
		chi2 += (n - expected) * (n - expected) / expected
		fmt.Printf(" %d", b.accepted[i].Load())
	}
	critical := chiSquareCritical(endpoints - 1)
	verdict := "uniform"
	if chi2 > critical || math.IsNaN(chi2) {
		verdict = "NOT uniform"
	}
	fmt.Printf("\nchi-square %.2f (critical value at p = 0.001, %d d.f.: %.3f): %s\n", chi2, endpoints-1, critical, verdict)
	if verdict != "uniform" || total != int64(conns) {
		return fmt.Errorf("uniformity test failed")
	}
	return nil
}

// chiSquareCritical is the chi-square value that df degrees of freedom
// exceed with probability 0.001 (Wilson and Hilferty's approximation,
// a little above the exact value: 28.06 for 9 d.f., exactly 27.88).
func chiSquareCritical(df int) float64 {
	const z = 3.0902 // the standard normal's 0.999 quantile
	k := float64(df)
	return k * math.Pow(1-2/(9*k)+z*math.Sqrt(2/(9*k)), 3)
}

// echoEach sends back every byte of every connection ln accepts, until
// ln is closed.
func echoEach(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 1)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// closeAbortively resets the connection instead of closing it, so that
// neither side keeps it in TIME_WAIT: at thousands of connections a second
// the client would otherwise run out of ports, and the measurement would
// measure that.
func closeAbortively(c net.Conn) {
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
