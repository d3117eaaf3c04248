package api

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func applyNode(n *weirv1.Node) *weirv1.ApplyResource {
	return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Node{Node: n}}
}

// A batch is written whole or not at all; a refusal names the resource's
// place in the batch; a resource twice in one batch is refused.
func TestApplyIsAllOrNothing(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	for _, tc := range []struct {
		what  string
		batch []*weirv1.ApplyResource
		code  codes.Code
		field string
	}{
		{"an empty entry", []*weirv1.ApplyResource{applyNode(node("a", "192.0.2.1")), {}}, codes.InvalidArgument, "resources[1]:"},
		{"a bad field in the second", []*weirv1.ApplyResource{applyNode(node("a", "192.0.2.1")), applyNode(node("b", "192.0.2.300"))},
			codes.InvalidArgument, "resources[1].node.addresses[0]:"},
		{"the same node twice", []*weirv1.ApplyResource{applyNode(node("a", "192.0.2.1")), applyNode(node("a", "192.0.2.2"))},
			codes.InvalidArgument, "resources[1].node: the same resource as resources[0]"},
	} {
		_, err := e.registry.Apply(ctx, &weirv1.ApplyRequest{Resources: tc.batch})
		wantCode(t, tc.what, err, tc.code, tc.field)
		if n, err := e.countNodes(); err != nil || n != 0 {
			t.Errorf("%s: %d nodes stored, %v; want none", tc.what, n, err)
		}
	}

	batch := []*weirv1.ApplyResource{applyNode(node("a", "192.0.2.1")), applyNode(node("b", "192.0.2.2"))}
	if r, err := e.registry.Apply(ctx, &weirv1.ApplyRequest{Resources: batch, ValidateOnly: true}); err != nil || len(r.GetResults()) != 2 {
		t.Fatalf("validate-only apply: %v, %v", r, err)
	}
	if n, _ := e.countNodes(); n != 0 {
		t.Fatalf("a validate-only apply stored %d nodes", n)
	}
	first, err := e.registry.Apply(ctx, &weirv1.ApplyRequest{Resources: batch})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range first.GetResults() {
		//lint:ignore SA1019 the deprecated resource_version is still filled
		if !r.GetCreated() || r.GetPrevious() != nil || r.GetResource().GetNode().GetMetadata().GetResourceVersion() != first.GetResourceVersion() {
			t.Errorf("result %d of the first apply: %v; want created at the batch's one revision %s", i, r, first.GetResourceVersion()) //lint:ignore SA1019 as above
		}
	}
	batch[1] = applyNode(node("b", "192.0.2.22"))
	second, err := e.registry.Apply(ctx, &weirv1.ApplyRequest{Resources: batch})
	if err != nil {
		t.Fatal(err)
	}
	if r := second.GetResults(); len(r) != 2 || r[1].GetCreated() || r[1].GetPrevious().GetNode().GetAddresses()[0] != "192.0.2.2" ||
		r[1].GetResource().GetNode().GetAddresses()[0] != "192.0.2.22" {
		t.Errorf("the second apply: %v; want b updated from 192.0.2.2", r)
	}
}
