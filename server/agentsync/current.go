package agentsync

// Status and currency: every node's status as this replica has it or as
// another published it, and whether this replica's state is current.

import (
	"maps"
	"slices"
	"strings"

	"github.com/weirlb/weir/internal/apierr"
	"github.com/weirlb/weir/server/observed"
)

// forgetLocked drops the status and history of a node deleted from the
// registry, unless its agent is still connected (then its session's end
// does). Called with h.mu held.
func (h *Hub) forgetLocked(node string) {
	rec := h.nodes[node]
	if rec == nil || rec.session != nil {
		return
	}
	if rec.status != nil {
		rec.status = nil
		h.statusChanged()
	}
	rec.history = nil
	h.tidyLocked(node)
}

// statusChanged wakes the status watchers. Called with h.mu held.
func (h *Hub) statusChanged() {
	h.changed.Broadcast()
}

// StatusChanged returns a channel closed at the next status change: take
// it before reading the status.
func (h *Hub) StatusChanged() <-chan struct{} {
	return h.changed.Changed()
}

// Connected counts the agents with an open stream.
func (h *Hub) Connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, rec := range h.nodes {
		if rec.session != nil {
			n++
		}
	}
	return n
}

// Status returns every node's status, sorted by node name: as this
// replica has it, or as the replica the node is connected to published it
// (SetRemoteStatus).
func (h *Hub) Status() []observed.Node {
	var out []observed.Node
	h.eachStatus(func(s *observed.Node) { out = append(out, cloneStatus(s)) })
	slices.SortFunc(out, func(a, b observed.Node) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// eachStatus calls f with every node's status as Status chooses it,
// without copying (f must not keep it or change it).
func (h *Hub) eachStatus(f func(*observed.Node)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, rec := range h.nodes {
		if s := rec.shown(); s != nil {
			f(s)
		}
	}
}

// Progress is every node's progress toward a version, sorted by node
// name, the nodes as Status chooses them: cheap enough to read at every
// status change, as a wait for a version does while thousands of agents
// answer (Status copies what each node reports, every service it has).
func (h *Hub) Progress() []observed.Progress {
	var out []observed.Progress
	h.eachStatus(func(s *observed.Node) { out = append(out, s.Progress()) })
	slices.SortFunc(out, func(a, b observed.Progress) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Applying says whether a node is still applying version rev
// (observed.Progress.Applying), reading every node's status in place: a
// wait asks at every status change, while thousands of agents answer.
func (h *Hub) Applying(rev uint64) bool {
	applying := false
	h.eachStatus(func(s *observed.Node) { applying = applying || s.Progress().Applying(rev) })
	return applying
}

func cloneStatus(s *observed.Node) observed.Node {
	c := *s
	c.Services = maps.Clone(s.Services)
	return c
}

// LocalStatus returns the status of the nodes connected to this replica,
// for the others to see.
func (h *Hub) LocalStatus() []observed.Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []observed.Node
	for _, rec := range h.nodes {
		if rec.session != nil {
			out = append(out, cloneStatus(rec.status))
		}
	}
	return out
}

// SetRemoteStatus records the status of a node connected to another
// replica; nil forgets it.
func (h *Hub) SetRemoteStatus(node string, st *observed.Node) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeLocked(node).remote = st
	h.tidyLocked(node)
	h.statusChanged()
}

// notCurrentError refuses or ends a stream because the replica's state is
// not current; clients then try another replica (dial.IsNotCurrent).
func notCurrentError(reason string) error { return apierr.NotCurrent(reason) }

// CurrentErr is the error a stream that did not accept a stale state
// ends with while this replica is not current, or nil.
func (h *Hub) CurrentErr(acceptStale bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.currentErrLocked(acceptStale)
}

// currentErrLocked is CurrentErr with h.mu held.
func (h *Hub) currentErrLocked(acceptStale bool) error {
	switch {
	case h.partial != "":
		return notCurrentError(h.partial)
	case h.notCurrent == "" || acceptStale:
		return nil
	}
	return notCurrentError(h.notCurrent)
}

// SetPartial says why this replica holds only part of the state (its
// Kubernetes source has not listed the cluster yet), or that it holds it
// all (""). While it does, every stream is ended and refused, those that
// accept a stale state too: a part of the state sent as the whole would
// take away the rules of all the rest. Agents keep forwarding what they
// have, and come back.
func (h *Hub) SetPartial(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.partial = reason
	h.statusChanged() // the LB tier's watches check CurrentErr
	if reason != "" {
		h.endStreamsLocked(reason, true)
	}
}

// endStreamsLocked ends the agents' streams with a refusal as not
// current for reason: every stream with staleToo, else those that did
// not accept a stale state. Called with h.mu held.
func (h *Hub) endStreamsLocked(reason string, staleToo bool) {
	for _, rec := range h.nodes {
		if s := rec.session; s != nil && (staleToo || !s.stale) && s.ended == nil {
			s.ended = notCurrentError(reason)
			s.cancel()
		}
	}
}

// SetNotCurrent says why this replica's state is not current (it lost the
// store), or that it is again (""). While it is not, streams of agents
// that did not ask for a stale state are ended and refused, so that they
// move to a replica that is current; the others keep being served the
// last state, as every agent keeps forwarding it.
func (h *Hub) SetNotCurrent(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notCurrent = reason
	h.statusChanged() // the LB tier's watches check CurrentErr
	if reason != "" {
		h.endStreamsLocked(reason, false)
	}
}
