package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

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
Uncordon undoes it. Either works whichever source (native or kubernetes)
owns the node, and survives server restarts.`,
	}
	for _, v := range []struct {
		use, done, short string
		// call returns the store revision of the change.
		call func(ctx context.Context, c client, name string) (uint64, error)
	}{
		{"drain", "drained", "Stop new external traffic to a node (see lbctl node --help for established connections)", func(ctx context.Context, c client, name string) (uint64, error) {
			r, err := c.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: name})
			return revisionOf(r), err
		}},
		{"uncordon", "uncordoned", "Let a drained node receive external traffic again", func(ctx context.Context, c client, name string) (uint64, error) {
			r, err := c.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: name})
			return revisionOf(r), err
		}},
	} {
		var wait time.Duration
		sub := &cobra.Command{
			Use:   v.use + " NODE",
			Short: v.short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := a.client()
				if err != nil {
					return err
				}
				rev, err := v.call(cmd.Context(), c, args[0])
				if err != nil {
					return explain(kindNamed("Node"), args[0], err)
				}
				fmt.Fprintf(a.stdout, "node/%s %s\n", args[0], v.done)
				if wait > 0 {
					return a.waitProgrammed(cmd.Context(), rev, wait)
				}
				return nil
			},
		}
		addWaitFlag(sub.Flags(), &wait)
		cmd.AddCommand(sub)
	}
	return cmd
}
