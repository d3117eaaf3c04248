package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

const collectorASN = 64501

// TestAdvertisementPicksPeersAndAggregates: a pool's advertisement sends
// its routes only to the peers it names, as one aggregate prefix per
// address block, while a pool that names no peer reaches every router. Two
// real routers: the lab's upstream router and a second FRR (the
// "collector") on the rack LAN.
func TestAdvertisementPicksPeersAndAggregates(t *testing.T) {
	c, upstream := startBGPClusterWith(t, func(*lab.Node) []string { return nil }, labRouter)
	ctx := context.Background()
	collector, err := frr.StartTemp(ctx, c.Control, frr.Config{ASN: collectorASN, RouterID: lab.ControlIPv4.String(), PeerASN: nodeASN,
		ListenRanges: []string{"192.0.2.0/24", "2001:db8:2::/64"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(collector.Close)
	node1 := c.Nodes[0]
	for _, p := range []*weirv1.BgpPeer{
		{Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN},
		{Metadata: &weirv1.ObjectMeta{Name: "collector"}, Address: lab.ControlIPv4.String(), Asn: collectorASN, MyAsn: nodeASN},
	} {
		if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: p}); err != nil {
			t.Fatal(err)
		}
	}
	public := &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.96/28", "2001:db8:113::60/124"},
		BgpAdvertisement: &weirv1.BgpAdvertisement{Peers: []string{"upstream"}, AggregationLength: 28, AggregationLengthV6: 124}}
	created, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: public})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "internal"}, Addresses: []string{"203.0.113.128/28"}}}); err != nil {
		t.Fatal(err)
	}

	// Local, endpoints on node1 only: the aggregates go via node1, to
	// the upstream router alone; the host prefixes go nowhere.
	svc := lbService("aggregated", 30110, []string{"10.96.0.70", "fd00:96::70"}, nil)
	svc.Status = nil
	svc.Spec.LoadBalancerIps = []string{"203.0.113.97", "2001:db8:113::61"}
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32110
	createService(t, c, svc, node1.Pods)
	waitNextHops(t, upstream, "203.0.113.96/28", node1.IPv4.String())
	waitNextHops(t, upstream, "2001:db8:113::60/124", node1.IPv6.String())
	for _, vip := range []string{"203.0.113.97", "2001:db8:113::61"} {
		if hops, err := upstream.NextHops(ctx, vip); err != nil || len(hops) > 0 {
			t.Errorf("the upstream router has a host route for %s via %v (%v); want only the aggregate", vip, hops, err)
		}
		for _, rep := range sample(t, c.Client, netip.AddrPortFrom(netip.MustParseAddr(vip), 80), 5) {
			if podByName(c, rep.Pod).Node != node1 || rep.RemoteAddr().Is4() != netip.MustParseAddr(vip).Is4() || !isClient(rep.RemoteAddr()) {
				t.Errorf("%s: pod %s saw %s; want a pod of node1 seeing the client", vip, rep.Pod, rep.RemoteAddr())
			}
		}
	}

	// A pool that names no peer reaches both routers: once the collector
	// has its route, it has had every chance to hear the other.
	open := lbService("open", 30111, []string{"10.96.0.71"}, nil)
	open.Status = nil
	open.Spec.AddressPool = "internal"
	createService(t, c, open, c.Pods())
	waitNextHops(t, collector, "203.0.113.128", node1.IPv4.String(), c.Nodes[1].IPv4.String())
	waitNextHops(t, upstream, "203.0.113.128", node1.IPv4.String(), c.Nodes[1].IPv4.String())
	for _, prefix := range []string{"203.0.113.96/28", "203.0.113.97", "2001:db8:113::60/124"} {
		if hops, err := collector.NextHops(ctx, prefix); err != nil || len(hops) > 0 {
			t.Errorf("the collector, which the pool does not name, has %s via %v (%v)", prefix, hops, err)
		}
	}

	// Naming the collector instead moves the routes over without
	// touching the sessions.
	pool := created.GetAddressPool()
	pool.BgpAdvertisement.Peers = []string{"collector"}
	if _, err := c.Registry.UpdateAddressPool(ctx, &weirv1.UpdateAddressPoolRequest{AddressPool: pool}); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, collector, "203.0.113.96/28", node1.IPv4.String())
	waitNextHops(t, collector, "2001:db8:113::60/124", node1.IPv6.String())
	waitNextHops(t, upstream, "203.0.113.96/28")
	waitNextHops(t, upstream, "2001:db8:113::60/124")
	out, err := upstream.Vtysh(ctx, "show bgp neighbors json")
	if err != nil {
		t.Fatal(err)
	}
	var neighbors map[string]struct {
		State   string `json:"bgpState"`
		Dropped *int   `json:"connectionsDropped"`
	}
	if err := json.Unmarshal([]byte(out), &neighbors); err != nil {
		t.Fatal(err)
	}
	for addr, n := range neighbors {
		if n.State != "Established" || n.Dropped == nil || *n.Dropped != 0 {
			t.Errorf("upstream's session with %s: %s, dropped %v times; want never dropped", addr, n.State, n.Dropped)
		}
	}
	if len(neighbors) != 2 {
		t.Errorf("upstream has %d neighbors; want the two nodes", len(neighbors))
	}
}

