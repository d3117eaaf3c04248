package e2e

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weirlb/weir/agent/flows"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// flowLab is four nodes with one pod each behind an ECMP router that
// hashes on ports, peering through a BgpPeer resource.
func flowLab(t *testing.T, impl string, agentArgs func(*lab.Node) []string) (*weirlab.Cluster, bgpRouter) {
	t.Helper()
	return flowLabOf(t, 4, impl, agentArgs)
}

// flowLabOf is flowLab with n nodes.
func flowLabOf(t *testing.T, n int, impl string, agentArgs func(*lab.Node) []string) (*weirlab.Cluster, bgpRouter) {
	t.Helper()
	cfg := lab.Config{Nodes: n, PodsPerNode: slices.Repeat([]int{1}, n), Dir: t.TempDir()}
	var c *weirlab.Cluster
	var r bgpRouter
	switch impl {
	case "FRR":
		c, r = startBGPClusterOf(t, cfg, agentArgs, labRouter)
	case "BIRD":
		requireBIRD(t)
		c = startSpeakingClusterOf(t, cfg, agentArgs)
		r = startLabBIRD(t, c)
	}
	ctx := context.Background()
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN}}); err != nil {
		t.Fatal(err)
	}
	// Hash on ports too, so that one client's connections spread and a
	// change of next hops moves some of them.
	if _, err := c.Router.Run(ctx, "sysctl", "-w", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatal(err)
	}
	return c, r
}

// longLived is n connections to dst, each sending a request every 100 ms
// and reading the whole answer, until Stop; a connection that fails once
// stops and counts as broken.
type longLived struct {
	dst      netip.AddrPort
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	broken   []string
	brokenAt []time.Time // when each of broken broke
	requests int
	client   netip.Addr // the clients' address
	ports    []string   // the clients' source ports
}

func startLongLived(t *testing.T, ns *lab.Netns, dst netip.AddrPort, n int) *longLived {
	t.Helper()
	l := &longLived{dst: dst, stop: make(chan struct{})}
	for range n {
		k, err := dialKeepAlive(context.Background(), ns, dst)
		if err != nil {
			t.Fatal(err)
		}
		// A machine busy with other tests may stall a request for a
		// second or two; a broken connection never answers.
		k.timeout = 5 * time.Second
		if err := k.Request(); err != nil {
			t.Fatalf("first request to %s: %v", dst, err)
		}
		local, err := netip.ParseAddrPort(k.conn.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		l.client = local.Addr().Unmap()
		l.ports = append(l.ports, strconv.Itoa(int(local.Port())))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer k.Close()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				err := k.Request()
				l.mu.Lock()
				l.requests++
				if err != nil {
					l.broken = append(l.broken, fmt.Sprintf("%s: %v", k.conn.LocalAddr(), err))
					l.brokenAt = append(l.brokenAt, time.Now())
				}
				l.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	return l
}

// Broken is what broke so far, and when.
func (l *longLived) Broken() ([]string, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.broken), slices.Clone(l.brokenAt)
}

// brokenPort is the client port of a connection Broken or Stop says broke
// ("ADDR:PORT: error"); "" when it says none.
func brokenPort(b string) string {
	addr, _, _ := strings.Cut(b, ": ")
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return ""
	}
	return strconv.Itoa(int(ap.Port()))
}

// Stop ends the connections and returns the requests made and what broke.
func (l *longLived) Stop() (int, []string) {
	close(l.stop)
	l.wg.Wait()
	return l.requests, l.broken
}

// conntrackPorts lists the client ports of node's conntrack entries to vip
// that a DNAT rewrote (dnat) or that none did (!dnat), from a dump of its
// table.
func conntrackPorts(t *testing.T, n *lab.Node, vip netip.Addr, dnat bool) []string {
	t.Helper()
	family := "ipv4"
	if vip.Is6() {
		family = "ipv6"
	}
	out, err := n.Run(context.Background(), "conntrack", "-L", "-f", family, "-p", "tcp", "-d", vip.String(), "--dport", "80")
	if err != nil {
		t.Fatal(err)
	}
	return entryPorts(out, vip, dnat)
}

