package main

// -compare: the per-packet cost of Weir's ruleset against the kernel
// routing to the pod with no table at all, and against kube-proxy's
// nftables ruleset for the same services, each ratio with its interval.
//
// A lab's nodes each forward to a pod of their own: one has no table (the
// client sends to the pod's address, routed), one the least any NAT proxy
// runs (conntrack and one static DNAT rule per port, masqueraded: the
// floor for Weir and kube-proxy alike), one Weir's (the client sends to a
// node port), one kube-proxy's (the same node port, programmed by the real
// proxier: test/bench/kubeproxy's -program-node), with -compare-flows one
// Weir's with the rules of moved connections, and always weir-control,
// Weir's ruleset again: an A/A control. Weir's and kube-proxy's nodes
// carry the same filler services. Four kinds of traffic are timed:
// one-byte round trips on established TCP connections and UDP flows, and
// new TCP connections and UDP flows (a new source port each). A round
// times every ruleset for one short phase of each kind, in orders
// shuffled every round and run forth then back, so that what drifts on
// the machine falls on all alike; each round gives one ratio per pair.
// The rounds are shared among several labs, each drawing anew which node
// carries which ruleset, and each ratio is given with its 95 % confidence
// interval over the labs' means (Student's t): see compare.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/test/lab"
)

// The measured services' node ports, and the pod's ports behind them.
const (
	cmpTCPNewNodePort, cmpTCPNewPodPort   = 30110, 9000 // accepts and closes
	cmpTCPEchoNodePort, cmpTCPEchoPodPort = 30111, 9001 // echoes
	cmpUDPEchoNodePort, cmpUDPEchoPodPort = 30112, 9002 // echoes datagrams
	compareEnv                            = "WEIR_PACKETRATE_COMPARE"
)

// cmpPorts are the measured services for test/bench/kubeproxy's
// -program-ports.
var cmpPorts = fmt.Sprintf("tcp:%d:%d,tcp:%d:%d,udp:%d:%d",
	cmpTCPNewNodePort, cmpTCPNewPodPort, cmpTCPEchoNodePort, cmpTCPEchoPodPort, cmpUDPEchoNodePort, cmpUDPEchoPodPort)

// ruleset is one node of the comparison and where its traffic goes.
type ruleset struct {
	name                     string
	node                     *lab.Node
	tcpNew, tcpEcho, udpEcho string
}

// kinds of traffic a phase times.
var kinds = []string{"TCP established", "TCP new", "UDP established", "UDP new"}

