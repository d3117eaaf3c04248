package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/iprange"
	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) statusCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "The appliance at a glance: the server, and whether every node's agent is connected and programmed",
		Long: `The appliance at a glance: the server's address, health, version, state
version and sources, then every node: whether its agent is connected, the
state versions it applied and was sent, its /healthz answer, its BGP
sessions (established of configured; - without a speaker), whether it is
drained, and its last error. Pools shows each address pool's addresses in
use of its size.

-o json and -o yaml print the same as one document (server, pools, nodes
with every field of their status, ready, problems), with field names as in
the API's status.proto.

Exit code 0 when every node is connected and has applied all it was sent,
1 when not (a line on stderr says what), 3 when the server cannot be
reached; the same whatever the output format.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			in, err := a.readStatus(cmd.Context())
			if err != nil {
				return err
			}
			problems := a.nodeProblems(in.statuses)
			failed := a.statusFailure(in, problems)
			if output != "table" {
				doc, err := statusDocument(a.server, in.health, in.info, in.pools, in.statuses, in.drained, problems)
				if err != nil {
					return err
				}
				if err := a.printDocument(doc, output); err != nil {
					return err
				}
				return failed
			}
			if _, err := io.WriteString(a.stdout, a.statusTable(in)); err != nil {
				return err
			}
			return failed
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// statusInputs is what status shows, read from the server.
type statusInputs struct {
	health   healthpb.HealthCheckResponse_ServingStatus
	info     *weirv1.GetServerInfoResponse
	nodes    int // registered
	statuses []*weirv1.NodeStatus
	drained  map[string]bool
	pools    string
}

// readStatus reads the server's health and information, the nodes, their
// statuses and the pools' usage.
func (a *app) readStatus(ctx context.Context) (statusInputs, error) {
	var in statusInputs
	health, err := a.health(ctx)
	if err != nil {
		return in, err
	}
	c, st, err := a.clients()
	if err != nil {
		return in, err
	}
	in.health = health
	if in.info, err = st.GetServerInfo(ctx, &weirv1.GetServerInfoRequest{}); err != nil {
		return in, plain(nil, err)
	}
	nodes, err := listNodes(ctx, c, &weirv1.ListNodesRequest{})
	if err != nil {
		return in, plain(nil, err)
	}
	if in.statuses, err = listNodeStatuses(ctx, st); err != nil {
		return in, plain(nil, err)
	}
	if in.pools, err = a.poolUsage(ctx, c); err != nil {
		return in, plain(nil, err)
	}
	in.nodes, in.drained = len(nodes), map[string]bool{}
	for _, n := range nodes {
		in.drained[n.GetMetadata().GetName()] = n.GetDrained()
	}
	return in, nil
}

// nodeProblems says, per node that is not ready, why.
func (a *app) nodeProblems(statuses []*weirv1.NodeStatus) []string {
	var problems []string
	for _, n := range statuses {
		if p := a.nodeProblem(n); p != "" {
			problems = append(problems, p)
		}
	}
	return problems
}

// statusFailure is what makes status fail (exit code 1), in one line;
// nil when the server is healthy and every node ready.
func (a *app) statusFailure(in statusInputs, problems []string) error {
	var summary []string
	if in.health != healthpb.HealthCheckResponse_SERVING {
		summary = append(summary, "the server's health is "+in.health.String())
	}
	if e := in.info.GetStoreWriteError(); e != "" {
		summary = append(summary, fmt.Sprintf("the server's store has refused writes for %s: %s", age(a.now(), in.info.GetStoreWriteFailingSince()), e))
	}
	if len(problems) > 0 {
		summary = append(summary, fmt.Sprintf("%d of %d nodes not ready: %s", len(problems), len(in.statuses), strings.Join(problems, "; ")))
	}
	if len(summary) == 0 {
		return nil
	}
	return errors.New(strings.Join(summary, "; "))
}

// statusTable is status as text: the server's fields, then a row a node.
func (a *app) statusTable(in statusInputs) string {
	var b strings.Builder
	info := in.info
	fields(&b, "",
		"Server", fmt.Sprintf("%s (%s)", a.server, in.health),
		"Version", orNone(info.GetVersion()),
		"State version", strconv.FormatUint(serverRevision(info), 10),
		"Uptime", age(a.now(), info.GetStarted()),
		"Sources", list(info.GetSources()),
		"Agents", fmt.Sprintf("%d connected, %d nodes registered", info.GetAgentsConnected(), in.nodes),
		"Agent versions", agentVersions(in.statuses),
		"Pools", in.pools,
	)
	b.WriteString("\n")
	if len(in.statuses) == 0 {
		b.WriteString("No nodes registered.\n")
		return b.String()
	}
	t := &table{w: &b}
	// L2: the addresses each node answers ARP and NDP for, where
	// any does.
	l2 := slices.ContainsFunc(in.statuses, func(n *weirv1.NodeStatus) bool { return n.GetL2Addresses() > 0 })
	header := []string{"NAME", "CONNECTED", "APPLIED/SENT", "LAG", "HEALTHZ", "BGP"}
	if l2 {
		header = append(header, "L2")
	}
	t.add(append(header, "DRAINED", "LAST ERROR")...)
	for _, n := range in.statuses {
		appliedSent, lag := versions(n)
		row := []string{n.GetName(), yesNo(n.GetConnected()), appliedSent, lag, code(n.GetHealth().GetHealthzCode()), bgpSessions(n.GetBgpSessions())}
		if l2 {
			row = append(row, strconv.Itoa(int(n.GetL2Addresses())))
		}
		t.add(append(row, yesNo(in.drained[n.GetName()]), orNone(n.GetLastError()))...)
	}
	_ = t.flush() // a strings.Builder takes every write
	return b.String()
}

// serverRevision is the server's newest store revision; a server of the
// previous release says it only as state_version.
func serverRevision(info *weirv1.GetServerInfoResponse) uint64 {
	//lint:ignore SA1019 what a server of the previous release fills
	return cmp.Or(info.GetRevision(), info.GetStateVersion())
}

// statusDocument is status as one JSON document: field names as in the
// API (status.proto), each node's status whole plus whether it is drained.
func statusDocument(server string, health healthpb.HealthCheckResponse_ServingStatus, info *weirv1.GetServerInfoResponse,
	pools string, statuses []*weirv1.NodeStatus, drained map[string]bool, problems []string) ([]byte, error) {
	infoJSON, err := marshal.Marshal(info)
	if err != nil {
		return nil, err
	}
	nodes := []json.RawMessage{}
	for _, n := range statuses {
		b, err := marshal.Marshal(n)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		m["drained"] = drained[n.GetName()]
		b, err = json.Marshal(m)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, b)
	}
	if problems == nil {
		problems = []string{}
	}
	return json.MarshalIndent(map[string]any{
		"server":   map[string]any{"address": server, "health": health.String(), "info": json.RawMessage(infoJSON)},
		"pools":    pools,
		"nodes":    nodes,
		"ready":    len(problems) == 0 && health == healthpb.HealthCheckResponse_SERVING && info.GetStoreWriteError() == "",
		"problems": problems,
	}, "", "  ")
}

// printDocument prints a JSON document as json or yaml.
func (a *app) printDocument(doc []byte, output string) error {
	if output == "yaml" {
		y, err := yaml.JSONToYAML(doc)
		if err != nil {
			return err
		}
		doc = y
	} else {
		doc = append(doc, '\n')
	}
	_, err := a.stdout.Write(doc)
	return err
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

// bgpSessions is "established/configured", or "-" for a node without a
// BGP speaker.
func bgpSessions(sessions []*weirv1.BgpSession) string {
	if len(sessions) == 0 {
		return "-"
	}
	up := 0
	for _, s := range sessions {
		if nodewire.StateOf(s) == report.BGPEstablished {
			up++
		}
	}
	return fmt.Sprintf("%d/%d", up, len(sessions))
}

// poolUsage says, per pool, how many of its addresses services hold:
// "public 1/10, reserved 0/11".
func (a *app) poolUsage(ctx context.Context, c client) (string, error) {
	pools, err := listAddressPools(ctx, c)
	if err != nil || len(pools) == 0 {
		return "<none>", err
	}
	services, err := listServices(ctx, c, &weirv1.ListServicesRequest{})
	if err != nil {
		return "", err
	}
	var used []netip.Addr
	for _, svc := range services {
		for _, ip := range svc.GetStatus().GetLoadBalancerIps() {
			if a, err := netip.ParseAddr(ip); err == nil && !slices.Contains(used, a) {
				used = append(used, a)
			}
		}
	}
	var out []string
	for _, p := range pools {
		n, size := 0, new(big.Int)
		for _, r := range p.GetAddresses() {
			first, last, ok := addressRange(r)
			if !ok {
				continue
			}
			size.Add(size, rangeSize(first, last, p.GetAvoidBuggyIps()))
			for _, u := range used {
				if u.Is4() == first.Is4() && first.Compare(u) <= 0 && u.Compare(last) <= 0 {
					n++
				}
			}
		}
		out = append(out, fmt.Sprintf("%s %d/%s", p.GetMetadata().GetName(), n, size))
	}
	return strings.Join(out, ", "), nil
}

// rangeSize is how many of the addresses from first to last a pool gives
// out: all, but those ending in .0 or .255 when it avoids them.
func rangeSize(first, last netip.Addr, avoidBuggy bool) *big.Int {
	n := new(big.Int).Sub(new(big.Int).SetBytes(last.AsSlice()), new(big.Int).SetBytes(first.AsSlice()))
	n.Add(n, big.NewInt(1))
	if first.Is4() && avoidBuggy {
		n.Sub(n, big.NewInt(iprange.EndingIn0Or255(first, last)))
	}
	return n
}

// addressRange reads "FIRST-LAST" or a CIDR, as the server prints pools.
func addressRange(s string) (first, last netip.Addr, ok bool) {
	if f, l, found := strings.Cut(s, "-"); found {
		first, err1 := netip.ParseAddr(f)
		last, err2 := netip.ParseAddr(l)
		return first, last, err1 == nil && err2 == nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return first, last, false
	}
	p = p.Masked()
	last = p.Addr()
	b := last.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	last, _ = netip.AddrFromSlice(b)
	return p.Addr(), last, true
}

// agentVersions counts the connected agents by version, the most common
// first: during a rolling upgrade, how far it got.
func agentVersions(statuses []*weirv1.NodeStatus) string {
	count := map[string]int{}
	for _, n := range statuses {
		if n.GetConnected() {
			count[cmp.Or(n.GetAgentVersion(), "unknown")]++
		}
	}
	vs := slices.Collect(maps.Keys(count))
	slices.SortFunc(vs, func(a, b string) int { return cmp.Or(count[b]-count[a], strings.Compare(a, b)) })
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%s (%d)", v, count[v]))
	}
	return orNone(strings.Join(out, ", "))
}
