package api

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
)

// Every error the registry and the store return reaches a client as the
// gRPC code it means, wrapped or not, its message kept; a field error
// names its full path in the request, in the message and as a BadRequest
// violation.
func TestStatusCodes(t *testing.T) {
	already := status.Error(codes.PermissionDenied, "node n1 may not act as n2")
	for _, tc := range []struct {
		field string
		err   error
		code  codes.Code
		msg   string
	}{
		{"service", &model.FieldError{Field: "spec.ports[0].port", Reason: "must be 1-65535"}, codes.InvalidArgument, "service.spec.ports[0].port: must be 1-65535"},
		{"", &model.FieldError{Field: "drain_timeout", Reason: "negative"}, codes.InvalidArgument, "drain_timeout: negative"},
		{"node", fmt.Errorf("checking: %w", &model.FieldError{Field: "addresses[1]", Reason: "not an IP address"}), codes.InvalidArgument, "node.addresses[1]: not an IP address"},
		{"", fmt.Errorf("nodes n1: %w", registry.ErrNotFound), codes.NotFound, "nodes n1: " + registry.ErrNotFound.Error()},
		{"", registry.ErrAlreadyExists, codes.AlreadyExists, registry.ErrAlreadyExists.Error()},
		{"", fmt.Errorf("nodes n1: %w", registry.ErrConflict), codes.Aborted, "nodes n1: " + registry.ErrConflict.Error()},
		{"", fmt.Errorf("owned by kubernetes: %w", registry.ErrInUse), codes.FailedPrecondition, "owned by kubernetes: " + registry.ErrInUse.Error()},
		{"", fmt.Errorf("writing: %w", context.Canceled), codes.Canceled, "writing: context canceled"},
		{"", fmt.Errorf("writing: %w", store.ErrUnavailable), codes.Unavailable, "writing: " + store.ErrUnavailable.Error()},
		{"", registry.ErrBehind, codes.Unavailable, registry.ErrBehind.Error()},
		{"service", already, codes.PermissionDenied, "node n1 may not act as n2"},
		{"", errors.New("disk on fire"), codes.Internal, "disk on fire"},
	} {
		st := status.Convert(Status(tc.field, tc.err))
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("Status(%q, %v) = %v %q; want %v %q", tc.field, tc.err, st.Code(), st.Message(), tc.code, tc.msg)
		}
		var fields []string
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok {
				for _, v := range br.GetFieldViolations() {
					fields = append(fields, v.GetField()+": "+v.GetDescription())
				}
			}
		}
		if want := tc.code == codes.InvalidArgument; want != (len(fields) == 1 && fields[0] == tc.msg) {
			t.Errorf("Status(%q, %v): field violations %q", tc.field, tc.err, fields)
		}
	}
	if err := Status("service", nil); err != nil {
		t.Errorf("Status of no error: %v", err)
	}
}

// A registered node whose agent never connected is listed, as not
// connected, and a wait for a revision does not wait for it: it says
// why the node is not there.
func TestNodesWithoutAgents(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	e.applyNodes(t, 3)
	list, err := e.status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n := list.GetNodes(); len(n) != 2 || n[0].GetName() != "node-0000" || n[0].GetConnected() || list.GetNextPageToken() == "" {
		t.Errorf("the first page of node statuses: %v", list)
	}
	rest, err := e.status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{PageSize: 2, PageToken: list.GetNextPageToken()})
	if err != nil || len(rest.GetNodes()) != 1 || rest.GetNodes()[0].GetName() != "node-0002" || rest.GetNextPageToken() != "" {
		t.Errorf("the second page of node statuses: %v, %v", rest, err)
	}

	start := time.Now()
	wait, err := e.status.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: 1, Timeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 10*time.Second || !wait.GetProgrammed() || len(wait.GetNodes()) != 3 {
		t.Errorf("a wait with no agent: %v after %v; want programmed at once, three nodes", wait, time.Since(start))
	}
	for _, n := range wait.GetNodes() {
		if n.GetConnected() || n.GetReason() != "not connected" {
			t.Errorf("node %s: connected %v, reason %q; want not connected", n.GetName(), n.GetConnected(), n.GetReason())
		}
	}

	info, err := e.status.GetServerInfo(ctx, &weirv1.GetServerInfoRequest{})
	if err != nil || info.GetVersion() != "v0.0.0-test" || info.GetAgentsConnected() != 0 {
		t.Errorf("server info: %v, %v", info, err)
	}
}

// The status service's refusals name the field, or say what is missing.
func TestStatusRefusals(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	_, err := e.status.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{})
	wantCode(t, "a wait for no revision", err, codes.InvalidArgument, "revision:")
	_, err = e.status.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: 1, Timeout: durationpb.New(-time.Second)})
	wantCode(t, "a negative wait", err, codes.InvalidArgument, "timeout:")
	_, err = e.status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: "default", Name: "web"})
	wantCode(t, "the status of an unknown service", err, codes.NotFound, "")
}