// compare runs the comparison: labs labs in turn, each with fillers
// services on every ruleset's node and its own draw of which node carries
// which ruleset, rounds rounds of phases of phase each in all.
//
// The nodes of one lab are alike but not the same, and an A/A control
// (weir-control: Weir's ruleset again, on a node of its own) showed a node
// worth up to 3 % in one lab, its interval clear of 1: the rounds of one
// lab cannot tell a ruleset's cost from its node's. So the lab is the
// unit: each ratio's interval is taken over the labs' means, and the
// rounds' interval, which leaves the nodes out, is printed beside it.
func compare(o compareOptions) error {
	names := []string{"routing", "dnat", "weir"}
	if o.kubeProxy != "" {
		names = append(names, "kube-proxy")
	}
	if o.flows {
		names = append(names, "weir+flows")
	}
	names = append(names, "weir-control")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	labs := max(o.labs, 1)
	perLab := o.rounds / labs
	if o.rounds > 0 {
		perLab = max(perLab, 1)
	}
	fmt.Printf("per-packet cost: %d rulesets (%v), %d filler services on each node, %d labs of %d rounds of %v phases, 4 client workers\n",
		len(names), names, o.fillers, labs, perLab, o.phase)
	if o.profile > 0 {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	var costs []labCosts
	var all []labRates
	lost := map[string]int{} // new flows timed out, by ruleset
	for i := range labs {
		nodeOf := rng.Perm(len(names))
		fmt.Printf("lab %d: rulesets on nodes %v\n", i+1, nodeOf)
		r, c, err := compareInLab(o, names, nodeOf, perLab, rng, lost)
		if err != nil {
			return fmt.Errorf("lab %d: %w", i+1, err)
		}
		all = append(all, r)
		if c != nil {
			costs = append(costs, c)
		}
	}
	if len(costs) > 0 {
		printCosts(costs, names)
	}
	if perLab == 0 {
		return nil
	}
	if len(lost) > 0 {
		fmt.Printf("new flows that timed out, each block timed again: %v\n", lost)
	}
	for _, k := range kinds {
		fmt.Printf("%s (per second, mean of the rounds):", k)
		for _, name := range names {
			var rates []float64
			for _, r := range all {
				rates = append(rates, r[k][name]...)
			}
			fmt.Printf("  %s %.0f", name, mean(rates))
		}
		fmt.Println()
		for _, pair := range [][2]string{{"dnat", "routing"}, {"weir", "dnat"}, {"kube-proxy", "dnat"}, {"weir", "routing"}, {"kube-proxy", "routing"}, {"weir", "kube-proxy"}, {"weir+flows", "weir"}, {"weir-control", "weir"}} {
			if !slices.Contains(names, pair[0]) || !slices.Contains(names, pair[1]) {
				continue
			}
			var labMeans []float64
			var a, b []float64
			for _, r := range all {
				m, _ := ratioInterval(r[k][pair[0]], r[k][pair[1]])
				labMeans = append(labMeans, m)
				a, b = append(a, r[k][pair[0]]...), append(b, r[k][pair[1]]...)
			}
			m, half := meanInterval(labMeans)
			rm, rhalf := ratioInterval(a, b)
			fmt.Printf("  %-12s / %-10s %.3f ± %.3f over the labs (95 %% interval %.3f-%.3f); over the rounds %.3f ± %.3f\n",
				pair[0], pair[1], m, half, m-half, m+half, rm, rhalf)
		}
	}
	return nil
}

// compareOptions are -compare's flags.
type compareOptions struct {
	fillers, rounds, labs int
	phase                 time.Duration
	kubeProxy             string // test/bench/kubeproxy's binary, or ""
	flows                 bool   // also weir+flows
	// profile: after a lab's rounds, each ruleset's new connections for
	// this long under perf (profile.go); 0: none.
	profile    time.Duration
	profileDir string
}

// labRates are one lab's rates: kind of traffic -> ruleset -> per round.
type labRates map[string]map[string][]float64

// compareInLab times rounds rounds in a new lab whose node nodeOf[i]
// carries names[i]'s ruleset, then profiles them if o says so. The
// rulesets are programmed, and their flows opened, in an order drawn anew.
func compareInLab(o compareOptions, names []string, nodeOf []int, rounds int, rng *rand.Rand, lost map[string]int) (labRates, labCosts, error) {
	pods := make([]int, len(names))
	for i := range pods {
		pods[i] = 1
	}
	l, err := lab.New(context.Background(), lab.Config{Nodes: len(names), PodsPerNode: pods})
	if err != nil {
		return nil, nil, err
	}
	l.CloseOnInterrupt()
	defer l.Close()
	shuffle := func(rs []*ruleset) { rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] }) }
	rs := make([]*ruleset, len(names))
	for _, i := range rng.Perm(len(names)) {
		name := names[i]
		node := l.Nodes[nodeOf[i]]
		pod := node.Pods[0]
		stop, err := startCompareServers(pod)
		if err != nil {
			return nil, nil, err
		}
		defer stop()
		r := &ruleset{name: name, node: node}
		at := func(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }
		switch name {
		case "routing":
			r.tcpNew, r.tcpEcho, r.udpEcho = at(pod.IPv4, cmpTCPNewPodPort), at(pod.IPv4, cmpTCPEchoPodPort), at(pod.IPv4, cmpUDPEchoPodPort)
		default:
			r.tcpNew, r.tcpEcho, r.udpEcho = at(node.IPv4, cmpTCPNewNodePort), at(node.IPv4, cmpTCPEchoNodePort), at(node.IPv4, cmpUDPEchoNodePort)
		}
		switch name {
		case "dnat":
			err = programDNAT(node, pod)
		case "weir", "weir+flows", "weir-control":
			err = programCompare(node, pod, o.fillers, name == "weir+flows")
		case "kube-proxy":
			err = programKubeProxy(o.kubeProxy, node, pod, o.fillers)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		rs[i] = r
	}

	// Established flows stay open across phases: 4 per ruleset and kind.
	est := map[*ruleset]*established{}
	opening := slices.Clone(rs)
	shuffle(opening)
	for _, r := range opening {
		e, err := openEstablished(l.Client, r)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", r.name, err)
		}
		defer e.close()
		est[r] = e
	}
	rates := labRates{}
	for _, k := range kinds {
		rates[k] = map[string][]float64{}
	}
	for range rounds {
		// Each kind in turn, in a shuffled order; within a kind every
		// ruleset for half a phase in a shuffled order, then again in the
		// reverse order: what drifts linearly over the block falls on all
		// alike.
		order := slices.Clone(kinds)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, kind := range order {
			seq := slices.Clone(rs)
			shuffle(seq)
			back := slices.Clone(seq)
			slices.Reverse(back)
			seq = append(seq, back...)
			var sum map[*ruleset]float64
			for try := 1; sum == nil; try++ {
				sum = map[*ruleset]float64{}
				for _, r := range seq {
					rate, err := measure(l.Client, r, est[r], kind, o.phase/2)
					// A new flow whose first packet was lost waits
					// out its timeout, longer than a phase: the block
					// is timed again, and the loss counted.
					if err != nil && kind != "TCP established" && kind != "UDP established" && timedOut(err) && try < 3 {
						lost[r.name]++
						sum = nil
						break
					}
					if err != nil {
						return nil, nil, fmt.Errorf("%s, %s: %w", r.name, kind, err)
					}
					sum[r] += rate / 2
				}
			}
			for r, rate := range sum {
				rates[kind][r.name] = append(rates[kind][r.name], rate)
			}
		}
	}
	if o.profile == 0 {
		return rates, nil, nil
	}
	costs, err := profileLab(l.Client, rs, est, o.profile, o.profileDir, shuffle)
	return rates, costs, err
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ratioInterval is the mean of the rounds' ratios a[i]/b[i] and the half
// width of its 95 % confidence interval.
func ratioInterval(a, b []float64) (m, half float64) {
	n := min(len(a), len(b))
	ratios := make([]float64, n)
	for i := range n {
		ratios[i] = a[i] / b[i]
	}
	return meanInterval(ratios)
}

