package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// memberPort is the lab's memberlist port, on every node and on the LB
// host (the control namespace).
const memberPort = 7946

// startLBTier runs Weir without node speakers: the agents join the
// membership, and a load-balancer speaker on the control host peers with
// the FRR router configured by router. speakerArgs add speaker flags.
// restart kills the speaker (as a crash would) and starts a new one; log
// reads the running speaker's log.
func startLBTier(t *testing.T, router frr.Config, speakerArgs ...string) (c *weirlab.Cluster, r *frr.Router, restart func(), log func() string) {
	t.Helper()
	c, r = startBGPClusterWith(t, nil, router, func(c *weirlab.Cluster) {
		// Replaces the node-speaker flags: the LB tier announces.
		c.AgentArgs = func(n *lab.Node) []string {
			return []string{"--memberlist-bind-address", netip.AddrPortFrom(n.IPv4, memberPort).String(),
				"--memberlist-join", netip.AddrPortFrom(lab.ControlIPv4, memberPort).String()}
		}
	})
	var sp *lab.Process
	start := func() {
		t.Helper()
		var err error
		sp, err = c.StartSpeaker("lb1", append([]string{"--bgp-asn", strconv.Itoa(nodeASN), "--bgp-router-id", lab.ControlIPv4.String(),
			"--bgp-peers", fmt.Sprintf("%s/%d,%s/%d", lab.RouterLANv4, routerASN, lab.RouterLANv6, routerASN),
			"--memberlist-bind-address", netip.AddrPortFrom(lab.ControlIPv4, memberPort).String(),
			// A restarted speaker must find the members itself: the
			// agents may take it for the old one, which answered on the
			// same address under the same name.
			"--memberlist-join", fmt.Sprintf("%s,%s", netip.AddrPortFrom(c.Nodes[0].IPv4, memberPort), netip.AddrPortFrom(c.Nodes[1].IPv4, memberPort)),
			"--probe-interval", "1s", "--probe-timeout", "500ms", "--probe-fall", "3"}, speakerArgs...)...)
		if err != nil {
			t.Fatal(err)
		}
	}
	start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("speaker log:\n%s", sp.Log())
		}
	})
	return c, r, func() {
		t.Helper()
		if err := sp.Kill(); err != nil {
			t.Fatal(err)
		}
		start()
	}, func() string { return sp.Log() }
}

// speakerPaths is what the speakers report for a service: "speaker node
// prefix" -> reason ("" when announced without one, "-" when not
// announced and no reason was given).
func speakerPaths(t *testing.T, c *weirlab.Cluster, service string) (map[string]string, []*weirv1.SpeakerServicePaths) {
	t.Helper()
	resp, err := weirv1.NewStatusServiceClient(c.Conn).GetServiceStatus(context.Background(), &weirv1.GetServiceStatusRequest{Namespace: "default", Name: service})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, sp := range resp.GetStatus().GetSpeakers() {
		for _, p := range sp.GetPaths() {
			out[sp.GetSpeaker()+" "+p.GetNode()+" "+p.GetPrefix()] = p.GetReason()
		}
	}
	return out, resp.GetStatus().GetSpeakers()
}

