// Package store keeps the server's accepted state: in an embedded bbolt
// database for a single server (Bolt), or in an etcd cluster that several
// replicas share (Etcd). Either way every write is one transaction with one
// revision, taken only if the writer saw every write before it, so that
// checks made against the registry's memory hold in the store too.
package store

import (
	"context"
	"errors"
	"fmt"
)

// Backend is where the registry keeps what it accepted.
type Backend interface {
	// Commit writes ops as one transaction, provided the last write to the
	// store is the one at revision base, and returns the new revision.
	// Otherwise it writes nothing and returns a StaleError.
	Commit(base uint64, ops ...Op) (uint64, error)
	// Load calls fn for every stored resource, all read at one revision,
	// and returns that revision. rev is the revision the resource was last
	// written at, or 0 when the store does not keep one per resource.
	Load(fn func(kind, key string, rev uint64, value []byte) error) (uint64, error)
	// Watch calls fn with every write after revision after, in order,
	// until ctx ends, fn fails, or the store no longer holds that history
	// (ErrCompacted: load again).
	Watch(ctx context.Context, after uint64, fn func(rev uint64, ops []Op) error) error
	// HistoryAt names the history revision rev belongs to: agents resume
	// from a revision only within its history.
	HistoryAt(rev uint64) string
	Close() error
}

// Op writes one resource: Value nil deletes it.
type Op struct {
	Kind  string
	Key   string
	Value []byte
}

// StaleError: another writer wrote after the revision a commit was based
// on; the writer catches up to Revision and decides again.
type StaleError struct{ Revision uint64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("the store moved on to revision %d", e.Revision)
}

var (
	// ErrCorrupt wraps a stored value that cannot be decoded.
	ErrCorrupt = errors.New("corrupt stored value")
	// ErrCompacted: the history a watch asked for is gone.
	ErrCompacted = errors.New("store history compacted")
)

// Guard makes a write conditional on a leadership: the election key the
// leader holds, at the revision it was created with. A zero Guard is no
// condition.
type Guard struct {
	Key string
	Rev int64
}

// ErrNotLeader: a guarded write from a replica whose leadership ended.
var ErrNotLeader = errors.New("no longer the leader")

// ErrUnavailable wraps a store that could not be reached or has no quorum.
var ErrUnavailable = errors.New("store unavailable")

type guardKey struct{}

// WithGuard is ctx carrying the leadership g, for the writes of a job
// that only the leader runs.
func WithGuard(ctx context.Context, g Guard) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

// GuardOf is the leadership ctx carries (zero: none).
func GuardOf(ctx context.Context) Guard {
	g, _ := ctx.Value(guardKey{}).(Guard)
	return g
}