// conntrackHeld is which of l's connections node has an entry of, DNAT'ed
// (dnat) or passed on unchanged (!dnat): each looked up by its addresses
// (conntrack -G, the kernel's lookup of one entry), so that none is
// missed, whatever a dump of a table that changes meanwhile would show.
func conntrackHeld(t *testing.T, n *lab.Node, l *longLived, dnat bool) []string {
	t.Helper()
	var script strings.Builder
	for _, p := range l.ports {
		fmt.Fprintf(&script, "conntrack -G -p tcp -s %s -d %s --sport %s --dport %d 2>/dev/null\n", l.client, l.dst.Addr(), p, l.dst.Port())
	}
	script.WriteString("true\n")
	out, err := n.Run(context.Background(), "sh", "-c", script.String())
	if err != nil {
		t.Fatal(err)
	}
	return entryPorts(out, l.dst.Addr(), dnat)
}

// entryPorts reads conntrack's lines: the client ports of the entries to
// vip that a DNAT rewrote (dnat) or that none did (!dnat).
func entryPorts(out string, vip netip.Addr, dnat bool) []string {
	var ports []string
	for _, line := range strings.Split(out, "\n") {
		var sport, replySrc string
		seenSrc := 0
		for _, w := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(w, "src="); ok {
				if seenSrc++; seenSrc == 2 {
					replySrc = v
				}
			}
			if v, ok := strings.CutPrefix(w, "sport="); ok && sport == "" {
				sport = v
			}
		}
		if sport != "" && replySrc != "" && (replySrc != vip.String()) == dnat {
			ports = append(ports, sport)
		}
	}
	return ports
}

// conntrackOf is every node's conntrack entries of the connection from the
// client's port to vip, one line per node.
func conntrackOf(t *testing.T, c *weirlab.Cluster, vip netip.Addr, port string) string {
	t.Helper()
	family := "ipv4"
	if vip.Is6() {
		family = "ipv6"
	}
	var b strings.Builder
	for _, n := range c.Nodes {
		out, err := n.Run(context.Background(), "conntrack", "-L", "-f", family, "-p", "tcp", "-d", vip.String(), "--sport", port)
		if err != nil {
			out = err.Error()
		}
		fmt.Fprintf(&b, "%s: %s\n", n.Name, strings.TrimSpace(out))
	}
	return b.String()
}

// movedConnections is which of l's connections reached a node that does
// not hold them: each leaves on the nodes it passed an entry that no DNAT
// rewrote (its reply would come from the load-balancer IP itself).
func movedConnections(t *testing.T, c *weirlab.Cluster, l *longLived) map[string]bool {
	t.Helper()
	moved := map[string]bool{}
	for _, n := range c.Nodes {
		for _, p := range conntrackHeld(t, n, l, false) {
			moved[p] = true
		}
	}
	return moved
}

// TestMovedConnectionsSurvive: established connections through an ECMP
// router (FRR, then BIRD) survive every change of the nodes behind its
// route: a node added, a node drained, an agent killed and restarted, an
// agent stopped and restarted, for a Cluster and a Local service side by
// side. The router moves part of them to nodes that never saw them; those
// nodes pass each packet on to the node that holds it. Without
// redirection the same events break connections (the control run), so the
// test can fail.
func TestMovedConnectionsSurvive(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			c, r := flowLab(t, impl, func(*lab.Node) []string { return nil })
			testMovedConnections(t, c, r, true)
		})
	}
	t.Run("control without redirection", func(t *testing.T) {
		c, r := flowLab(t, "FRR", func(*lab.Node) []string { return []string{"--pass-moved-connections=false"} })
		testMovedConnections(t, c, r, false)
	})
}