// TestLBTierAnnouncesNodesAsNextHops: a dedicated speaker announces each
// VIP with the nodes that have ready local endpoints as next hops (ADD-PATH,
// weighted by endpoints), IPv4 and IPv6; clients keep their address; a node
// whose link is cut loses its next hop through the membership well before
// the speaker's own probes or the server notice; a speaker killed and
// restarted drops no connection (graceful restart).
func TestLBTierAnnouncesNodesAsNextHops(t *testing.T) {
	c, r, restartSpeaker, _ := startLBTier(t, labRouter)
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	svc := lbService("tier", 30097, []string{"10.96.0.61", "fd00:96::61"}, []string{"203.0.113.61", "2001:db8:113::61"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32104
	createService(t, c, svc, c.Pods()) // node1 has two pods, node2 one

	waitNextHops(t, r, "203.0.113.61", node1.IPv4.String(), node2.IPv4.String())
	waitNextHops(t, r, "2001:db8:113::61", node1.IPv6.String(), node2.IPv6.String())
	w, err := r.Weights(ctx, "203.0.113.61")
	if err != nil {
		t.Fatal(err)
	}
	if a, b := w[node1.IPv4.String()], w[node2.IPv4.String()]; a < 2*b-2 || a > 2*b+2 {
		t.Errorf("router weights %v: want node1 (two pods) about twice node2 (one pod)", w)
	}
	for _, dst := range []netip.AddrPort{netip.MustParseAddrPort("203.0.113.61:80"), netip.MustParseAddrPort("[2001:db8:113::61]:80")} {
		want := lab.ClientIPv4
		if dst.Addr().Is6() {
			want = lab.ClientIPv6
		}
		for _, rep := range sample(t, c.Client, dst, 6) {
			if rep.RemoteAddr() != want {
				t.Errorf("via the LB tier to %s: pod %s saw %s; want the client %s", dst, rep.Pod, rep.RemoteAddr(), want)
			}
		}
	}
	eventually(t, "the speaker reports four announced paths and ADD-PATH sessions", func() error {
		paths, sp := speakerPaths(t, c, "tier")
		for _, n := range []string{"node1", "node2"} {
			for _, p := range []string{"203.0.113.61/32", "2001:db8:113::61/128"} {
				if reason, ok := paths["lb1 "+n+" "+p]; !ok || reason != "" {
					return fmt.Errorf("path %s %s: reason %q (present %v); all %v", n, p, reason, ok, paths)
				}
			}
		}
		for _, s := range sp[0].GetPaths() {
			if !s.GetAnnounced() {
				return fmt.Errorf("%v not announced", s)
			}
		}
		return nil
	})

	// node2 loses its endpoint: only node1 remains.
	for _, s := range endpointSlices("tier", node1.Pods) {
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	waitNextHops(t, r, "203.0.113.61", node1.IPv4.String())
	for _, s := range endpointSlices("tier", c.Pods()) {
		if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	waitNextHops(t, r, "203.0.113.61", node1.IPv4.String(), node2.IPv4.String())

	// node2's link is cut: no agent stream ends at once, and the
	// speaker's probes (every second, three to fail) would take seconds;
	// the membership declares node2 dead and its next hop goes.
	cut := time.Now()
	if _, err := c.Router.Run(ctx, "ip", "link", "set", "lan-"+node2.Name, "down"); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.61", node1.IPv4.String())
	t.Logf("node2's link cut -> its next hop gone from the router after %v", time.Since(cut))
	eventually(t, "the speaker says node2 is unreachable", func() error {
		paths, _ := speakerPaths(t, c, "tier")
		if got := paths["lb1 node2 203.0.113.61/32"]; got != "NodeUnreachable" {
			return fmt.Errorf("node2's path reason %q, want NodeUnreachable", got)
		}
		return nil
	})
	if _, err := c.Router.Run(ctx, "ip", "link", "set", "lan-"+node2.Name, "up"); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, r, "203.0.113.61", node1.IPv4.String(), node2.IPv4.String())

	// A pool with an aggregation length: the speaker announces the
	// address's /28 through the same nodes.
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "aggregated"}, Addresses: []string{"203.0.113.160/28"},
		BgpAdvertisement: &weirv1.BgpAdvertisement{AggregationLength: 28}}}); err != nil {
		t.Fatal(err)
	}
	agg := lbService("tier-aggregated", 30096, []string{"10.96.0.62"}, nil)
	agg.Status, agg.Spec.LoadBalancerIps = nil, []string{"203.0.113.161"}
	agg.Spec.ExternalTrafficPolicy, agg.Spec.HealthCheckNodePort = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, 32103
	createService(t, c, agg, c.Nodes[0].Pods)
	waitNextHops(t, r, "203.0.113.160/28", node1.IPv4.String())
	if hops, err := r.NextHops(ctx, "203.0.113.161"); err != nil || len(hops) > 0 {
		t.Errorf("the router has a host route for 203.0.113.161 via %v (%v); want only the aggregate", hops, err)
	}
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort("203.0.113.161:80"), 4) {
		if podByName(c, rep.Pod).Node != node1 || rep.RemoteAddr() != lab.ClientIPv4 {
			t.Errorf("via the aggregate: pod %s saw %s; want a pod of node1 seeing the client", rep.Pod, rep.RemoteAddr())
		}
	}

	// The speaker is killed and restarted while a client keeps
	// connecting: the router keeps the paths meanwhile.
	done := keepConnecting(c.Client, netip.MustParseAddrPort("203.0.113.61:80"))
	time.Sleep(200 * time.Millisecond)
	restartSpeaker()
	time.Sleep(200 * time.Millisecond) // the router sees the old sessions go
	eventually(t, "the new speaker's sessions are established", func() error {
		if n, err := r.Established(ctx); err != nil || n != 2 {
			return fmt.Errorf("%d sessions established (%v), want 2", n, err)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)

	if failures, total := done(); failures != 0 || total < 20 {
		t.Errorf("%d of %d connections failed across the speaker restart; want 0 of at least 20", failures, total)
	}
	waitNextHops(t, r, "203.0.113.61", node1.IPv4.String(), node2.IPv4.String())
	// Not asserted: a path the new speaker no longer sends. FRR 8.4 was
	// seen keeping such a stale ADD-PATH path after the speaker's
	// End-of-RIB, until its stale-path time (docs/operations.md).
}

// TestLBTierExplainsWhatItCannotAnnounce: a router that did not negotiate
// ADD-PATH hears one next hop, and the status says so per path; a node
// the speaker's own probes cannot reach (its health-check port filtered
// from the LB host, while the server sees nothing wrong) is taken out.
func TestLBTierExplainsWhatItCannotAnnounce(t *testing.T) {
	router := labRouter
	router.AddressFamilyExtra = []string{"neighbor NODES disable-addpath-rx"}
	c, r, _, speakerLog := startLBTier(t, router, "--probe-interval", "200ms", "--probe-timeout", "100ms", "--probe-fall", "2")
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	svc := lbService("tier2", 30096, []string{"10.96.0.62", "fd00:96::62"}, []string{"203.0.113.62", "2001:db8:113::62"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32105
	createService(t, c, svc, c.Pods())

	eventually(t, "both paths reported, each AddPathNotNegotiated", func() error {
		paths, _ := speakerPaths(t, c, "tier2")
		for _, n := range []string{"node1", "node2"} {
			if got := paths["lb1 "+n+" 203.0.113.62/32"]; got != "AddPathNotNegotiated" {
				return fmt.Errorf("%s: reason %q; all %v", n, got, paths)
			}
		}
		return nil
	})
	if hops, err := r.NextHops(ctx, "203.0.113.62"); err != nil || len(hops) != 1 {
		t.Errorf("router next hops without ADD-PATH: %v (%v); want exactly one", hops, err)
	}
	if !strings.Contains(speakerLog(), "did not negotiate ADD-PATH") {
		t.Errorf("the speaker's log does not say the router lacks ADD-PATH")
	}

	// node1's health-check port stops answering the LB host only.
	rule := fmt.Sprintf("add table inet labblock; add chain inet labblock in { type filter hook input priority -10; }; add rule inet labblock in ip saddr %s tcp dport %d drop",
		lab.ControlIPv4, svc.Spec.HealthCheckNodePort)
	if _, err := node1.Run(ctx, "nft", rule); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node1's path is ProbeFailing and only node2 is announced", func() error {
		paths, _ := speakerPaths(t, c, "tier2")
		if got := paths["lb1 node1 203.0.113.62/32"]; got != "ProbeFailing" {
			return fmt.Errorf("node1: reason %q; all %v", got, paths)
		}
		// One path left: the router hears all of it even without ADD-PATH.
		if got := paths["lb1 node2 203.0.113.62/32"]; got != "" {
			return fmt.Errorf("node2: reason %q; all %v", got, paths)
		}
		return nil
	})
	waitNextHops(t, r, "203.0.113.62", node2.IPv4.String())
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort("203.0.113.62:80"), 4) {
		if rep.RemoteAddr() != lab.ClientIPv4 || rep.Pod != node2.Pods[0].Name {
			t.Errorf("with node1 out: pod %s saw %s; want node2's pod seeing the client", rep.Pod, rep.RemoteAddr())
		}
	}
}

