package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// TestPeersOverALinkOfLinkLocalAddressesOnly: node1 and a router (FRR or
// BIRD, in the client's namespace) share a link that has no IPv4 and no
// global IPv6 address, only link-local ones, as the links of an RFC 7938
// fabric. With FRR both ends are unnumbered: the peer names only the
// node's interface (Weir dials the one link-local neighbour the router's
// advertisements put in the node's table) and FRR's neighbour is its
// interface ("neighbor fab1 interface"), which learns the node's address
// from the router advertisements the node sends there (without them FRR
// stays Idle). With BIRD both ends name the other's link-local address,
// with the interface as its zone. Over the IPv6 session the node
// announces a pool's IPv4 address with its own link-local address as next
// hop (RFC 8950; with the node's IPv4 address BIRD refuses the route as
// not directly reachable): the router's RIB holds it from the node's AS,
// its kernel routes it over the link, and the client's requests reach
// node1's pod that way. The pool's advertisement names the peer, which
// keeps it to the router on the link whatever its address; another pool,
// kept to another peer, never reaches the router. BFD (100 ms × 3, beside
// a 9 s hold time) runs over the link's addresses: every packet on the
// link dropped in node1's namespace takes the route away within the
// detection time's order, not the hold time, and lifting it brings the
// route back; so do the link going down and up and node1's agent killed
// and started again.
func TestPeersOverALinkOfLinkLocalAddressesOnly(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) { testLinkLocalPeer(t, impl) })
	}
}

