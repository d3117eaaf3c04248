package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

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
2 s). Draining a drained node again sets a new deadline, or clears it
without --drain-timeout.

Uncordon undoes it. Either works whichever source (native or kubernetes)
owns the node, and survives server restarts.`,
	}
	var timeout time.Duration
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new external traffic to a node (see lbctl node --help for established connections)",
		Args:  cobra.ExactArgs(1),
	}
	drain.Flags().DurationVar(&timeout, "drain-timeout", 0, "end the external connections the node still serves this long after the drain (whole seconds, at most 168h); 0: let them run until they end")
	uncordon := &cobra.Command{
		Use:   "uncordon NODE",
		Short: "Let a drained node receive external traffic again",
		Args:  cobra.ExactArgs(1),
	}
	for _, v := range []struct {
		cmd  *cobra.Command
		done string
		// call returns the node and the store revision of the change.
		call func(ctx context.Context, c client, name string) (*weirv1.Node, uint64, error)
	}{
		{drain, "drained", func(ctx context.Context, c client, name string) (*weirv1.Node, uint64, error) {
			req := &weirv1.DrainNodeRequest{Name: name}
			if timeout != 0 {
				req.DrainTimeout = durationpb.New(timeout)
			}
			r, err := c.DrainNode(ctx, req)
			return r.GetNode(), revisionOf(r), err
		}},
		{uncordon, "uncordoned", func(ctx context.Context, c client, name string) (*weirv1.Node, uint64, error) {
			r, err := c.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: name})
			return r.GetNode(), revisionOf(r), err
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
			node, rev, err := v.call(cmd.Context(), c, args[0])
			if err != nil {
				return explain(kindNamed("Node"), args[0], err)
			}
			if d := node.GetDrainDeadline(); d != nil {
				fmt.Fprintf(a.stdout, "node/%s %s (drain deadline %s)\n", args[0], v.done, d.AsTime().UTC().Format(time.RFC3339))
			} else {
				fmt.Fprintf(a.stdout, "node/%s %s\n", args[0], v.done)
			}
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