func testMovedConnections(t *testing.T, c *weirlab.Cluster, r bgpRouter, redirect bool) {
	ctx := context.Background()
	hop := func(i int) string { return c.Nodes[i].IPv4.String() }
	// node4 starts drained: uncordoning it is a node joining the route.
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: c.Nodes[3].Name}); err != nil {
		t.Fatal(err)
	}
	cluster := lbService("moved-cluster", 30140, []string{"10.96.0.140"}, []string{"203.0.113.140"})
	local := lbService("moved-local", 30141, []string{"10.96.0.141"}, []string{"203.0.113.141"})
	local.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	local.Spec.HealthCheckNodePort = 32141
	services := []*weirv1.Service{cluster}
	if redirect {
		services = append(services, local)
	}
	vips := map[string]netip.Addr{}
	for _, svc := range services {
		createService(t, c, svc, c.Pods())
		vips[svc.GetMetadata().GetName()] = netip.MustParseAddr(svc.GetStatus().GetLoadBalancerIps()[0])
	}
	waitAll := func(hops ...string) {
		t.Helper()
		for _, vip := range vips {
			waitNextHops(t, r, vip.String(), hops...)
		}
	}
	waitAll(hop(0), hop(1), hop(2))

	const perService = 60
	traffic := map[string]*longLived{}
	lost := map[string][]string{}    // per service, the ports of connections a lost node held
	holders := map[string][]string{} // by service/port, the nodes that held it before node3 was lost
	dumps := map[string][]int{}      // per service, how many of node3's entries each look-up found
	var node3Table string            // node3's whole table before it was lost
	for name, vip := range vips {
		traffic[name] = startLongLived(t, c.Client, netip.AddrPortFrom(vip, 80), perService)
	}
	settle := func() { time.Sleep(1500 * time.Millisecond) }
	settle()

	// When each step began, to tell which one broke a connection.
	type began struct {
		what string
		at   time.Time
	}
	steps := []began{{"before any step", time.Now()}}
	during := func(at time.Time) string {
		s := steps[0]
		for _, st := range steps {
			if !st.at.After(at) {
				s = st
			}
		}
		return fmt.Sprintf("%.1fs into %q", at.Sub(s.at).Seconds(), s.what)
	}
	step := func(what string, fn func() error, hops ...string) {
		t.Helper()
		t.Log(what)
		steps = append(steps, began{what, time.Now()})
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if hops != nil {
			waitAll(hops...)
		}
		settle()
	}
	step("a node joins: node4 uncordoned", func() error {
		_, err := c.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: c.Nodes[3].Name})
		return err
	}, hop(0), hop(1), hop(2), hop(3))
	step("a node drained: node2", func() error {
		_, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: c.Nodes[1].Name})
		return err
	}, hop(0), hop(2), hop(3))
	if redirect {
		step("node3's agent killed (SIGKILL) and started again", func() error { return c.RestartAgent(2) }, hop(0), hop(2), hop(3))
		step("node1's agent stopped (SIGTERM) and started again", func() error { return c.StopAndRestartAgent(0) }, hop(0), hop(2), hop(3))
		step("node2 uncordoned", func() error {
			_, err := c.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: c.Nodes[1].Name})
			return err
		}, hop(0), hop(1), hop(2), hop(3))
		// node3 lost as in a reboot: its agent, tables, device and
		// conntrack gone while it stays on the ring. What it held
		// cannot survive; everything else must, though moved packets
		// whose next node is node3 must now pass it over.
		node3 := c.Nodes[2]
		// What node3 held: each connection looked up in its table, before
		// the step and once its agent is dead (when it can gain no entry
		// any more). A dump of the table is compared, and a connection
		// the lookups find and a dump does not is logged.
		heldByNode3 := func() {
			for name, l := range traffic {
				ports := conntrackHeld(t, node3, l, true)
				dumped := conntrackPorts(t, node3, l.dst.Addr(), true)
				dumps[name] = append(dumps[name], len(ports))
				for _, p := range ports {
					if !slices.Contains(lost[name], p) {
						lost[name] = append(lost[name], p)
					}
					if !slices.Contains(dumped, p) {
						t.Logf("%s: node3's entry of the connection from port %s was found by its lookup and not in a dump of the table", name, p)
					}
				}
			}
		}
		heldByNode3()
		// Every entry of node3's table, whatever its addresses: a broken
		// connection is looked up in it by its client port.
		var err error
		if node3Table, err = node3.Run(ctx, "conntrack", "-L"); err != nil {
			t.Fatal(err)
		}
		for name, l := range traffic {
			for _, n := range c.Nodes {
				for _, p := range conntrackHeld(t, n, l, true) {
					holders[name+"/"+p] = append(holders[name+"/"+p], n.Name)
				}
			}
		}
		step("node3 lost as in a reboot (agent killed; its tables, device and conntrack wiped)", func() error {
			if err := c.Agents[2].Kill(); err != nil {
				return err
			}
			heldByNode3()
			// nft may outlive its output by more than the lab's
			// second (the kernel frees a large table as its socket
			// closes): what counts is that the table is gone.
			for _, cmd := range [][]string{{"nft", "delete", "table", "ip", "weir"}, {"nft", "delete", "table", "ip6", "weir"},
				{"ip", "link", "del", "weir-flows"}, {"conntrack", "-F"}} {
				if _, err := node3.Run(ctx, cmd[0], cmd[1:]...); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
					return err
				}
			}
			tables, err := node3.Run(ctx, "nft", "list", "tables")
			if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
				return err
			}
			if strings.Contains(tables, "weir") {
				return fmt.Errorf("node3 still has %q", tables)
			}
			return nil
		}, hop(0), hop(1), hop(3))
		settle()
	}

	totalMoved, totalBroken, totalRequests := 0, 0, 0
	for name, l := range traffic {
		requests, broken := l.Stop()
		_, brokenAt := l.Broken()
		totalRequests += requests
		movedPorts := movedConnections(t, c, l)
		moved := len(movedPorts)
		t.Logf("%s: %d connections, %d requests, %d moved to a node that did not hold them, %d broke", name, perService, requests, moved, len(broken))
		totalMoved += moved
		totalBroken += len(broken)
		if redirect {
			held := 0
			for i, b := range broken {
				if slices.Contains(lost[name], brokenPort(b)) {
					held++
					continue
				}
				t.Errorf("%s: connection broke %s: %s; held before node3 was lost by %v; node3's entries with its port then:\n%s\nthe nodes' entries for it now:\n%s",
					name, during(brokenAt[i]), b, holders[name+"/"+brokenPort(b)], grepLines(node3Table, "port="+brokenPort(b)+" "), conntrackOf(t, c, vips[name], brokenPort(b)))
			}
			kept := 0
			for p := range movedPorts {
				if !slices.Contains(lost[name], p) {
					kept++
				}
			}
			t.Logf("%s: %d connections held by the lost node (looked up before and after: %v), %d of them broke; survival: %d of %d moved connections the lost node did not hold",
				name, len(lost[name]), dumps[name], held, kept-(len(broken)-held), kept)
			if moved < perService/4 {
				t.Errorf("%s: only %d of %d connections were moved by the router: the events did not test redirection", name, moved, perService)
			}
		}
	}
	if !redirect && totalBroken == 0 {
		t.Errorf("without redirection no connection broke (%d moved): the test cannot tell redirection from luck", totalMoved)
	}
	// What the nodes counted reaches the server's status: connections
	// passed on and packets taken back (node3's counts went with its
	// table); a node that does not pass them on reports nothing.
	if redirect {
		eventually(t, "the nodes report the moved connections they passed on and took", func() error {
			passed, byHops := movedCounts(t, c)
			taken := byHops[0] + byHops[1] + byHops[2] + byHops[3]
			if passed == 0 || taken == 0 {
				return fmt.Errorf("passed on %d connections, took %d packets; %d connections moved", passed, taken, totalMoved)
			}
			t.Logf("status: %d connections passed on, %d packets taken back, by the nodes they crossed (1, 2, 3, 4+): %v", passed, taken, byHops)
			return nil
		})
		// A client packet crosses at most every other node (three
		// here), and a request is two packets from the client: far
		// more passed on means packets went round for ever.
		eventually(t, "the packets passed on stay within what the clients sent", func() error {
			packets := uint64(0)
			for _, n := range nodeStatuses(t, c) {
				packets += n.GetMovedConnections().GetPassedPackets()
			}
			if limit := uint64(3 * 3 * totalRequests); packets > limit {
				t.Errorf("the nodes passed on %d packets for %d requests (at most %d): moved packets went round without end", packets, totalRequests, limit)
			}
			return nil
		})
	} else {
		for _, n := range nodeStatuses(t, c) {
			if m := n.GetMovedConnections(); m != nil {
				t.Errorf("%s passes no moved connection on, yet reports %v", n.GetName(), m)
			}
		}
	}
}

