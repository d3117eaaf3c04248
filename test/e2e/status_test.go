package e2e

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
)

// TestWaitProgrammedMeansInTheKernel: right after WaitProgrammed says a
// write is programmed, every node's nftables table holds it, real agents
// and real nft; a write that concerns one node (a drain) is programmed on
// the others at once.
func TestWaitProgrammedMeansInTheKernel(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	st := weirv1.NewStatusServiceClient(c.Conn)
	pods := c.Pods()
	createService(t, c, lbService("waited", 30114, []string{"10.96.0.74"}, []string{"203.0.113.74"}), pods[1:])

	// The endpoints move to the first pod: wait, then read every kernel.
	moved := pods[0]
	var rev uint64
	for _, s := range endpointSlices("waited", []*lab.Pod{moved}) {
		r, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: s})
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseUint(r.GetEndpointSlice().GetMetadata().GetResourceVersion(), 10, 64)
		rev = max(rev, v)
	}
	r, err := st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(10 * time.Second)})
	if err != nil || !r.GetProgrammed() {
		t.Fatalf("WaitProgrammed(%d): %v, %v", rev, r, err)
	}
	for _, n := range c.Nodes {
		out, err := n.Run(ctx, "nft", "list", "table", "ip", "weir")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, moved.IPv4.String()+" . 8080") {
			t.Errorf("%s: right after WaitProgrammed the table has no backend %s:\n%.2000s", n.Name, moved.IPv4, out)
		}
	}

	// A drain concerns node1 alone.
	d, err := c.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: c.Nodes[0].Name})
	if err != nil {
		t.Fatal(err)
	}
	rev = d.GetRevision()
	r, err = st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(10 * time.Second)})
	if err != nil || !r.GetProgrammed() {
		t.Fatalf("WaitProgrammed(%d) after the drain: %v, %v", rev, r, err)
	}
}

// TestAKilledAgentIsShownStaleAtOnce: an agent killed with SIGKILL is
// shown as not connected, and its reports as unknown, within a second.
func TestAKilledAgentIsShownStaleAtOnce(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	st := weirv1.NewStatusServiceClient(c.Conn)
	node2 := c.Nodes[1].Name
	connected := func() bool {
		r, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range r.GetNodes() {
			if n.GetName() == node2 {
				return n.GetConnected()
			}
		}
		return false
	}
	eventually(t, "node2's agent connected", func() error {
		if !connected() {
			return errors.New("not yet")
		}
		return nil
	})
	if err := c.Agents[1].Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for connected() {
		if time.Since(killed) > time.Second {
			t.Fatal("a second after its agent was killed, node2 still shows connected")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("node2 shown not connected %v after its agent was killed", time.Since(killed).Round(time.Millisecond))
}
