package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// previousRelease is the release before this tree (CHANGELOG.md): the
// skew policy (docs/operations.md, "Versions and skew") promises that its
// agents and this server, and this tree's agents and its server, work
// together.
var previousRelease = struct{ version, commit string }{"v0.1.0", "735888e5a88c9afc18915a9c5e3643c438e716ab"}

// TestRollingUpgradeFromThePreviousRelease runs the upgrade the docs
// describe, under traffic, with every pairing of versions on the way: the
// previous release's server with one agent of each version (an agent
// upgraded first), this tree's server with the previous release's agent
// (the server upgraded first, the usual order), then every agent
// upgraded. At each step a change reaches every node's kernel, as the
// traffic through each node's node port shows, and no connection fails.
func TestRollingUpgradeFromThePreviousRelease(t *testing.T) {
	lab.SkipUnlessPrivileged(t)
	ctx := context.Background()
	prev, err := weirlab.BuildRelease(ctx, previousRelease.version, previousRelease.commit)
	if err != nil {
		t.Fatal(err)
	}
	c := startClusterWith(t, func(c *weirlab.Cluster) {
		c.Bin.Server = prev.Server
		c.AgentBinaries = map[string]string{"node1": prev.Agent}
	})
	createWeb(t, c)
	dst := netip.AddrPortFrom(lbIP, 80)
	eventually(t, "the load-balancer IP answers", func() error {
		_, err := weirlab.Get(ctx, c.Client, dst)
		return err
	})
	done := keepConnecting(c.Client, dst)

	// serveOnly has the service's endpoints be pods, and checks that both
	// nodes' kernels send to those and no others.
	serveOnly := func(step string, pods []*lab.Pod) {
		t.Helper()
		for _, s := range endpointSlices("web", pods) {
			r, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s})
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			waitEveryNodeProgrammed(t, c, step, r.GetEndpointSlice().GetMetadata().GetRevision())
		}
		var want []string
		for _, p := range pods {
			want = append(want, p.Name)
		}
		for _, n := range c.Nodes {
			eventually(t, step+": "+n.Name+" sends only to "+fmt.Sprint(want), func() error {
				for _, r := range sample(t, c.Client, netip.AddrPortFrom(n.IPv4, nodePort), 12) {
					if !slices.Contains(want, r.Pod) {
						return fmt.Errorf("reached %s", r.Pod)
					}
				}
				return nil
			})
		}
	}
	agentVersions := func(step string, want map[string]string) {
		t.Helper()
		r, err := weirv1.NewStatusServiceClient(c.Conn).ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range r.GetNodes() {
			if got := n.GetAgentVersion(); got != want[n.GetName()] {
				t.Errorf("%s: %s's agent reports version %q, want %q", step, n.GetName(), got, want[n.GetName()])
			}
		}
	}

	// 1. The previous server; node1 on the previous agent, node2 on this
	// tree's (an agent upgraded before its server).
	serveOnly("previous server, mixed agents", c.Nodes[0].Pods)

	// 2. The server upgraded in place: same store, agents reconnect.
	if err := c.Server.Stop(); err != nil {
		t.Fatal(err)
	}
	c.Bin.Server = bin.Server
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	serveOnly("this server, mixed agents", c.Pods())
	agentVersions("this server, mixed agents", map[string]string{"node1": previousRelease.version, "node2": "dev"})

	// 3. node1's agent upgraded as a DaemonSet rollout does (SIGTERM).
	delete(c.AgentBinaries, "node1")
	if err := c.StopAndRestartAgent(0); err != nil {
		t.Fatal(err)
	}
	serveOnly("every agent upgraded", c.Nodes[1].Pods)
	agentVersions("every agent upgraded", map[string]string{"node1": "dev", "node2": "dev"})

	failures, total := done()
	t.Logf("%d of %d connections failed across the upgrade", failures, total)
	if failures != 0 || total < 200 {
		t.Errorf("%d of %d connections failed across the upgrade; want 0 of at least 200", failures, total)
	}
}