func nodeStatuses(t *testing.T, c *weirlab.Cluster) []*weirv1.NodeStatus {
	t.Helper()
	r, err := weirv1.NewStatusServiceClient(c.Conn).ListNodeStatuses(context.Background(), &weirv1.ListNodeStatusesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetNodes()
}

// movedCounts adds up what every node's status says it passed on
// (connections) and took from its peers (packets, by the nodes they
// crossed: 1, 2, 3, 4 or more).
func movedCounts(t *testing.T, c *weirlab.Cluster) (passed uint64, takenByHops [4]uint64) {
	t.Helper()
	for _, n := range nodeStatuses(t, c) {
		m := n.GetMovedConnections()
		passed += m.GetPassedConnections()
		for i, k := range m.GetTakenPacketsByHops() {
			takenByHops[min(i, 3)] += k
		}
	}
	return passed, takenByHops
}

// TestQuietEventsMoveNoConnection: events that change nothing the router
// hashes over must move no established connection at all, not merely
// have it passed back: an endpoint added on another node, the BgpPeer
// edited, an agent restarted on purpose (SIGTERM, with graceful restart).
// Behind FRR and BIRD, four nodes, a Cluster service. A moved connection
// would leave an entry no DNAT rewrote on the node it reached, and the
// nodes' counters would say they passed it on.
func TestQuietEventsMoveNoConnection(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			c, r := flowLab(t, impl, func(*lab.Node) []string { return nil })
			ctx := context.Background()
			var hops []string
			for _, n := range c.Nodes {
				hops = append(hops, n.IPv4.String())
			}
			peers, err := c.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "upstream"})
			if err != nil {
				t.Fatal(err)
			}
			peer := peers.GetBgpPeer()
			peer.GracefulRestart = true
			if _, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: peer}); err != nil {
				t.Fatal(err)
			}
			svc := lbService("quiet", 30143, []string{"10.96.0.143"}, []string{"203.0.113.143"})
			createService(t, c, svc, c.Pods())
			vip := netip.MustParseAddr("203.0.113.143")
			// Every node's session is its current one (the peer
			// edit restarted them) and graceful restart is on.
			restartsDone := func() {
				t.Helper()
				waitNextHops(t, r, vip.String(), hops...)
				for _, h := range hops {
					eventually(t, "the router holds "+h+"'s route from its current session", func() error {
						if ok, err := r.GracefulRestartFrom(ctx, h); !ok {
							return fmt.Errorf("no graceful restart from %s (%v)", h, err)
						}
						if ok, err := r.RestartDone(ctx, h, vip.String()+"/32"); !ok {
							return fmt.Errorf("not yet (%v):\n%s", err, r.Describe(ctx, vip.String()))
						}
						return nil
					})
				}
			}
			restartsDone()
			// Each node's probes reach all its next nodes (a live
			// node passed over would take what it holds with it when
			// the one before it fails).
			eventually(t, "every node reports moved connections, with every next node answering", func() error {
				for _, n := range nodeStatuses(t, c) {
					m := n.GetMovedConnections()
					if m.GetChangedAt() == nil || m.GetNextNode() == "" || len(m.GetNotAnswering()) > 0 {
						return fmt.Errorf("%s reports %v", n.GetName(), m)
					}
				}
				return nil
			})
			passedBefore, _ := movedCounts(t, c)

			traffic := startLongLived(t, c.Client, netip.AddrPortFrom(vip, 80), 40)
			settle := func() { time.Sleep(1500 * time.Millisecond) }
			settle()
			step := func(what string, fn func() error) {
				t.Helper()
				t.Log(what)
				if err := fn(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				settle()
				restartsDone()
			}
			step("an endpoint added on node4 (an address no connection uses)", func() error {
				slices := endpointSlices("quiet", c.Pods())
				slices[0].Endpoints = append(slices[0].Endpoints, &weirv1.Endpoint{Addresses: []string{"10.244.4.99"}, NodeName: c.Nodes[3].Name})
				_, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: slices[0]})
				return err
			})
			step("the BgpPeer edited: hold time 30 s", func() error {
				p, err := c.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "upstream"})
				if err != nil {
					return err
				}
				p.GetBgpPeer().HoldTimeSeconds = 30
				_, err = c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: p.GetBgpPeer()})
				return err
			})
			step("node2's agent stopped (SIGTERM) and started again", func() error { return c.StopAndRestartAgent(1) })

			requests, broken := traffic.Stop()
			moved := movedConnections(t, c, traffic)
			t.Logf("%d connections, %d requests, %d moved, %d broke", len(traffic.ports), requests, len(moved), len(broken))
			for _, b := range broken {
				t.Errorf("connection broke: %s", b)
			}
			if len(moved) > 0 {
				t.Errorf("%d connections were moved to a node that did not hold them (client ports %v): the router's next hops changed", len(moved), slices.Collect(maps.Keys(moved)))
			}
			// Agents read their counters every flowsCountPeriod and
			// report changes within a second.
			time.Sleep(2*flowsCountPeriod + time.Second)
			if passed, _ := movedCounts(t, c); passed != passedBefore {
				t.Errorf("the nodes passed on %d connections during the events; want none", passed-passedBefore)
			}
			for _, n := range nodeStatuses(t, c) {
				if m := n.GetMovedConnections(); m.GetNextNode() == "" || len(m.GetNotAnswering()) > 0 {
					t.Errorf("%s: moved connections go to %q, passing over %v; want its next node, every next node answering", n.GetName(), m.GetNextNode(), m.GetNotAnswering())
				}
			}
		})
	}
}

