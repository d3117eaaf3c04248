package api

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// applyNodes writes n nodes, node-0000 on, in one batch.
func (e *edge) applyNodes(t *testing.T, n int) []string {
	t.Helper()
	var names []string
	req := &weirv1.ApplyRequest{}
	for i := range n {
		name := fmt.Sprintf("node-%04d", i)
		names = append(names, name)
		req.Resources = append(req.Resources, &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Node{
			Node: node(name, fmt.Sprintf("10.%d.%d.1", i/256, i%256))}})
	}
	if _, err := e.registry.Apply(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	return names
}

// Pages follow one another in name order through next_page_token, the
// last one without a token; a token read again gives the same page.
func TestPagesFollowTheirTokens(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	want := e.applyNodes(t, 7)
	var got []string
	var sizes []int
	tokens := []string{""}
	for {
		r, err := e.registry.ListNodes(ctx, &weirv1.ListNodesRequest{PageSize: 3, PageToken: tokens[len(tokens)-1]})
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(r.GetNodes()))
		for _, n := range r.GetNodes() {
			got = append(got, n.GetMetadata().GetName())
		}
		if r.GetNextPageToken() == "" {
			break
		}
		tokens = append(tokens, r.GetNextPageToken())
	}
	if !slices.Equal(got, want) || !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Errorf("pages of %v holding %v; want 3, 3, 1 holding %v", sizes, got, want)
	}
	again, err := e.registry.ListNodes(ctx, &weirv1.ListNodesRequest{PageSize: 3, PageToken: tokens[1]})
	if err != nil || len(again.GetNodes()) != 3 || again.GetNodes()[0].GetMetadata().GetName() != "node-0003" || again.GetNextPageToken() != tokens[2] {
		t.Errorf("the second page read again: %v, %v", again, err)
	}
}

// A page holds DefaultPageSize items when the request says nothing, and
// never more than MaxPageSize whatever it asks.
func TestPageSizeBounds(t *testing.T) {
	e := startEdge(t)
	e.applyNodes(t, MaxPageSize+1)
	for _, tc := range []struct {
		ask, want int32
	}{{0, DefaultPageSize}, {1, 1}, {MaxPageSize + 1000, MaxPageSize}} {
		r, err := e.registry.ListNodes(context.Background(), &weirv1.ListNodesRequest{PageSize: tc.ask})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetNodes()) != int(tc.want) || r.GetNextPageToken() == "" {
			t.Errorf("page size %d: %d nodes, next page %q; want %d and a next page", tc.ask, len(r.GetNodes()), r.GetNextPageToken(), tc.want)
		}
	}
}

// A token that this server did not give, or a negative size, is refused,
// naming the field, for every list.
func TestPagingRefusals(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	e.applyNodes(t, 2)
	for _, tc := range []struct {
		token string
		size  int32
		field string
	}{
		{token: "not a token!", field: "page_token:"},
		{token: base64.StdEncoding.EncodeToString([]byte("node-00")), field: "page_token:"}, // padded: not this server's encoding
		{size: -1, field: "page_size:"},
	} {
		for what, err := range map[string]error{
			"nodes":           second(e.registry.ListNodes(ctx, &weirv1.ListNodesRequest{PageToken: tc.token, PageSize: tc.size})),
			"services":        second(e.registry.ListServices(ctx, &weirv1.ListServicesRequest{PageToken: tc.token, PageSize: tc.size})),
			"address pools":   second(e.registry.ListAddressPools(ctx, &weirv1.ListAddressPoolsRequest{PageToken: tc.token, PageSize: tc.size})),
			"node statuses":   second(e.status.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{PageToken: tc.token, PageSize: tc.size})),
			"endpoint slices": second(e.registry.ListEndpointSlices(ctx, &weirv1.ListEndpointSlicesRequest{PageToken: tc.token, PageSize: tc.size})),
		} {
			wantCode(t, fmt.Sprintf("%s with token %q, size %d", what, tc.token, tc.size), err, codes.InvalidArgument, tc.field)
		}
	}
}
