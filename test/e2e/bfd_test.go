package e2e

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// TestBFDTakesADeadNodesRoutesAway: node speakers peer with FRR (bfdd)
// and with BIRD, BFD at 100 ms × 3 beside a 9 s hold time. Two faults the
// router cannot see on its own link take node1's next hop out of the
// router's route well before the hold time, each found by BFD alone:
// every packet between node1 and the router dropped in node1's namespace
// (a dead path), and node1's agent frozen (SIGSTOP: a hung process, whose
// TCP the kernel keeps alive). Through the dead path node1 reports its BFD
// down and its session closed. Lifting each brings node1 back. With FRR,
// BFD shut down at the router (AdminDown to the nodes) then takes nothing
// away.
func TestBFDTakesADeadNodesRoutesAway(t *testing.T) {
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) { testBFD(t, impl) })
	}
}

// bfdRouter is a lab router of either implementation with BFD.
type bfdRouter interface {
	bgpRouter
	// bfdStates is each BFD session's state by peer address, in the
	// router's own words.
	bfdStates(ctx context.Context) (map[string]string, error)
}

type frrBFD struct{ *frr.Router }

func (r frrBFD) bfdStates(ctx context.Context) (map[string]string, error) { return r.BFDPeers(ctx) }

type birdBFD struct{ *bird.Router }

func (r birdBFD) bfdStates(ctx context.Context) (map[string]string, error) { return r.BFDSessions(ctx) }

// bfdLab is the lab routers' BFD: 100 ms × 3, detection in 300 ms.
const (
	bfdInterval   = 100 * time.Millisecond
	bfdMultiplier = 3
)

// startBFDRouter starts impl in the lab's router namespace with BFD on
// for every speaker.
func startBFDRouter(t *testing.T, c *weirlab.Cluster, impl string) bfdRouter {
	t.Helper()
	if impl == "FRR" {
		cfg := labRouter
		cfg.BFD = &frr.BFD{Interval: bfdInterval, Multiplier: bfdMultiplier}
		r, err := frr.StartTemp(context.Background(), c.Router, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return frrBFD{r}
	}
	return birdBFD{startBIRD(t, c, bird.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), ListenRanges4: []string{"192.0.2.0/24"},
		PeerASN: nodeASN, BFD: &bird.BFD{Interval: bfdInterval, Multiplier: bfdMultiplier}})}
}

// requireRouter is requireFRR or requireBIRD, by impl.
func requireRouter(t *testing.T, impl string) {
	t.Helper()
	if impl == "FRR" {
		requireFRR(t)
	} else {
		requireBIRD(t)
	}
}

