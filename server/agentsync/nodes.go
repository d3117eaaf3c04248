package agentsync

// Nodes: one record per node of everything the hub knows of it, under
// h.mu, as go-control-plane keeps one record per client.

import (
	"github.com/weirlb/weir/server/agentsync/cache"
	"github.com/weirlb/weir/server/observed"
)

// nodeRecord is what the hub knows of one node. A record that holds none
// of it is dropped, so the records are bounded by the registry's nodes
// (the streams it admits) and the nodes other replicas publish.
type nodeRecord struct {
	// session is the node's open stream to this replica, nil when none.
	session *session
	// status is the node's status as this replica has it: made by its
	// first stream, kept after the stream ends, until the node is deleted.
	status *observed.Node
	// remote is the node's status as the replica it is connected to
	// published it (SetRemoteStatus).
	remote *observed.Node
	// history is what the node was last sent, for a stream that resumes:
	// left by a stream when it ends, taken by the next one.
	history *cache.Client
}

// shown is the node's status as Status chooses it: this replica's while
// the node is connected here or no other replica published one, else the
// other replica's (nil when neither is known).
func (r *nodeRecord) shown() *observed.Node {
	if r.status != nil && (r.remote == nil || r.status.Connected) {
		return r.status
	}
	return r.remote
}

// nodeLocked returns the record of node, made empty if it has none.
// Called with h.mu held.
func (h *Hub) nodeLocked(node string) *nodeRecord {
	rec := h.nodes[node]
	if rec == nil {
		rec = &nodeRecord{}
		h.nodes[node] = rec
	}
	return rec
}

// tidyLocked drops node's record when it no longer holds anything.
// Called with h.mu held.
func (h *Hub) tidyLocked(node string) {
	if rec := h.nodes[node]; rec != nil && *rec == (nodeRecord{}) {
		delete(h.nodes, node)
	}
}
