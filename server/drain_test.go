package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/servertest"
	"github.com/weirlb/weir/test/wait"
)

// TestDrainTimeoutIsValidatedAtTheEdge: a timeout Kubernetes would refuse
// for a grace period (negative, not whole seconds) or longer than a week
// is InvalidArgument naming drain_timeout, and changes nothing: neither
// an undrained node nor a drained node's deadline.
func TestDrainTimeoutIsValidatedAtTheEdge(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	registerNode(t, ts, "node1")
	registerNode(t, ts, "node2")
	drained, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node2", DrainTimeout: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		timeout *durationpb.Duration
	}{
		{"negative", durationpb.New(-time.Second)},
		{"under a second", durationpb.New(500 * time.Millisecond)},
		{"not whole seconds", durationpb.New(1500 * time.Millisecond)},
		{"over 7 days", durationpb.New(7*24*time.Hour + time.Second)},
		{"not a duration", &durationpb.Duration{Seconds: 1, Nanos: -1}},
		{"beyond time.Duration", &durationpb.Duration{Seconds: 315576000000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, node := range []string{"node1", "node2"} {
				_, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node, DrainTimeout: tc.timeout})
				st := status.Convert(err)
				if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "drain_timeout: ") {
					t.Errorf("%s: got %v %q; want InvalidArgument naming drain_timeout", node, st.Code(), st.Message())
				}
				var fields []string
				for _, d := range st.Details() {
					if br, ok := d.(*errdetails.BadRequest); ok {
						for _, v := range br.GetFieldViolations() {
							fields = append(fields, v.GetField())
						}
					}
				}
				if len(fields) != 1 || fields[0] != "drain_timeout" {
					t.Errorf("%s: BadRequest field violations %v, want [drain_timeout]", node, fields)
				}
			}
			if n := getNode(t, ts, "node1"); n.GetDrained() || n.GetDrainDeadline() != nil {
				t.Errorf("a refused drain changed node1: drained %v, deadline %v", n.GetDrained(), n.GetDrainDeadline())
			}
			if n := getNode(t, ts, "node2"); !n.GetDrainDeadline().AsTime().Equal(drained.GetNode().GetDrainDeadline().AsTime()) {
				t.Errorf("a refused drain changed node2's deadline from %v to %v", drained.GetNode().GetDrainDeadline().AsTime(), n.GetDrainDeadline().AsTime())
			}
		})
	}
}

// TestDrainDeadline: the deadline is the server's time of the request
// plus the timeout (whole seconds, never earlier); it reaches the node's
// agent, survives a restart, and a drain again with a timeout sets it
// anew; a timeout of 0 is no deadline.
func TestDrainDeadline(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())

	before := time.Now()
	resp, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node1", DrainTimeout: durationpb.New(10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := resp.GetNode().GetDrainDeadline().AsTime()
	if !resp.GetNode().GetDrained() || deadline.Before(before.Add(10*time.Minute)) || deadline.After(time.Now().Add(10*time.Minute+time.Second)) || deadline.Nanosecond() != 0 {
		t.Errorf("drained %v with deadline %v; want drained, 10m after %v in whole seconds", resp.GetNode().GetDrained(), deadline, before)
	}
	msg := agent.recv()
	if !msg.GetNode().GetDrained() || !msg.GetNode().GetDrainDeadline().AsTime().Equal(deadline) {
		t.Errorf("the agent was told drained %v, deadline %v; want %v", msg.GetNode().GetDrained(), msg.GetNode().GetDrainDeadline(), deadline)
	}
	agent.ack(msg.GetVersion())

	ts.Stop()
	ts = startServer(t, dir)
	if n := getNode(t, ts, "node1"); !n.GetDrained() || !n.GetDrainDeadline().AsTime().Equal(deadline) {
		t.Errorf("after a restart: drained %v, deadline %v; want %v", n.GetDrained(), n.GetDrainDeadline(), deadline)
	}
	if full := connectAgent(t, ctx, ts, "node1", 0).recv(); !full.GetNode().GetDrainDeadline().AsTime().Equal(deadline) {
		t.Errorf("an agent's first state after a restart has deadline %v, want %v", full.GetNode().GetDrainDeadline(), deadline)
	}

	later, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node1", DrainTimeout: durationpb.New(time.Hour)})
	if err != nil || !later.GetNode().GetDrainDeadline().AsTime().After(deadline) {
		t.Errorf("drained again for an hour: deadline %v, %v; want after %v", later.GetNode().GetDrainDeadline(), err, deadline)
	}
	none, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "node1", DrainTimeout: durationpb.New(0)})
	if err != nil || !none.GetNode().GetDrained() || none.GetNode().GetDrainDeadline() != nil {
		t.Errorf("drained again with a timeout of 0: drained %v, deadline %v, %v; want drained without a deadline", none.GetNode().GetDrained(), none.GetNode().GetDrainDeadline(), err)
	}
	if _, err := ts.Registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: "node1"}); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, ts, "node1"); n.GetDrained() || n.GetDrainDeadline() != nil {
		t.Errorf("uncordoned: drained %v, deadline %v", n.GetDrained(), n.GetDrainDeadline())
	}
}

