package registry

import (
	"encoding/json"
	"fmt"
	"time"
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
