package registry

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
)

// A drain is stored under drainsKind, keyed by the node's name. Servers
// before drain deadlines take any value as "drained", and stored {1}; a
// drain without a deadline is still stored so, and one with a deadline as
// a small JSON document that they read as drained too.

// drainNoDeadline is the stored value of a drain without a deadline.
var drainNoDeadline = []byte{1}

// storedDrain is the stored value of a drain with a deadline.
type storedDrain struct {
	// Deadline is RFC 3339, UTC.
	Deadline time.Time `json:"deadline"`
}

// encodeDrain is the stored value of a drain with deadline (zero: none).
func encodeDrain(deadline time.Time) ([]byte, error) {
	if deadline.IsZero() {
		return drainNoDeadline, nil
	}
	b, err := json.Marshal(storedDrain{Deadline: deadline.UTC()})
	if err != nil {
		return nil, fmt.Errorf("drain deadline %v: %w", deadline, err)
	}
	return b, nil
}

// decodeDrain reads a stored drain's deadline (zero: none). A value it
// cannot read (a newer server's) is still a drain: one without a deadline,
// as an older server reads this one's.
func decodeDrain(value []byte) time.Time {
	var d storedDrain
	if len(value) == 0 || value[0] != '{' || json.Unmarshal(value, &d) != nil {
		return time.Time{}
	}
	return d.Deadline
}

// DrainChange is what a drain asks of the node's deadline.
type DrainChange struct {
	// SetDeadline replaces the deadline with Deadline (zero: none).
	// Without it a drained node keeps the deadline it has, and a node not
	// drained gets none: a drain repeated to make sure moves nothing.
	SetDeadline bool
	Deadline    time.Time
}

// Drained is what a drain did.
type Drained struct {
	Node     *model.Node // as the drain left it
	Revision uint64      // that holds the drain (the current one when it changed nothing)
	// WasDrained and PreviousDeadline are the node's drain before it.
	WasDrained       bool
	PreviousDeadline time.Time
}

// DrainNode drains a node (it takes no new external traffic), its deadline
// as c says. What the drain keeps of the one before is decided inside the
// write, so that two drains at once each see the other's.
func (r *Registry) DrainNode(node string, c DrainChange) (Drained, error) {
	var d Drained
	rev, err := r.write(func() (*pending, error) {
		n, ok := r.Nodes.items[node]
		if !ok {
			return nil, fmt.Errorf("nodes %s: %w", node, ErrNotFound)
		}
		d.PreviousDeadline, d.WasDrained = r.drained[node]
		deadline := d.PreviousDeadline
		if c.SetDeadline {
			deadline = c.Deadline
		}
		drained := *n
		drained.Drained, drained.DrainDeadline = true, deadline
		d.Node = &drained
		if d.WasDrained && deadline.Equal(d.PreviousDeadline) {
			return nil, nil
		}
		value, err := encodeDrain(deadline)
		if err != nil {
			return nil, err
		}
		return r.drainWrite(node, value), nil
	})
	if err != nil {
		return Drained{}, err
	}
	d.Revision = rev
	return d, nil
}

// Drain drains a node until deadline (zero: none), replacing the deadline
// of a drain before it, as DrainNode with SetDeadline. It returns the node
// and the revision that holds the change.
func (r *Registry) Drain(node string, deadline time.Time) (*model.Node, uint64, error) {
	d, err := r.DrainNode(node, DrainChange{SetDeadline: true, Deadline: deadline})
	return d.Node, d.Revision, err
}

// Uncordon undoes a node's drain. It returns the node and the revision
// that holds the change (the current one when the node was not drained).
func (r *Registry) Uncordon(node string) (n *model.Node, rev uint64, err error) {
	rev, err = r.write(func() (*pending, error) {
		var ok bool
		if n, ok = r.Nodes.items[node]; !ok {
			return nil, fmt.Errorf("nodes %s: %w", node, ErrNotFound)
		}
		if _, drained := r.drained[node]; !drained {
			return nil, nil
		}
		return r.drainWrite(node, nil), nil
	})
	if err != nil {
		return nil, 0, err
	}
	return n, rev, nil
}

// drainWrite is the write of a node's drain (value nil: none). Called
// with mu held.
func (r *Registry) drainWrite(node string, value []byte) *pending {
	op := store.Op{Kind: drainsKind, Key: node, Value: value}
	return &pending{ops: []store.Op{op}, what: "the drain of " + node, publish: func(rev uint64, readBack bool) {
		if !readBack {
			ch := Change{Revision: rev}
			r.putDrain(op, &ch)
			r.notifyListeners(ch)
		}
	}}
}
