package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
)

// TestDrainDeadlineEndsWhatTheNodeStillServes: two nodes behind FRR, and
// long-lived connections to a load-balancer IP that the router spreads
// over both. node1 is drained with a deadline 8 s away (lbctl node drain
// --drain-timeout). Until the deadline no connection breaks, the router
// sends everything to node2, which passes node1's connections back to it,
// and node1's status (and lbctl describe node) counts the connections it
// still serves. When the deadline passes node1 ends them: exactly the
// connections node1 held are reset, its count goes to 0, and node2's
// connections, and new ones, go on. Without the deadline the same
// connections are kept (TestMovedConnectionsSurvive), so the test fails
// if the agent ends nothing, or ends the wrong ones.
func TestDrainDeadlineEndsWhatTheNodeStillServes(t *testing.T) {
	c, r := flowLabOf(t, 2, "FRR", func(*lab.Node) []string { return nil })
	ctx := context.Background()
	node1, node2 := c.Nodes[0], c.Nodes[1]
	createService(t, c, lbService("deadline", 30143, []string{"10.96.0.143"}, []string{"203.0.113.143"}), c.Pods())
	vip := netip.MustParseAddr("203.0.113.143")
	dst := netip.AddrPortFrom(vip, 80)
	waitNextHops(t, r, vip.String(), node1.IPv4.String(), node2.IPv4.String())

	const n = 40
	l := startLongLived(t, c.Client, dst, n)
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	// The connections node1 holds: those it DNAT'ed, each looked up in
	// its table. A dump of the table is compared.
	held := conntrackHeld(t, node1, l, true)
	dumped := conntrackPorts(t, node1, vip, true)
	for _, p := range held {
		if !slices.Contains(dumped, p) {
			t.Logf("node1's entry of the connection from port %s was found by its lookup and not in a dump of the table", p)
		}
	}
	t.Logf("node1 holds %d of %d connections", len(held), n)
	if len(held) == 0 || len(held) == n {
		t.Fatalf("node1 holds %d of %d connections: the router did not spread them, so the test would tell nothing", len(held), n)
	}

	out, err := c.Lbctl(ctx, "node", "drain", node1.Name, "--drain-timeout", "8s")
	if err != nil || !strings.Contains(out, "drained (drain deadline ") {
		t.Fatalf("lbctl node drain --drain-timeout 8s: %q, %v", out, err)
	}
	got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: node1.Name})
	if err != nil {
		t.Fatal(err)
	}
	deadline := got.GetNode().GetDrainDeadline().AsTime()
	t.Logf("node1 drained; its connections end at %s, in %v", deadline.Format(time.RFC3339), time.Until(deadline).Round(time.Millisecond))
	waitNextHops(t, r, vip.String(), node2.IPv4.String())

	// Before the deadline: node1 counts what it still serves.
	status := weirv1.NewStatusServiceClient(c.Conn)
	drainOf := func() (*weirv1.DrainStatus, error) {
		resp, err := status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			return nil, err
		}
		for _, s := range resp.GetNodes() {
			if s.GetName() == node1.Name {
				return s.GetDrain(), nil
			}
		}
		return nil, fmt.Errorf("no status of %s", node1.Name)
	}
	wait.For(t, max(time.Until(deadline), time.Second), "node1's status counts connections it still serves, before the deadline", func() error {
		d, err := drainOf()
		if err != nil {
			return err
		}
		if d.GetConnectionsLeft() == 0 {
			return fmt.Errorf("drain status %v", d)
		}
		t.Logf("before the deadline node1 reports %d connections left (it held %d)", d.GetConnectionsLeft(), len(held))
		return nil
	})
	started := time.Now()
	desc, err := c.Lbctl(ctx, "describe", "node", node1.Name)
	if err != nil {
		t.Fatal(err)
	}
	left := regexp.MustCompile(`(?m)^Connections Left: +(\d+) \(counted `).FindStringSubmatch(desc)
	if !strings.Contains(desc, deadline.UTC().Format(time.RFC3339)) || left == nil {
		t.Errorf("lbctl describe node %s shows no drain deadline or no connections left:\n%s", node1.Name, desc)
	} else if count, _ := strconv.Atoi(left[1]); count == 0 && started.Before(deadline.Add(-time.Second)) {
		t.Errorf("lbctl describe node %s, before the deadline, shows no connection left:\n%s", node1.Name, desc)
	}

	// After it: node1 ends exactly those it held, and counts 0.
	wait.For(t, time.Until(deadline)+30*time.Second, "the connections node1 held break after the deadline", func() error {
		if broken, _ := l.Broken(); len(broken) < len(held) {
			return fmt.Errorf("%d of %d broke", len(broken), len(held))
		}
		return nil
	})
	wait.For(t, 30*time.Second, "node1's status counts 0 connections left, after the deadline", func() error {
		d, err := drainOf()
		if err != nil {
			return err
		}
		if d.GetConnectionsLeft() != 0 || !d.GetCountedAt().AsTime().After(deadline) || d.GetEndedAtDeadline() == 0 {
			return fmt.Errorf("drain status %v", d)
		}
		t.Logf("after the deadline node1 reports %d connections left, %d ended at the deadline", d.GetConnectionsLeft(), d.GetEndedAtDeadline())
		return nil
	})
	// The others go on, as do new connections.
	time.Sleep(2 * time.Second)
	sample(t, c.Client, dst, 10)
	requests, _ := l.Stop()
	stopped = true
	broken, brokenAt := l.Broken()
	t.Logf("%d connections, %d requests, %d broke", n, requests, len(broken))
	for i, b := range broken {
		if brokenAt[i].Before(deadline) {
			t.Errorf("broke %v before the deadline: %s", deadline.Sub(brokenAt[i]).Round(time.Millisecond), b)
		}
		if !slices.Contains(held, brokenPort(b)) {
			t.Errorf("a connection node1 did not hold broke: %s", b)
		}
	}
	if len(broken) != len(held) {
		t.Errorf("%d connections broke, want the %d node1 held", len(broken), len(held))
	}
}
