package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// udpFlows are long-lived UDP flows from one namespace to dst, each a
// socket of its own source port (as a QUIC connection or a game client
// keeps one), each asking in rounds which pod answers it.
type udpFlows struct {
	dst   netip.AddrPort
	conns []*net.UDPConn
	ports []string // each flow's source port
}

func startUDPFlows(t *testing.T, ns *lab.Netns, dst netip.AddrPort, n int) *udpFlows {
	t.Helper()
	f := &udpFlows{dst: dst}
	t.Cleanup(func() {
		for _, c := range f.conns {
			c.Close()
		}
	})
	if err := ns.Do(func() error {
		for range n {
			c, err := net.ListenUDP("udp", &net.UDPAddr{})
			if err != nil {
				return err
			}
			f.conns = append(f.conns, c)
			f.ports = append(f.ports, strconv.Itoa(c.LocalAddr().(*net.UDPAddr).Port))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// round has every flow ask once (up to three tries of 300 ms): the pod
// that answered each, "" where none did.
func (f *udpFlows) round() []string {
	pods := make([]string, len(f.conns))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 512)
			for i := range next {
				c := f.conns[i]
				for range 3 {
					if _, err := c.WriteToUDPAddrPort([]byte("which pod?"), f.dst); err != nil {
						continue
					}
					c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
					n, _, err := c.ReadFromUDPAddrPort(buf)
					if err != nil {
						continue
					}
					var r weirlab.Reply
					if json.Unmarshal(buf[:n], &r) == nil {
						pods[i] = r.Pod
						break
					}
				}
			}
		}()
	}
	for i := range f.conns {
		next <- i
	}
	close(next)
	wg.Wait()
	return pods
}

// udpHolders is, by client port, the nodes whose conntrack table holds a
// DNAT'ed entry of a flow to vip (dumps of whole tables, read in Go).
func udpHolders(t *testing.T, c *weirlab.Cluster, vip netip.Addr, skip ...int) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i, n := range c.Nodes {
		if slices.Contains(skip, i) {
			continue
		}
		table, err := n.Run(context.Background(), "conntrack", "-L")
		if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
			t.Fatal(err)
		}
		var lines []string
		for _, l := range strings.Split(table, "\n") {
			if strings.HasPrefix(l, "udp ") {
				lines = append(lines, l)
			}
		}
		for _, p := range entryPorts(strings.Join(lines, "\n"), vip, true) {
			out[p] = append(out[p], n.Name)
		}
	}
	return out
}

// TestMovedUDPFlowsKeepTheirEndpoint: long-lived UDP flows to a
// load-balancer IP, through an ECMP router that hashes on ports, through
// a node joining, a node drained, a node lost as in a reboot (its agent,
// tables and conntrack gone) and a node coming back. A node cannot tell
// a moved UDP flow from a new one; every node chooses a flow's endpoint
// by the same hash of the client's address and port, so each flow the
// router moves keeps its endpoint (the goal: 99.9 % of moved flows; 0 is
// what the rule gives while the endpoints stay), and every flow is
// answered after every step. With FRR and with BIRD, 1,600 flows each.
func TestMovedUDPFlowsKeepTheirEndpoint(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			c, r := flowLab(t, impl, func(*lab.Node) []string { return nil })
			testMovedUDPFlows(t, c, r, 1600)
		})
	}
}

