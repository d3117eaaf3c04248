package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/internal/draintimeout"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Drain a node, or uncordon it",
		Long: `Drain a node, or uncordon it.

A drained node's health checks and /healthz answer 503 and its BGP
announcements are withdrawn, so that load balancers and routers stop
sending it new connections. What happens to its established connections
depends on what sends them: a load balancer that reads the health checks
keeps them where they are until they end; a BGP ECMP router moves them
with its hash to other nodes, which pass their packets back to the drained
node (agents' --pass-moved-connections, on by default), so they too go on
until they end.

With --drain-timeout they go on until that deadline at most: when it
passes, the node's agent ends the external connections the node still
serves (TCP connections to a load-balancer IP, an external IP or one of
its node ports) and their clients are reset at their next packet, so that
the node can be taken down without leaving them hanging. lbctl describe
node shows the deadline and how many connections are left (counted every
2 s). Draining a drained node again keeps its deadline, so that a drain
repeated to make sure moves nothing; with --drain-timeout it replaces the
deadline (--drain-timeout=0 clears it), and lbctl says what it was.

Uncordon undoes it. Either works whichever source (native or kubernetes)
owns the node, and survives server restarts.`,
	}
	var timeout time.Duration
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new external traffic to a node (see lbctl node --help for established connections)",
		Args:  cobra.ExactArgs(1),
	}
	drain.Flags().DurationVar(&timeout, "drain-timeout", 0, "end the external connections the node still serves this long after the drain (whole seconds, at most 168h); 0: no deadline, they run until they end. Not given, a drained node keeps the deadline it has")
	uncordon := &cobra.Command{
		Use:   "uncordon NODE",
		Short: "Let a drained node receive external traffic again",
		Args:  cobra.ExactArgs(1),
	}
	for _, v := range []struct {
		cmd *cobra.Command
		// call makes the change and says what it did, with the store
		// revision of the change.
		call func(ctx context.Context, c client, name string) (said string, rev uint64, err error)
	}{
		{drain, func(ctx context.Context, c client, name string) (string, uint64, error) {
			req := &weirv1.DrainNodeRequest{Name: name}
			if drain.Flags().Changed("drain-timeout") {
				req.DrainTimeout = durationpb.New(timeout)
			}
			r, err := c.DrainNode(ctx, req)
			return drained(name, r), revisionOf(r), err
		}},
		{uncordon, func(ctx context.Context, c client, name string) (string, uint64, error) {
			r, err := c.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: name})
			return "node/" + name + " uncordoned", revisionOf(r), err
		}},
	} {
		var wait time.Duration
		v.cmd.RunE = func(cmd *cobra.Command, args []string) error {
			// Checked before anything is asked (only drain sets it).
			if err := draintimeout.Check(timeout); err != nil {
				return usageErrorf("--drain-timeout: %v", err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			said, rev, err := v.call(cmd.Context(), c, args[0])
			if err != nil {
				return explain(kindNamed("Node"), args[0], err)
			}
			fmt.Fprintln(a.stdout, said)
			if wait > 0 {
				return a.waitProgrammed(cmd.Context(), rev, wait)
			}
			return nil
		}
		addWaitFlag(v.cmd.Flags(), &wait)
		cmd.AddCommand(v.cmd)
	}
	return cmd
}

// drained says what a drain did: drained, or, to a node drained already,
// what became of its deadline.
func drained(name string, r *weirv1.DrainNodeResponse) string {
	now, before := r.GetNode().GetDrainDeadline(), r.GetPreviousDrainDeadline()
	switch {
	case !r.GetWasDrained() && now == nil:
		return fmt.Sprintf("node/%s drained", name)
	case !r.GetWasDrained():
		return fmt.Sprintf("node/%s drained (drain deadline %s)", name, deadlineText(now))
	case proto.Equal(before, now) && now == nil:
		return fmt.Sprintf("node/%s already drained; no drain deadline", name)
	case proto.Equal(before, now):
		return fmt.Sprintf("node/%s already drained; drain deadline kept at %s", name, deadlineText(now))
	}
	return fmt.Sprintf("node/%s already drained; drain deadline changed from %s to %s", name, deadlineText(before), deadlineText(now))
}

// deadlineText is a drain's deadline, or "none".
func deadlineText(d *timestamppb.Timestamp) string {
	if d == nil {
		return "none"
	}
	return d.AsTime().UTC().Format(time.RFC3339)
}
