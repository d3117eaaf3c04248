package agentsync

import "context"

// authorizeNode checks that the caller may speak for node. Without
// authentication configured anyone may.
var authorizeNode = func(ctx context.Context, node string) error { return nil }
