package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "The appliance at a glance: the server, and whether every node's agent is connected and programmed",
		Long: `The appliance at a glance: the server's address, health, version, state
version and sources, then every node: whether its agent is connected, the
state versions it applied and was sent, its /healthz answer, whether it is
drained, and its last error.

Exit code 0 when every node is connected and has applied all it was sent,
1 when not (a line on stderr says what), 3 when the server cannot be
reached.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			health, err := a.health(ctx)
			if err != nil {
				return err
			}
			c, st, err := a.clients()
			if err != nil {
				return err
			}
			info, err := st.GetServerInfo(ctx, &weirv1.GetServerInfoRequest{})
			if err != nil {
				return plain(nil, err)
			}
			nodes, err := c.ListNodes(ctx, &weirv1.ListNodesRequest{})
			if err != nil {
				return plain(nil, err)
			}
			statuses, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
			if err != nil {
				return plain(nil, err)
			}
			drained := map[string]bool{}
			for _, n := range nodes.GetNodes() {
				drained[n.GetMetadata().GetName()] = n.GetDrained()
			}

			var b strings.Builder
			fields(&b, "",
				"Server", fmt.Sprintf("%s (%s)", a.server, health),
				"Version", orNone(info.GetVersion()),
				"State version", strconv.FormatUint(info.GetStateVersion(), 10),
				"Uptime", age(a.now(), info.GetStarted()),
				"Sources", list(info.GetSources()),
				"Agents", fmt.Sprintf("%d connected, %d nodes registered", info.GetAgentsConnected(), len(nodes.GetNodes())),
			)
			b.WriteString("\n")
			var problems []string
			t := &table{w: &b}
			t.add("NAME", "CONNECTED", "APPLIED/SENT", "LAG", "HEALTHZ", "DRAINED", "LAST ERROR")
			for _, n := range statuses.GetNodes() {
				appliedSent, lag := versions(n)
				t.add(n.GetName(), yesNo(n.GetConnected()), appliedSent, lag, code(n.GetHealth().GetHealthzCode()),
					yesNo(drained[n.GetName()]), orNone(n.GetLastError()))
				if p := a.nodeProblem(n); p != "" {
					problems = append(problems, p)
				}
			}
			if len(statuses.GetNodes()) == 0 {
				b.WriteString("No nodes registered.\n")
			} else {
				_ = t.flush() // a strings.Builder takes every write
			}
			if _, err := io.WriteString(a.stdout, b.String()); err != nil {
				return err
			}

			var summary []string
			if health != healthpb.HealthCheckResponse_SERVING {
				summary = append(summary, "the server's health is "+health.String())
			}
			if len(problems) > 0 {
				summary = append(summary, fmt.Sprintf("%d of %d nodes not ready: %s", len(problems), len(statuses.GetNodes()), strings.Join(problems, "; ")))
			}
			if len(summary) > 0 {
				return errors.New(strings.Join(summary, "; "))
			}
			return nil
		},
	}
}

// nodeProblem says what keeps a node's agent from forwarding the current
// state, or "" when nothing does: it is connected and has applied, without
// error, every version it was sent.
func (a *app) nodeProblem(n *weirv1.NodeStatus) string {
	switch {
	case !n.GetConnected() && n.GetLastSeen() == nil:
		return n.GetName() + " has never connected"
	case !n.GetConnected():
		return fmt.Sprintf("%s is not connected (last seen %s)", n.GetName(), a.ago(n.GetLastSeen()))
	case n.GetLastError() != "":
		return fmt.Sprintf("%s failed to apply version %d: %s", n.GetName(), n.GetLastErrorVersion(), n.GetLastError())
	case n.GetAppliedVersion() < n.GetSentVersion():
		return fmt.Sprintf("%s has applied version %d of %d", n.GetName(), n.GetAppliedVersion(), n.GetSentVersion())
	}
	return ""
}