// flowsCountPeriod is how often agents read their counters of moved
// connections.
const flowsCountPeriod = flows.CountPeriod

// dialFrom opens a connection from the client's port to dst.
func dialFrom(ctx context.Context, ns *lab.Netns, port int, dst netip.AddrPort) (*keepAlive, error) {
	var conn net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{Port: port}, Timeout: 3 * time.Second,
			Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
				return cmp.Or(err, serr)
			}}
		var err error
		conn, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return &keepAlive{conn: conn, r: bufio.NewReader(conn)}, nil
}

// TestReusedSourcePortAfterAMove: a node that passed a connection on
// keeps an entry for it (no DNAT) for a while after the connection ended
// elsewhere. A new connection from the same client port that the router
// sends to that node must still open: its SYN must not be taken as part of
// the old connection. Two nodes behind FRR; node1 holds the first
// connection, a drain sends it through node2, an uncordon brings it back,
// it ends with a reset on node1, and a second drain sends the new
// connection's SYN to node2.
func TestReusedSourcePortAfterAMove(t *testing.T) {
	c, r := flowLabOf(t, 2, "FRR", func(*lab.Node) []string { return nil })
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	svc := lbService("reused", 30142, []string{"10.96.0.142"}, []string{"203.0.113.142"})
	createService(t, c, svc, c.Pods())
	vip := netip.MustParseAddr("203.0.113.142")
	dst := netip.AddrPortFrom(vip, 80)
	waitNextHops(t, r, vip.String(), node1.IPv4.String(), node2.IPv4.String())

	// A client port whose connection the router sends to node1.
	var first *keepAlive
	port := 0
	for p := 41000; p < 41100 && first == nil; p++ {
		k, err := dialFrom(ctx, c.Client, p, dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Request(); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(conntrackPorts(t, node1, vip, true), strconv.Itoa(p)) {
			first, port = k, p
			break
		}
		k.conn.(*net.TCPConn).SetLinger(0)
		k.Close()
	}
	if first == nil {
		t.Fatal("no client port of 100 went to node1")
	}
	drain := func(on bool) {
		t.Helper()
		var err error
		if on {
			_, err = c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node1.Name})
			waitNextHops(t, r, vip.String(), node2.IPv4.String())
		} else {
			_, err = c.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: node1.Name})
			waitNextHops(t, r, vip.String(), node1.IPv4.String(), node2.IPv4.String())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	drain(true)
	if err := first.Request(); err != nil {
		t.Fatalf("the connection through node2: %v", err)
	}
	if !slices.Contains(conntrackPorts(t, node2, vip, false), strconv.Itoa(port)) {
		t.Fatal("node2 holds no entry of the connection it passed on: the test would prove nothing")
	}
	drain(false)
	if err := first.Request(); err != nil {
		t.Fatalf("the connection back on node1: %v", err)
	}
	first.conn.(*net.TCPConn).SetLinger(0)
	first.Close()

	drain(true)
	second, err := dialFrom(ctx, c.Client, port, dst)
	if err != nil {
		t.Fatalf("a new connection from port %d, whose SYN reaches node2 while it holds the old one's entry: %v", port, err)
	}
	defer second.Close()
	for i := range 20 {
		if err := second.Request(); err != nil {
			t.Fatalf("request %d on the new connection: %v", i, err)
		}
	}
}