func isClient(a netip.Addr) bool { return a == lab.ClientIPv4 || a == lab.ClientIPv6 }

// TestGracefulRestartKeepsTrafficThroughAnAgentRestart: with a peer that
// offers graceful restart, restarting the agent of the only node with the
// service's endpoints drops no connection through the router, whether the
// agent is stopped as systemctl restart does (SIGTERM) or dies (SIGKILL):
// the router keeps the node's route while the agent comes back (the agent
// ends its sessions without a NOTIFICATION and comes back saying its
// forwarding state was kept), and the node's rules stayed in the kernel.
// The same restart without graceful restart withdraws the route, which the
// test checks first so that the rest means something. Changing the peer's
// hold time then keeps the route throughout. All of it against FRR and
// against BIRD.
func TestGracefulRestartKeepsTrafficThroughAnAgentRestart(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			var c *weirlab.Cluster
			var r bgpRouter
			if impl == "FRR" {
				c, r = startBGPClusterWith(t, func(*lab.Node) []string { return nil }, labRouter)
			} else {
				requireBIRD(t)
				c = startSpeakingCluster(t, func(*lab.Node) []string { return nil })
				r = startLabBIRD(t, c)
			}
			testGracefulRestart(t, c, r)
		})
	}
}

// startLabBIRD starts BIRD in the lab's router namespace, accepting the
// nodes' sessions from the rack LAN; its log is shown when the test fails.
func startLabBIRD(t *testing.T, c *weirlab.Cluster) *bird.Router {
	t.Helper()
	return startBIRD(t, c, bird.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), ListenRanges4: []string{"192.0.2.0/24"}, PeerASN: nodeASN})
}

// startBIRD starts BIRD configured by cfg in the lab's router namespace.
func startBIRD(t *testing.T, c *weirlab.Cluster, cfg bird.Config) *bird.Router {
	t.Helper()
	return startBIRDIn(t, c.Router, cfg)
}

// startBIRDIn is startBIRD in the namespace ns.
func startBIRDIn(t *testing.T, ns *lab.Netns, cfg bird.Config) *bird.Router {
	t.Helper()
	b, err := bird.Start(context.Background(), ns, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(b.Dir, "bird.log"))
			t.Logf("BIRD's log:\n%s", log)
		}
	})
	return b
}

