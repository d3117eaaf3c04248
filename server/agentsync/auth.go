package agentsync

import (
	"context"

	"github.com/weirlb/weir/server/auth"
)

// authorizeNode checks that the caller may speak for node.
func authorizeNode(ctx context.Context, node string) error { return auth.AuthorizeNode(ctx, node) }
