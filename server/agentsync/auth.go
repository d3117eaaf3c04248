package agentsync

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/registry"
)

// authorizeNode checks that the caller may speak for node.
func authorizeNode(ctx context.Context, node string) error { return auth.AuthorizeNode(ctx, node) }

// registered refuses a stream of a node the registry does not hold: what
// the server keeps for a stream is bounded by the registry's nodes.
// Without its Node the agent would not know its addresses either: it
// retries until an orchestrator (or Kubernetes) registers it.
func (h *Hub) registered(field, node string) error {
	var ok bool
	h.reg.Read(func(v registry.View) { ok = v.Node(node) != nil })
	if !ok {
		return status.Errorf(codes.FailedPrecondition, "%s: node %q is not registered; create it first (RegistryService.CreateNode, or the Kubernetes Node)", field, node)
	}
	return nil
}