// TestTheRingPassesOverANodeWithoutItsRules: three nodes, each passing
// moved connections to the next (node2 to node3). node3's agent is killed
// and its rules flushed, its VXLAN device left in place: its kernel still
// answers node2's probes, but a packet node2 passed it would be served
// there as new, and refused. node2 must pass node3 over within the probes'
// deadline (2 s), as it would a silent node, and take it back once node3's
// agent is started again and its rules are back. The same on IPv6-only
// nodes (registered with their IPv6 addresses only), whose tunnel and
// probes go in IPv6.
func TestTheRingPassesOverANodeWithoutItsRules(t *testing.T) {
	for _, ipv6Only := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6-only nodes"}[ipv6Only], func(t *testing.T) {
			testTheRingPassesOverANodeWithoutItsRules(t, ipv6Only)
		})
	}
}

func testTheRingPassesOverANodeWithoutItsRules(t *testing.T, ipv6Only bool) {
	c, _ := flowLabOf(t, 3, "FRR", func(*lab.Node) []string { return nil })
	ctx := context.Background()
	if ipv6Only {
		for _, n := range c.Nodes {
			got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: n.Name})
			if err != nil {
				t.Fatal(err)
			}
			node := got.GetNode()
			node.Addresses = []string{n.IPv6.String()}
			if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: node}); err != nil {
				t.Fatal(err)
			}
		}
	}
	next3 := "via=" + c.Nodes[2].IPv4.String()
	if ipv6Only {
		next3 = "via=" + c.Nodes[2].IPv6.String()
	}
	node2Log := func() string { return c.Agents[1].Log() }
	// The time of node2's first log line with every one of words after
	// since, if any.
	logged := func(since time.Time, words ...string) (time.Time, bool) {
		for _, line := range strings.Split(node2Log(), "\n") {
			if !slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(line, w) }) {
				ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
				if at, err := time.Parse(time.RFC3339Nano, ts); err == nil && !at.Before(since) {
					return at, true
				}
			}
		}
		return time.Time{}, false
	}
	wait.For(t, 30*time.Second, "node2 passes moved connections to node3, "+next3, func() error {
		if _, ok := logged(time.Time{}, "moved connections go to the next node", "next=node3", next3); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	// Every probe answered and marked before the rules go.
	time.Sleep(3 * time.Second)
	if _, ok := logged(time.Time{}, "pass it over"); ok {
		t.Fatalf("node2 passed a node over while every node was up:\n%s", grepLines(node2Log(), "component=flows"))
	}

	node3 := c.Nodes[2]
	if err := c.Agents[2].Kill(); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"ip", "ip6"} {
		if _, err := node3.Run(ctx, "nft", "delete", "table", fam, "weir"); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
			t.Fatal(err)
		}
	}
	flushed := time.Now()
	if out, err := node3.Run(ctx, "ip", "link", "show", "weir-flows"); err != nil {
		t.Fatalf("node3's device is gone, so the test would not tell a node without rules from one without a device: %v %s", err, out)
	}
	var passedOver time.Time
	wait.For(t, 10*time.Second, "node2 passes node3 over: its kernel answers, its rules do not", func() error {
		at, ok := logged(flushed.Add(-time.Second), "answers without its rules", "peer=node3")
		if !ok {
			return errors.New("not passed over")
		}
		if _, ok := logged(flushed.Add(-time.Second), "moved connections go to the next node", "next=node1"); !ok {
			return errors.New("passed over, the route not moved to node1")
		}
		passedOver = at
		return nil
	})
	t.Logf("node2 passed node3 over %v after its rules were flushed", passedOver.Sub(flushed).Round(time.Millisecond))
	// The probes' deadline, a probe's interval and a judgement's tick,
	// with room for a busy machine.
	if d := passedOver.Sub(flushed); d > 4*time.Second {
		t.Errorf("node2 passed node3 over %v after its rules were flushed; want within the probes' deadline of 2 s", d)
	}

	if err := c.RestartAgent(2); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	wait.For(t, 30*time.Second, "node2 takes node3 back once its agent wrote its rules again", func() error {
		if _, ok := logged(restarted, "a next node answers again", "peer=node3"); !ok {
			return errors.New("not taken back")
		}
		if _, ok := logged(restarted, "moved connections go to the next node", "next=node3"); !ok {
			return errors.New("taken back, the route not moved to node3")
		}
		return nil
	})
}