func testGracefulRestart(t *testing.T, c *weirlab.Cluster, r bgpRouter) {
	ctx := context.Background()
	node1 := c.Nodes[0]
	peer, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN}})
	if err != nil {
		t.Fatal(err)
	}
	svc := lbService("restarts", 30112, []string{"10.96.0.72"}, []string{"203.0.113.72"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32112
	createService(t, c, svc, node1.Pods)
	waitNextHops(t, r, "203.0.113.72", node1.IPv4.String())
	dst := netip.MustParseAddrPort("203.0.113.72:80")
	// node1 reports the session per family: IPv4 carries the VIP.
	st := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "node1 reports sending the VIP over IPv4", func() error {
		r, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		for _, n := range r.GetNodes() {
			for _, s := range n.GetBgpSessions() {
				for _, f := range s.GetFamilies() {
					if n.GetName() == node1.Name && f.GetAddressFamily() == weirv1.AddressFamily_ADDRESS_FAMILY_IPV4 && f.GetNegotiated() && f.GetSent() >= 1 {
						return nil
					}
				}
			}
		}
		return fmt.Errorf("statuses: %v", r.GetNodes())
	})

	// waitRestartDone waits until the last restart is over for the
	// router: a speaker that goes away again before it has sent its
	// routes and End-of-RIB loses the routes the router kept for it (RFC
	// 4724), which is what an agent restarted twice within a second gets.
	waitRestartDone := func() {
		t.Helper()
		waitNextHops(t, r, "203.0.113.72", node1.IPv4.String())
		eventually(t, "the router holds node1's route from its current session", func() error {
			if ok, err := r.RestartDone(ctx, node1.IPv4.String(), "203.0.113.72/32"); !ok {
				return fmt.Errorf("not yet (%v):\n%s", err, r.Describe(ctx, "203.0.113.72"))
			}
			return nil
		})
	}
	// restart restarts node1's agent under a connection loop, and says
	// whether the router's route to the VIP lost node1 meanwhile.
	restart := func(how func(int) error) (failures, total int64, withdrawn bool) {
		t.Helper()
		waitRestartDone()
		done := keepConnecting(c.Client, dst)
		watching, lost := make(chan struct{}), make(chan bool, 1)
		go func() {
			gone := false
			for {
				select {
				case <-watching:
					lost <- gone
					return
				case <-time.After(10 * time.Millisecond):
				}
				hops, err := r.NextHops(ctx, "203.0.113.72")
				gone = gone || (err == nil && !slices.Contains(hops, node1.IPv4.String()))
			}
		}()
		time.Sleep(200 * time.Millisecond)
		if err := how(0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		close(watching)
		failures, total = done()
		return failures, total, <-lost
	}
	// Without graceful restart the router drops node1's route while its
	// agent restarts (connections then fail, unless a slow one happens
	// to span the gap with its retransmissions): the control, so that
	// the test can tell the difference.
	if failures, total, withdrawn := restart(c.StopAndRestartAgent); !withdrawn {
		t.Fatalf("without graceful restart the route never left the router across the agent restart (%d of %d connections failed): the test cannot tell the difference", failures, total)
	} else {
		t.Logf("without graceful restart: route withdrawn, %d of %d connections failed", failures, total)
	}

	p := peer.GetBgpPeer()
	p.GracefulRestart = true
	upd, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: p})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router sees graceful restart from node1", func() error {
		if ok, err := r.GracefulRestartFrom(ctx, node1.IPv4.String()); !ok {
			return fmt.Errorf("not yet (%v):\n%s", err, r.Describe(ctx, "203.0.113.72"))
		}
		return nil
	})
	for _, how := range []struct {
		name    string
		restart func(int) error
	}{{"SIGTERM", c.StopAndRestartAgent}, {"SIGKILL", c.RestartAgent}, {"SIGTERM again", c.StopAndRestartAgent}} {
		if failures, total, withdrawn := restart(how.restart); failures != 0 || total < 100 || withdrawn {
			t.Errorf("%s: %d of %d connections failed across the agent restart with graceful restart (route withdrawn: %v); want 0 of at least 100, the route kept", how.name, failures, total, withdrawn)
		}
	}

	// A rolling restart of every agent in turn, then of the server, under
	// one connection loop.
	waitRestartDone()
	done := keepConnecting(c.Client, dst)
	for i := range c.Agents {
		if err := c.StopAndRestartAgent(i); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	if err := c.Server.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if failures, total := done(); failures != 0 || total < 200 {
		t.Errorf("rolling restart of every agent and the server: %d of %d connections failed; want 0 of at least 200", failures, total)
	}

	// A change the OPEN message does not carry is made in place: the
	// route never leaves the router meanwhile.
	waitNextHops(t, r, "203.0.113.72", node1.IPv4.String())
	p = upd.GetBgpPeer()
	p.HoldTimeSeconds = 30
	if _, err := c.Registry.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: p}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if hops, _ := r.NextHops(ctx, "203.0.113.72"); !slices.Contains(hops, node1.IPv4.String()) {
			t.Fatalf("changing the peer's hold time took node1's route away (next hops %v):\n%s", hops, r.Describe(ctx, "203.0.113.72"))
		}
	}
}