// TestDrainAgainKeepsTheDeadline: a drain of a drained node without a
// timeout (a drain repeated to make sure) keeps its deadline, writes
// nothing and tells the agent nothing; with a timeout it replaces it (0
// clears it). Each answer says what the drain was before it.
func TestDrainAgainKeepsTheDeadline(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())
	registerNode(t, ts, "node2")

	drain := func(node string, timeout *durationpb.Duration) *weirv1.DrainNodeResponse {
		t.Helper()
		r, err := ts.Registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: node, DrainTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// said is what an answer says of the drain: before -> now.
	said := func(r *weirv1.DrainNodeResponse) string {
		at := func(ts *timestamppb.Timestamp) string {
			if ts == nil {
				return "none"
			}
			return ts.AsTime().Format(time.RFC3339)
		}
		return fmt.Sprintf("was drained %v, %s -> %s", r.GetWasDrained(), at(r.GetPreviousDrainDeadline()), at(r.GetNode().GetDrainDeadline()))
	}
	first := drain("node1", durationpb.New(time.Hour))
	d := first.GetNode().GetDrainDeadline()
	if got, want := said(first), "was drained false, none -> "+d.AsTime().Format(time.RFC3339); d == nil || got != want {
		t.Errorf("the first drain: %s, want %s", got, want)
	}
	agent.ack(agent.recv().GetVersion())

	again := drain("node1", nil)
	if got, want := said(again), fmt.Sprintf("was drained true, %[1]s -> %[1]s", d.AsTime().Format(time.RFC3339)); got != want || again.GetRevision() != first.GetRevision() {
		t.Errorf("drained again without a timeout: %s at revision %d; want %s, no write (revision %d)", got, again.GetRevision(), want, first.GetRevision())
	}
	if n := getNode(t, ts, "node1"); !proto.Equal(n.GetDrainDeadline(), d) {
		t.Errorf("drained again without a timeout: the node's deadline is %v, want %v kept", n.GetDrainDeadline(), d)
	}

	later := drain("node1", durationpb.New(2*time.Hour))
	l := later.GetNode().GetDrainDeadline()
	if got, want := said(later), fmt.Sprintf("was drained true, %s -> %s", d.AsTime().Format(time.RFC3339), l.AsTime().Format(time.RFC3339)); got != want || !l.AsTime().After(d.AsTime()) {
		t.Errorf("drained again for 2h: %s, want %s, later than %v", got, want, d)
	}
	if msg := agent.recv(); !proto.Equal(msg.GetNode().GetDrainDeadline(), l) {
		t.Errorf("the agent was told deadline %v, want %v (the drain without a timeout told it nothing)", msg.GetNode().GetDrainDeadline(), l)
	}
	if got, want := said(drain("node1", durationpb.New(0))), "was drained true, "+l.AsTime().Format(time.RFC3339)+" -> none"; got != want {
		t.Errorf("drained again with a timeout of 0: %s, want %s", got, want)
	}
	if got, want := said(drain("node1", nil)), "was drained true, none -> none"; got != want {
		t.Errorf("drained again without a deadline: %s, want %s", got, want)
	}
	// A node not drained gets no deadline without a timeout.
	if got, want := said(drain("node2", nil)), "was drained false, none -> none"; got != want {
		t.Errorf("node2's first drain: %s, want %s", got, want)
	}
}

// TestDrainReportReachesTheStatus: what a drained node's agent reports it
// still serves is in the node's status until it reports no drain.
func TestDrainReportReachesTheStatus(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := connectAgent(t, ctx, ts, "node1", 0)
	agent.ack(agent.recv().GetVersion())
	st := weirv1.NewStatusServiceClient(ts.Conn)
	drainOf := func() (*weirv1.DrainStatus, error) {
		resp, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil || len(resp.GetNodes()) != 1 {
			return nil, fmt.Errorf("statuses %v, %v", resp.GetNodes(), err)
		}
		return resp.GetNodes()[0].GetDrain(), nil
	}
	counted := time.Now().Truncate(time.Second)
	sent := &weirv1.DrainStatus{ConnectionsLeft: 12, CountedAt: timestamppb.New(counted), Deadline: timestamppb.New(counted.Add(8 * time.Second))}
	for _, d := range []*weirv1.DrainStatus{sent, {}} {
		if err := agent.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: &weirv1.Report{Drain: d}}}); err != nil {
			t.Fatal(err)
		}
		want := d
		if proto.Equal(d, &weirv1.DrainStatus{}) {
			want = nil // not drained
		}
		wait.For(t, 5*time.Second, "the node's status shows the drain its agent reported", func() error {
			got, err := drainOf()
			if err != nil {
				return err
			}
			if !proto.Equal(got, want) {
				return fmt.Errorf("drain %v, want %v", got, want)
			}
			return nil
		})
	}
}

func getNode(t *testing.T, ts *servertest.Server, name string) *weirv1.Node {
	t.Helper()
	n, err := ts.Registry.GetNode(context.Background(), &weirv1.GetNodeRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return n.GetNode()
}