// meanInterval is the mean of xs and the half width of its 95 %
// confidence interval (Student's t).
func meanInterval(xs []float64) (m, half float64) {
	n := len(xs)
	m = mean(xs)
	if n < 2 {
		return m, math.NaN()
	}
	ss := 0.0
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	sd := math.Sqrt(ss / float64(n-1))
	return m, studentT975(n-1) * sd / math.Sqrt(float64(n))
}

// studentT975 is Student's t distribution's 0.975 quantile for df degrees
// of freedom (a table to 30, then the normal's with a correction).
func studentT975(df int) float64 {
	table := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df >= 1 && df <= len(table) {
		return table[df-1]
	}
	return 1.960 + 2.4/float64(df) // within 0.002 from 30 up
}

// startCompareServers starts the pod's servers: TCP accepting and closing,
// TCP echoing, UDP echoing. stop closes their sockets, which a lab's
// namespaces outlive otherwise in a run of several labs.
func startCompareServers(pod *lab.Pod) (stop func(), err error) {
	var accept, echo net.Listener
	var udp net.PacketConn
	var opened []io.Closer
	stop = func() {
		for _, c := range opened {
			c.Close()
		}
	}
	if err := pod.Do(func() error {
		var err error
		if accept, err = net.Listen("tcp4", fmt.Sprintf(":%d", cmpTCPNewPodPort)); err != nil {
			return err
		}
		opened = append(opened, accept)
		if echo, err = net.Listen("tcp4", fmt.Sprintf(":%d", cmpTCPEchoPodPort)); err != nil {
			return err
		}
		opened = append(opened, echo)
		if udp, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", cmpUDPEchoPodPort)); err != nil {
			return err
		}
		opened = append(opened, udp)
		return nil
	}); err != nil {
		stop()
		return nil, err
	}
	go func() {
		for {
			c, err := accept.Accept()
			if err != nil {
				return
			}
			// Closed gently: a reset could reach the client before its
			// connect has read the handshake's outcome. The client resets.
			c.Close()
		}
	}()
	go echoEach(echo)
	for range 4 {
		go func() {
			buf := make([]byte, 64)
			for {
				n, from, err := udp.ReadFrom(buf)
				if err != nil {
					return
				}
				udp.WriteTo(buf[:n], from)
			}
		}()
	}
	return stop, nil
}