// TestMovedCountsCoverAnAgentsAbsence: the counts of moved connections
// are the kernel's, kept in the table across agents. node1 is drained, so
// the router sends everything to node2, which passes node1's connections
// back to it; node1 counts the packets it takes. Its agent is killed
// while that goes on, and started again: what node1 reports then covers
// what its kernel counted while no agent ran, and matches its table's
// counters, rather than starting again from nothing.
func TestMovedCountsCoverAnAgentsAbsence(t *testing.T) {
	c, r := flowLabOf(t, 2, "FRR", func(*lab.Node) []string { return nil })
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	createService(t, c, lbService("counted", 30144, []string{"10.96.0.144"}, []string{"203.0.113.144"}), c.Pods())
	vip := netip.MustParseAddr("203.0.113.144")
	waitNextHops(t, r, vip.String(), node1.IPv4.String(), node2.IPv4.String())
	l := startLongLived(t, c.Client, netip.AddrPortFrom(vip, 80), 20)
	defer l.Stop()
	if held := conntrackHeld(t, node1, l, true); len(held) == 0 {
		t.Fatal("node1 holds none of the connections: nothing would be passed back to it")
	}
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node1.Name}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, vip.String(), node2.IPv4.String())

	// What node1's table counted of the packets it took, and what its
	// status says.
	kernelTaken := func() uint64 {
		var sum uint64
		for _, name := range []string{"moved_taken_packets_1_hop", "moved_taken_packets_2_hops", "moved_taken_packets_3_hops", "moved_taken_packets_more_hops"} {
			out, err := node1.Run(ctx, "nft", "list", "counter", "ip", "weir", name)
			if err != nil {
				t.Fatal(err)
			}
			m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no packets in %q", out)
			}
			n, _ := strconv.ParseUint(m[1], 10, 64)
			sum += n
		}
		return sum
	}
	reportedTaken := func() uint64 {
		for _, n := range nodeStatuses(t, c) {
			if n.GetName() == node1.Name {
				var sum uint64
				for _, k := range n.GetMovedConnections().GetTakenPacketsByHops() {
					sum += k
				}
				return sum
			}
		}
		t.Fatal("no status of node1")
		return 0
	}
	wait.For(t, 20*time.Second, "node1 reports packets taken from node2", func() error {
		if n := reportedTaken(); n == 0 {
			return errors.New("none reported yet")
		}
		return nil
	})

	if err := c.Agents[0].Kill(); err != nil {
		t.Fatal(err)
	}
	atKill := kernelTaken()
	time.Sleep(3 * time.Second)
	whileAway := kernelTaken()
	if whileAway <= atKill {
		t.Fatalf("node1's table counted %d packets taken at its agent's death and %d 3 s later: nothing was passed back meanwhile, so the test would tell nothing", atKill, whileAway)
	}
	if err := c.RestartAgent(0); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "node1's restarted agent reports what its kernel counted while it was away", func() error {
		reported, kernel := reportedTaken(), kernelTaken()
		if reported < whileAway {
			return fmt.Errorf("reports %d packets taken; its table counted %d while no agent ran (%d at the agent's death), %d now", reported, whileAway, atKill, kernel)
		}
		t.Logf("node1 reports %d packets taken, its table counts %d (%d at its agent's death, %d 3 s later)", reported, kernel, atKill, whileAway)
		return nil
	})
	if broken, _ := l.Broken(); len(broken) > 0 {
		t.Errorf("%d connections broke: %v", len(broken), broken)
	}
}