func testBFD(t *testing.T, impl string) {
	requireRouter(t, impl)
	c := startSpeakingCluster(t, func(*lab.Node) []string { return nil })
	r := startBFDRouter(t, c, impl)
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN,
		HoldTimeSeconds: 9, Bfd: &weirv1.BfdProfile{ReceiveIntervalMs: 100, TransmitIntervalMs: 100, DetectMultiplier: bfdMultiplier}}}); err != nil {
		t.Fatal(err)
	}
	createService(t, c, lbService("bfd", 30141, []string{"10.96.0.141"}, []string{"203.0.113.141"}), c.Pods())
	const vip = "203.0.113.141"
	both := []string{node1.IPv4.String(), node2.IPv4.String()}
	waitNextHops(t, r, vip, both...)
	waitBFDUp(t, r, both...)
	// The nodes report their side of it beside each session.
	status := weirv1.NewStatusServiceClient(c.Conn)
	eventually(t, "every node reports its BFD session Up", func() error {
		resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return err
		}
		for _, n := range resp.GetNodes() {
			if s := n.GetBgpSessions(); len(s) != 1 || s[0].GetBfdState() != "Up" {
				return fmt.Errorf("%s reports %v", n.GetName(), s)
			}
		}
		return nil
	})

	// withdrawn times how long after fault() the router's route loses
	// node1, then lifts the fault and waits for node1 to come back.
	withdrawn := func(what string, fault, lift func() error) {
		t.Helper()
		start := time.Now()
		if err := fault(); err != nil {
			t.Fatal(err)
		}
		var took time.Duration
		for {
			hops, _ := r.NextHops(ctx, vip)
			if slices.Equal(hops, []string{node2.IPv4.String()}) {
				took = time.Since(start)
				break
			}
			if time.Since(start) > 3*time.Second {
				lift()
				t.Fatalf("%s: node1 still in the router's route after 3s (the hold time is 9s): %v\n%s", what, hops, r.Describe(ctx, vip))
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%s: the router withdrew node1 in %v (BFD detection: %v)", what, took.Round(time.Millisecond), bfdMultiplier*bfdInterval)
		if what == "a dead path" {
			// node1 itself found it too: its BFD is down and it closed
			// the session (its server is not behind the router).
			eventually(t, "node1 reports its BFD down and its session closed", func() error {
				resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
				if err != nil {
					return err
				}
				for _, n := range resp.GetNodes() {
					if n.GetName() != node1.Name {
						continue
					}
					if s := n.GetBgpSessions(); len(s) != 1 || s[0].GetBfdState() != "Down" || s[0].GetSessionState() == weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED {
						return fmt.Errorf("node1 reports %v", s)
					}
				}
				return nil
			})
		}
		if err := lift(); err != nil {
			t.Fatal(err)
		}
		waitNextHops(t, r, vip, both...)
		waitBFDUp(t, r, both...)
	}

	router := lab.RouterLANv4.String()
	withdrawn("a dead path", func() error {
		_, err := node1.Run(ctx, "nft", "add table inet bfdfault { chain in { type filter hook input priority -400; ip saddr "+router+" drop; }; "+
			"chain out { type filter hook output priority -400; ip daddr "+router+" drop; }; }")
		return err
	}, func() error {
		_, err := node1.Run(ctx, "nft", "delete table inet bfdfault")
		return err
	})
	withdrawn("a frozen agent", func() error { return c.Agents[0].Signal(syscall.SIGSTOP) },
		func() error { return c.Agents[0].Signal(syscall.SIGCONT) })

	f, ok := r.(frrBFD)
	if !ok {
		return
	}
	// The router takes BFD away on purpose (its profile shut down): it
	// tells the nodes AdminDown, which is no fault of the path (RFC 5882
	// 3.2). The nodes keep their sessions and the router both next hops,
	// longer than the second a session BFD closed would stay closed.
	sessions := func() (map[string]*weirv1.BgpSession, error) {
		resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return nil, err
		}
		got := map[string]*weirv1.BgpSession{}
		for _, n := range resp.GetNodes() {
			if s := n.GetBgpSessions(); len(s) == 1 {
				got[n.GetName()] = s[0]
			}
		}
		return got, nil
	}
	before, err := sessions()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Vtysh(ctx, "configure terminal\nbfd\nprofile speakers\nshutdown"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		hops, err := r.NextHops(ctx, vip)
		slices.Sort(hops)
		if err != nil || !slices.Equal(hops, both) {
			t.Fatalf("BFD shut down at the router: its route for %s goes through %v (%v); want both nodes still\n%s", vip, hops, err, r.Describe(ctx, vip))
		}
	}
	eventually(t, "every node reports its BFD session Down by the router's AdminDown, and the same BGP session established", func() error {
		now, err := sessions()
		if err != nil {
			return err
		}
		for _, n := range c.Nodes {
			s, was := now[n.Name], before[n.Name]
			if s.GetBfdState() != "Down" || s.GetSessionState() != weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED ||
				!s.GetEstablishedSince().AsTime().Equal(was.GetEstablishedSince().AsTime()) {
				return fmt.Errorf("%s reports %v; before the shutdown %v", n.Name, s, was)
			}
		}
		return nil
	})
	if _, err := f.Vtysh(ctx, "configure terminal\nbfd\nprofile speakers\nno shutdown"); err != nil {
		t.Fatal(err)
	}
	waitBFDUp(t, r, both...)
}

// waitBFDUp waits until the router's BFD sessions with peers are up. On
// a saturated machine a 100 ms BFD session can flap without any fault (a
// process that gets no CPU for 300 ms misses its packets), and the
// damping then keeps a flapping session's BGP closed for up to 30 s: the
// wait allows for that.
func waitBFDUp(t *testing.T, r bfdRouter, peers ...string) {
	t.Helper()
	wait.For(t, 45*time.Second, fmt.Sprintf("the router's BFD sessions with %v are up", peers), func() error {
		states, err := r.bfdStates(context.Background())
		if err != nil {
			return err
		}
		for _, p := range peers {
			if s := states[p]; s != "up" && s != "Up" {
				return fmt.Errorf("BFD sessions %v", states)
			}
		}
		return nil
	})
}