// programCompare programs Weir on node: the fillers, and the measured
// services, each with the node's one pod, from a copy of this program in
// the node's namespace (see programCompareChild).
func programCompare(node *lab.Node, pod *lab.Pod, fillers int, withFlows bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	flowsOn := "0"
	if withFlows {
		flowsOn = "1"
	}
	cmd := exec.Command("ip", "netns", "exec", node.Netns.Name, self)
	cmd.Env = append(os.Environ(), compareEnv+"=1", programEnv+"="+strconv.Itoa(fillers),
		"WEIR_PACKETRATE_POD="+pod.IPv4.String(), "WEIR_PACKETRATE_NODE="+node.IPv4.String(), flowsEnv+"="+flowsOn)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("programming weir: %w: %s", err, out)
	}
	return nil
}

// programDNAT programs the floor of a NAT proxy on node: each measured
// node port DNAT'ed to the pod by one static rule, and masqueraded (as
// Weir and kube-proxy masquerade a node port's connection from outside
// the cluster to a Cluster service). Every packet passes conntrack; only a
// connection's first meets the rules.
func programDNAT(node *lab.Node, pod *lab.Pod) error {
	rules := "table ip floor {\n\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n"
	for _, p := range []struct {
		proto             string
		nodePort, podPort int
	}{{"tcp", cmpTCPNewNodePort, cmpTCPNewPodPort}, {"tcp", cmpTCPEchoNodePort, cmpTCPEchoPodPort}, {"udp", cmpUDPEchoNodePort, cmpUDPEchoPodPort}} {
		rules += fmt.Sprintf("\t\tip daddr %s %s dport %d dnat to %s:%d\n", node.IPv4, p.proto, p.nodePort, pod.IPv4, p.podPort)
	}
	rules += "\t}\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tct status dnat masquerade fully-random\n\t}\n}\n"
	cmd := exec.Command("ip", "netns", "exec", node.Netns.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("programming the NAT floor: %w: %s", err, out)
	}
	return nil
}

// programKubeProxy programs kube-proxy's ruleset on node with the real
// proxier (test/bench/kubeproxy's binary, bin).
func programKubeProxy(bin string, node *lab.Node, pod *lab.Pod, fillers int) error {
	cmd := exec.Command("ip", "netns", "exec", node.Netns.Name, bin, "-program-node", node.IPv4.String(),
		"-program-pod", pod.IPv4.String(), "-program-ports", cmpPorts, "-services", strconv.Itoa(fillers))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("programming kube-proxy (%s): %w: %s", bin, err, out)
	}
	return nil
}

// established are the open flows of one ruleset: 4 TCP connections and 4
// connected UDP sockets, one per client worker.
type established struct {
	tcp, udp []net.Conn
}