func testMovedUDPFlows(t *testing.T, c *weirlab.Cluster, r bgpRouter, flows int) {
	ctx := context.Background()
	hop := func(i int) string { return c.Nodes[i].IPv4.String() }
	// node4 starts drained: uncordoning it is a node joining the route.
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: c.Nodes[3].Name}); err != nil {
		t.Fatal(err)
	}
	svc := lbService("quic", 30150, []string{"10.96.0.150"}, []string{"203.0.113.150"})
	svc.Spec.Ports = []*weirv1.ServicePort{{Name: "quic", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: 443, TargetPort: weirlab.PodPort, NodePort: 30150}}
	slice := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "quic-v4"}, ServiceName: "quic",
		Ports: []*weirv1.EndpointPort{{Name: "quic", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: weirlab.PodPort}}}
	for _, p := range c.Pods() {
		slice.Endpoints = append(slice.Endpoints, &weirv1.Endpoint{Addresses: []string{p.IPv4.String()}, NodeName: p.Node.Name})
	}
	createServiceWithSlices(t, c, svc, []*weirv1.EndpointSlice{slice})
	vip := netip.MustParseAddr("203.0.113.150")
	waitNextHops(t, r, vip.String(), hop(0), hop(1), hop(2))

	f := startUDPFlows(t, c.Client, netip.AddrPortFrom(vip, 443), flows)
	first := f.round()
	spread := map[string]int{}
	for i, pod := range first {
		if pod == "" {
			t.Fatalf("flow from port %s: no answer before any step", f.ports[i])
		}
		spread[pod]++
	}
	// The hash spreads the flows over the four pods about evenly.
	t.Logf("%d flows over the pods: %v", flows, spread)
	for _, p := range c.Pods() {
		if n := spread[p.Name]; n < flows/8 {
			t.Errorf("pod %s answers %d of %d flows; want about a quarter (%v)", p.Name, n, flows, spread)
		}
	}
	last := slices.Clone(first) // the pod each flow last had
	lost := []int{}             // nodes wiped: no table to read
	holders := udpHolders(t, c, vip)
	moved, changed, unanswered := 0, 0, 0
	step := func(what string, fn func() error, hops ...string) {
		t.Helper()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		waitNextHops(t, r, vip.String(), hops...)
		time.Sleep(time.Second)
		pods := f.round()
		now := udpHolders(t, c, vip, lost...)
		stepMoved, stepChanged, stepUnanswered := 0, 0, 0
		for i, port := range f.ports {
			if slices.ContainsFunc(now[port], func(n string) bool { return !slices.Contains(holders[port], n) }) {
				stepMoved++
			}
			switch {
			case pods[i] == "":
				stepUnanswered++
			case pods[i] != last[i]:
				stepChanged++
				if stepChanged <= 5 {
					t.Logf("%s: the flow from port %s went from %s to %s (held by %v, now %v)", what, port, last[i], pods[i], holders[port], now[port])
				}
				last[i] = pods[i]
			}
			holders[port] = append(holders[port], now[port]...)
		}
		t.Logf("%s: %d flows moved to another node, %d changed endpoint, %d unanswered", what, stepMoved, stepChanged, stepUnanswered)
		moved, changed, unanswered = moved+stepMoved, changed+stepChanged, unanswered+stepUnanswered
	}
	step("a node joins: node4 uncordoned", func() error {
		_, err := c.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: c.Nodes[3].Name})
		return err
	}, hop(0), hop(1), hop(2), hop(3))
	step("a node drained: node2", func() error {
		_, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: c.Nodes[1].Name})
		return err
	}, hop(0), hop(2), hop(3))
	step("node3 lost as in a reboot (agent killed; its tables and conntrack wiped)", func() error {
		if err := c.Agents[2].Kill(); err != nil {
			return err
		}
		lost = append(lost, 2)
		for _, cmd := range [][]string{{"nft", "delete", "table", "ip", "weir"}, {"nft", "delete", "table", "ip6", "weir"},
			{"ip", "link", "del", "weir-flows"}, {"conntrack", "-F"}} {
			if _, err := c.Nodes[2].Run(ctx, cmd[0], cmd[1:]...); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
				return fmt.Errorf("%v: %w", cmd, err)
			}
		}
		return nil
	}, hop(0), hop(3))
	step("node2 uncordoned", func() error {
		_, err := c.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: c.Nodes[1].Name})
		return err
	}, hop(0), hop(1), hop(3))

	t.Logf("%d flows: %d moves to another node, %d changes of endpoint, %d unanswered asks", flows, moved, changed, unanswered)
	if moved < flows/2 {
		t.Errorf("only %d moves over %d flows: the steps did not move enough flows to judge", moved, flows)
	}
	if changed*1000 > moved {
		t.Errorf("%d of %d moved flows changed endpoint; want at most 0.1%%", changed, moved)
	}
	if unanswered > 0 {
		t.Errorf("%d asks unanswered after the steps", unanswered)
	}

	// An endpoint removed: its flows go to the others (the agents clear
	// their conntrack entries, as kube-proxy does), the others stay. Then
	// node1 drained: of the flows it moves, those whose endpoint is still
	// there change endpoint only as the flow table changed, a few times
	// the removed endpoint's share (a modulus over the endpoints would
	// move two in three of them).
	removed := c.Nodes[3].Pods[0].Name
	slice.Endpoints = slice.Endpoints[:3]
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
		t.Fatal(err)
	}
	var pods []string
	eventually(t, "no flow answered by "+removed, func() error {
		pods = f.round()
		if n := slices.Index(pods, removed); n >= 0 {
			return fmt.Errorf("the flow from port %s still answered by %s", f.ports[n], removed)
		}
		return nil
	})
	stayed, onOthers := 0, 0
	for i, pod := range pods {
		if last[i] == removed {
			last[i] = "" // its endpoint is gone: left out below
			continue
		}
		onOthers++
		if pod == last[i] {
			stayed++
		}
	}
	if stayed != onOthers {
		t.Errorf("the endpoint removed: %d of the %d flows on the endpoints left kept them; want every one", stayed, onOthers)
	}
	before := udpHolders(t, c, vip, lost...)
	if _, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: c.Nodes[0].Name}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, vip.String(), hop(1), hop(3))
	time.Sleep(time.Second)
	pods = f.round()
	now := udpHolders(t, c, vip, lost...)
	movedAfter, changedAfter := 0, 0
	for i, port := range f.ports {
		if last[i] == "" || !slices.ContainsFunc(now[port], func(n string) bool { return !slices.Contains(before[port], n) }) {
			continue
		}
		movedAfter++
		if pods[i] != last[i] {
			changedAfter++
		}
	}
	t.Logf("an endpoint removed, then node1 drained: %d flows of the endpoints left moved, %d of them changed endpoint", movedAfter, changedAfter)
	if movedAfter < flows/10 || changedAfter*10 > movedAfter*3 {
		t.Errorf("%d of %d moved flows changed endpoint after one of four was removed; want under 30%%", changedAfter, movedAfter)
	}
}