// TestWaitProgrammedWaitsForTheSpeakers: with a load-balancer tier, a
// write is programmed only once the speaker announces what it changes.
// Right after WaitProgrammed says so, the speaker reports the new
// service's paths announced (it had to probe the new health-check node
// ports first). Deleting the endpoints with lbctl delete --wait says it
// waited for the speaker, and right after it the speaker has withdrawn
// the paths.
func TestWaitProgrammedWaitsForTheSpeakers(t *testing.T) {
	c, r, _, speakerLog := startLBTier(t, labRouter, "--probe-interval", "300ms", "--probe-timeout", "200ms")
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	st := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "the speaker watches the server and peers with the router", func() error {
		resp, err := st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: 1, Timeout: durationpb.New(time.Second)})
		if err != nil || len(resp.GetSpeakers()) != 1 {
			return fmt.Errorf("speakers %v, %v; speaker log:\n%s", resp.GetSpeakers(), err, speakerLog())
		}
		if n, err := r.Established(ctx); err != nil || n != 2 {
			return fmt.Errorf("router sessions established: %d (%v)", n, err)
		}
		return nil
	})

	svc := lbService("tierwait", 30115, []string{"10.96.0.75"}, []string{"203.0.113.75"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32115
	created, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	rev := revisionOf(created.GetService().GetMetadata())
	for _, s := range endpointSlices("tierwait", c.Pods())[:1] {
		created, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: s})
		if err != nil {
			t.Fatal(err)
		}
		rev = max(rev, revisionOf(created.GetEndpointSlice().GetMetadata()))
	}
	resp, err := st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(20 * time.Second)})
	if err != nil || !resp.GetProgrammed() {
		t.Fatalf("WaitProgrammed(%d): %v, %v", rev, resp, err)
	}
	if sp := resp.GetSpeakers(); len(sp) != 1 || sp[0].GetName() != "lb1" || sp[0].GetProgrammedVersion() < rev {
		t.Errorf("WaitProgrammed(%d) speakers: %v; want lb1 through the revision", rev, sp)
	}
	paths, _ := speakerPaths(t, c, "tierwait")
	want := map[string]string{"lb1 node1 203.0.113.75/32": "", "lb1 node2 203.0.113.75/32": ""}
	if !maps.Equal(paths, want) {
		t.Errorf("right after WaitProgrammed(%d) (%v) the speaker reports %v; want both nodes announced", rev, resp, paths)
	}
	waitNextHops(t, r, "203.0.113.75", node1.IPv4.String(), node2.IPv4.String())

	out, err := c.Lbctl(ctx, "delete", "endpointslice", "tierwait-v4", "-n", "default", "--wait=20s")
	if err != nil || !strings.Contains(out, "programmed on 2 connected node(s) and 1 load-balancer speaker(s)") {
		t.Fatalf("lbctl delete --wait: %v\n%s", err, out)
	}
	if paths, _ := speakerPaths(t, c, "tierwait"); len(paths) != 0 {
		t.Errorf("right after lbctl delete --wait the speaker still reports %v", paths)
	}
	waitNextHops(t, r, "203.0.113.75")
}

// revisionOf reads a resource_version.
func revisionOf(m *weirv1.ObjectMeta) uint64 {
	v, _ := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	return v
}