func openEstablished(client *lab.Netns, r *ruleset) (*established, error) {
	e := &established{}
	err := client.Do(func() error {
		for range 4 {
			c, err := net.DialTimeout("tcp4", r.tcpEcho, time.Second)
			if err != nil {
				return err
			}
			e.tcp = append(e.tcp, c)
			u, err := net.Dial("udp4", r.udpEcho)
			if err != nil {
				return err
			}
			e.udp = append(e.udp, u)
		}
		return nil
	})
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *established) close() {
	for _, c := range slices.Concat(e.tcp, e.udp) {
		c.Close()
	}
}

// measure is the rate of one kind of traffic through r over one phase, 4
// client workers.
func measure(client *lab.Netns, r *ruleset, e *established, kind string, phase time.Duration) (float64, error) {
	var count atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 4)
	end := time.Now().Add(phase)
	for w := range 4 {
		wg.Go(func() {
			errs[w] = client.Do(func() error { return work(r, e, w, kind, end, &count) })
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(count.Load()) / phase.Seconds(), nil
}

// work is one worker's phase: round trips or new flows until end.
func work(r *ruleset, e *established, w int, kind string, end time.Time, count *atomic.Int64) error {
	buf := []byte{1}
	roundTrip := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := c.Read(buf)
		return err
	}
	for time.Now().Before(end) {
		switch kind {
		case "TCP established":
			if err := roundTrip(e.tcp[w]); err != nil {
				return err
			}
		case "UDP established":
			if err := roundTrip(e.udp[w]); err != nil {
				return err
			}
		case "TCP new":
			c, err := net.DialTimeout("tcp4", r.tcpNew, time.Second)
			if err != nil {
				return err
			}
			closeAbortively(c)
		case "UDP new":
			c, err := net.Dial("udp4", r.udpEcho) // a new source port: a new flow
			if err != nil {
				return err
			}
			err = roundTrip(c)
			c.Close()
			if err != nil {
				return err
			}
		}
		count.Add(1)
	}
	return nil
}

// programCompareChild runs in a node's namespace: Weir's ruleset for the
// measured services, each with the node's one pod, and n fillers as
// test/bench/kubeproxy's (10 endpoints each, 1 % LoadBalancer with a node
// port), then exits, leaving the rules in place.
func programCompareChild(n int) int {
	podIP := netip.MustParseAddr(os.Getenv("WEIR_PACKETRATE_POD"))
	nodeIP := netip.MustParseAddr(os.Getenv("WEIR_PACKETRATE_NODE"))
	st := datapath.NodeState{
		Node:     datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{nodeIP}, Registered: true},
		Services: map[datapath.ServiceKey]*datapath.Service{},
	}
	for i, m := range []struct {
		proto             datapath.Protocol
		nodePort, podPort int
	}{{datapath.TCP, cmpTCPNewNodePort, cmpTCPNewPodPort}, {datapath.TCP, cmpTCPEchoNodePort, cmpTCPEchoPodPort}, {datapath.UDP, cmpUDPEchoNodePort, cmpUDPEchoPodPort}} {
		s := &datapath.Service{Key: datapath.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("measured-%d", i)},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 95, 0, byte(1 + i)})},
			Ports: []datapath.ServicePort{{Name: "p", Protocol: m.proto, Port: 80, NodePort: uint16(m.nodePort),
				Endpoints: []datapath.Endpoint{{Addr: podIP, Port: uint16(m.podPort), NodeName: "node1", Local: true, Ready: true, Serving: true}}}}}
		st.Services[s.Key] = s
	}
	for i := range n {
		s := filler(i, 10)
		if i%100 == 0 {
			k := i / 100
			s.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{100, byte(64 + k>>16), byte(k >> 8), byte(k)})}
			s.Ports[0].NodePort = uint16(30000 + i/100)
		}
		st.Services[s.Key] = s
	}
	// As kube-proxy's bench: 10.128.0.0/9 holds the pods.
	return applyHere(st, "10.128.0.0/9")
}