func testLinkLocalPeer(t *testing.T, impl string) {
	requireRouter(t, impl)
	c := startSpeakingCluster(t, func(*lab.Node) []string { return nil })
	ctx := context.Background()
	node1 := c.Nodes[0]
	const nodeLL, routerLL = "fe80::11", "fe80::1"
	// The link: fab0 on node1, fab1 in the client's namespace.
	if _, err := node1.Run(ctx, "ip", "link", "add", "fab0", "type", "veth", "peer", "name", "fab1", "netns", c.Client.Name); err != nil {
		t.Fatal(err)
	}
	for _, end := range []struct {
		ns      *lab.Netns
		dev, ll string
	}{{node1.Netns, "fab0", nodeLL}, {c.Client, "fab1", routerLL}} {
		if _, err := end.ns.Run(ctx, "ip", "link", "set", end.dev, "addrgenmode", "none"); err != nil {
			t.Fatal(err)
		}
		if _, err := end.ns.Run(ctx, "ip", "-6", "addr", "add", end.ll+"/64", "dev", end.dev, "nodad"); err != nil {
			t.Fatal(err)
		}
		if _, err := end.ns.Run(ctx, "ip", "link", "set", end.dev, "up"); err != nil {
			t.Fatal(err)
		}
	}

	peer := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "fabric"}, Interface: "fab0", Asn: routerASN, MyAsn: nodeASN,
		HoldTimeSeconds: 9, KeepaliveSeconds: 3, ConnectRetrySeconds: 1, NodeSelector: map[string]string{"fabric": "fab0"},
		Bfd: &weirv1.BfdProfile{ReceiveIntervalMs: 100, TransmitIntervalMs: 100, DetectMultiplier: bfdMultiplier}}
	var attributes func(ctx context.Context, prefix string) (string, error)
	var describe func(ctx context.Context, prefix string) string
	var bfdStates func(ctx context.Context) (map[string]string, error)
	if impl == "FRR" {
		f, err := frr.StartTemp(ctx, c.Client, frr.Config{BFD: &frr.BFD{}, Text: fmt.Sprintf(`frr defaults traditional
hostname fabric
log stdout
!
bfd
 profile fast
  receive-interval 100
  transmit-interval 100
  detect-multiplier 3
 !
!
interface fab1
 ipv6 nd ra-interval 1
 no ipv6 nd suppress-ra
!
router bgp %[1]d
 bgp router-id %[2]s
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 timers bgp 3 9
 neighbor fab1 interface remote-as external
 neighbor fab1 advertisement-interval 0
 neighbor fab1 bfd profile fast
 address-family ipv4 unicast
  neighbor fab1 activate
 exit-address-family
 address-family ipv6 unicast
  neighbor fab1 activate
 exit-address-family
!
`, routerASN, lab.ClientIPv4)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.Close)
		attributes = func(ctx context.Context, prefix string) (string, error) { return frrAttributes(ctx, f, prefix) }
		describe = f.Describe
		bfdStates = f.BFDPeers
	} else {
		peer.Address = routerLL // with Interface, its zone
		b := startBIRDIn(t, c.Client, bird.Config{RouterID: lab.ClientIPv4.String(), BFD: &bird.BFD{Interval: bfdInterval, Multiplier: bfdMultiplier},
			Protocols: fmt.Sprintf(`protocol bgp fabric {
  local as %d;
  neighbor %s%%fab1 as %d;
  interface "fab1";
  hold time 9;
  connect retry time 1;
  error wait time 1, 2;
  bfd on;
  debug { states, events };
  ipv4 { import all; export none; extended next hop on; };
  ipv6 { import all; export none; };
}
`, routerASN, nodeLL, nodeASN)})
		attributes = func(ctx context.Context, prefix string) (string, error) { return birdAttributes(ctx, b, prefix) }
		describe = b.Describe
		bfdStates = b.BFDSessions
	}

	got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: node1.Name})
	if err != nil {
		t.Fatal(err)
	}
	n := got.GetNode()
	n.Metadata.Labels = map[string]string{"fabric": "fab0"}
	if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n}); err != nil {
		t.Fatal(err)
	}
	// A second peer of node1's, a router never reached, for the pool
	// kept from the link's router.
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "collector"},
		Address: "192.0.2.250", Asn: routerASN, MyAsn: nodeASN, ConnectRetrySeconds: 1, NodeSelector: map[string]string{"fabric": "fab0"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: peer}); err != nil {
		t.Fatal(err)
	}
	n1p1 := node1.Pods[0]
	const vip, elsewhere = "203.0.113.105", "203.0.113.113"
	for _, p := range []struct {
		name, addresses, vip, peer string
		port                       int32
	}{{"fabric", "203.0.113.104/29", vip, "fabric", 131}, {"elsewhere", "203.0.113.112/29", elsewhere, "collector", 132}} {
		if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
			Metadata: &weirv1.ObjectMeta{Name: p.name}, Addresses: []string{p.addresses}, BgpAdvertisement: &weirv1.BgpAdvertisement{Peers: []string{p.peer}}}}); err != nil {
			t.Fatal(err)
		}
		svc := lbService(p.name, 30000+p.port, []string{fmt.Sprintf("10.96.0.%d", p.port)}, []string{p.vip})
		svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		svc.Spec.HealthCheckNodePort = 32000 + p.port
		createService(t, c, svc, []*lab.Pod{n1p1})
	}

	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "node1's one session over fab0 is established", func() error {
		resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		var lines []string
		for _, n := range resp.GetNodes() {
			for _, s := range n.GetBgpSessions() {
				if n.GetName() != node1.Name {
					return fmt.Errorf("%s has a session with %s; want none", n.GetName(), s.GetPeerAddress())
				}
				if s.GetPeerAddress() != "192.0.2.250" {
					lines = append(lines, fmt.Sprintf("%s %s, BFD %s", s.GetPeerAddress(), s.GetSessionState(), s.GetBfdState()))
				}
			}
		}
		if len(lines) != 1 || !strings.HasSuffix(lines[0], weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED.String()+", BFD Up") {
			return fmt.Errorf("node1's sessions over fab0 %q; want one established, BFD Up\n%s", lines, describe(ctx, vip))
		}
		return nil
	})
	eventually(t, "the router's RIB holds the pool's address from node1's AS", func() error {
		got, err := attributes(ctx, vip+"/32")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(got, fmt.Sprintf("as path %d;", nodeASN)) || strings.Count(got, "as path") != 1 {
			return fmt.Errorf("the router's paths for %s/32: %q; want one from AS %d\n%s", vip, got, nodeASN, describe(ctx, vip))
		}
		return nil
	})
	// The router's kernel sends the address over the link, to node1's
	// link-local address: an IPv4 route through an IPv6 next hop.
	eventually(t, "the router's kernel routes the address over fab1", func() error {
		out, err := c.Client.Run(ctx, "ip", "route", "get", vip)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "dev fab1") || !strings.Contains(out, nodeLL) {
			return fmt.Errorf("ip route get %s: %q; want via inet6 %s dev fab1\n%s", vip, out, nodeLL, describe(ctx, vip))
		}
		return nil
	})
	for _, rep := range sample(t, c.Client, netip.MustParseAddrPort(vip+":80"), 5) {
		if rep.Pod != n1p1.Name {
			t.Errorf("over fab1 to %s: pod %s answered; want n1p1", vip, rep.Pod)
		}
	}
	// The router's side of BFD: one session, with node1's address on the
	// link, Up.
	eventually(t, "the router's BFD session with node1 is up", func() error {
		states, err := bfdStates(ctx)
		if err != nil {
			return err
		}
		if len(states) != 1 || !strings.EqualFold(states[nodeLL], "up") {
			return fmt.Errorf("the router's BFD sessions %v; want %s up", states, nodeLL)
		}
		return nil
	})
	if got, err := attributes(ctx, elsewhere+"/32"); err != nil || got != "" {
		t.Errorf("the router's paths for %s/32, a pool kept to another peer: %q (%v); want none", elsewhere, got, err)
	}

	// A dead link, which neither end's carrier shows: BFD finds it.
	overLink := func() (bool, error) {
		out, err := c.Client.Run(ctx, "ip", "route", "get", vip)
		return strings.Contains(out, "dev fab1"), err
	}
	start := time.Now()
	if _, err := node1.Run(ctx, "nft", `add table inet linkfault { chain in { type filter hook input priority -400; iifname "fab0" drop; }; `+
		`chain out { type filter hook output priority -400; oifname "fab0" drop; }; }`); err != nil {
		t.Fatal(err)
	}
	for {
		over, err := overLink()
		if err != nil {
			t.Fatal(err)
		}
		if !over {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("the link dead 3s (BFD detection %v, hold time 9s): the router still routes %s over it\n%s", bfdMultiplier*bfdInterval, vip, describe(ctx, vip))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the link dead: the router's kernel stopped routing %s over it in %v (BFD detection %v)", vip, time.Since(start).Round(time.Millisecond), bfdMultiplier*bfdInterval)
	if _, err := node1.Run(ctx, "nft", "delete table inet linkfault"); err != nil {
		t.Fatal(err)
	}
	// backOverLink waits until the router routes the address over the
	// link again, BFD up: the damping of a BFD that flapped may keep the
	// session closed a while.
	backOverLink := func(what string) {
		t.Helper()
		wait.For(t, 45*time.Second, what+": the router routes the address over the link again, BFD up", func() error {
			if over, err := overLink(); err != nil || !over {
				return fmt.Errorf("not over fab1 (%v)\n%s", err, describe(ctx, vip))
			}
			states, err := bfdStates(ctx)
			if err != nil {
				return err
			}
			if !strings.EqualFold(states[nodeLL], "up") {
				return fmt.Errorf("the router's BFD sessions %v", states)
			}
			return nil
		})
	}
	backOverLink("the link back")

	// The link down and up again, which both ends see (the router drops
	// the route at once), then node1's agent killed (SIGKILL) and
	// started again: each time the session comes back over the link by
	// its addresses alone (FRR learns node1's again from its router
	// advertisements), with its pool kept to it.
	for _, step := range []struct {
		what       string
		fault, fix func() error
	}{
		{"fab0 down and up", func() error {
			_, err := node1.Run(ctx, "ip", "link", "set", "fab0", "down")
			return err
		}, func() error {
			if _, err := node1.Run(ctx, "ip", "link", "set", "fab0", "up"); err != nil {
				return err
			}
			// The kernel drops a link's IPv6 link-local addresses when
			// it goes down, and makes none here (addrgenmode none): the
			// node's network configuration gives them back, as
			// systemd-networkd would.
			for _, end := range []struct {
				ns      *lab.Netns
				dev, ll string
			}{{node1.Netns, "fab0", nodeLL}, {c.Client, "fab1", routerLL}} {
				if _, err := end.ns.Run(ctx, "ip", "-6", "addr", "replace", end.ll+"/64", "dev", end.dev, "nodad"); err != nil {
					return err
				}
			}
			return nil
		}},
		{"node1's agent killed and started again", func() error { return c.RestartAgent(0) }, func() error { return nil }},
	} {
		faultAt := time.Now()
		if err := step.fault(); err != nil {
			t.Fatal(err)
		}
		if step.what == "fab0 down and up" {
			eventually(t, step.what+": the router stops routing the address over the link", func() error {
				if over, err := overLink(); err != nil || over {
					return fmt.Errorf("still over fab1 (%v)", err)
				}
				return nil
			})
		}
		if err := step.fix(); err != nil {
			t.Fatal(err)
		}
		// A new session first: what the router shows until it has
		// noticed the fault may still be the old one's.
		wait.For(t, 45*time.Second, step.what+": node1 reports a session over fab0 established since, BFD Up", func() error {
			resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
			if err != nil {
				return err
			}
			for _, n := range resp.GetNodes() {
				for _, s := range n.GetBgpSessions() {
					if n.GetName() == node1.Name && s.GetPeerAddress() != "192.0.2.250" &&
						s.GetSessionState() == weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED &&
						s.GetBfdState() == "Up" && s.GetEstablishedSince().AsTime().After(faultAt) {
						return nil
					}
				}
			}
			return fmt.Errorf("no session established since the fault\n%s", describe(ctx, vip))
		})
		backOverLink(step.what)
		if got, err := attributes(ctx, elsewhere+"/32"); err != nil || got != "" {
			t.Errorf("%s: the router's paths for %s/32, a pool kept to another peer: %q (%v); want none", step.what, elsewhere, got, err)
		}
		for range 3 {
			rep, err := weirlab.Get(ctx, c.Client, netip.MustParseAddrPort(vip+":80"))
			if err != nil {
				states, _ := bfdStates(ctx)
				log := c.Agents[0].Log()
				t.Fatalf("%s: a request over fab1 to %s: %v\nthe router's BFD sessions %v\n%s\nnode1's agent, last lines:\n%s", step.what, vip, err, states, describe(ctx, vip), log[max(0, len(log)-6000):])
			}
			if rep.Pod != n1p1.Name {
				t.Errorf("%s: over fab1 to %s: pod %s answered; want n1p1", step.what, vip, rep.Pod)
			}
		}
	}
}
