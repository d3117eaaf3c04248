package dial

import (
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
)

// firstBackoff is the first wait between rounds, and the first again after
// every stream that brought state.
const firstBackoff = 100 * time.Millisecond

// Reconnect is what a client that keeps one stream open to the server
// (the agent's state, the speaker's targets) does when it ends: it moves
// to the next replica at once, and waits (jittered, growing to a cap) only
// once every replica has been tried in a round. With a plain connection
// (one server) every attempt is a round of its own.
//
// It also says when to ask for accept_stale: on every attempt of a round
// that follows a round in which every attempt was refused as not current.
// A round in which some replica failed otherwise (or accepted) is followed
// by one without: when the store is back, the first round of refusals is
// all it takes to see it. A stream that brought state starts the count
// again, keeping accept_stale as it was: a replica served with it, and the
// next is likely to need it too.
type Reconnect struct {
	conn     grpc.ClientConnInterface
	replicas failover // nil when conn is one server
	max      time.Duration
	backoff  time.Duration
	// tried and refused count this round's streams, and those refused as
	// not current.
	tried, refused int
	stale          bool
}

// failover is a connection to one of several replicas; *Servers is one.
type failover interface {
	Next() (newRound bool)
	Current() string
	Len() int
}

// NewReconnect returns the reconnection policy of a stream over conn,
// with waits up to maxBackoff between rounds.
func NewReconnect(conn grpc.ClientConnInterface, maxBackoff time.Duration) *Reconnect {
	r := &Reconnect{conn: conn, max: maxBackoff, backoff: firstBackoff}
	r.replicas, _ = conn.(failover)
	return r
}

// AcceptStale says whether the next stream asks for accept_stale.
func (r *Reconnect) AcceptStale() bool { return r.stale }

// WaitForReady says whether the next stream waits for its connection
// instead of failing at once: with one address, yes, so that it is back
// the moment the server is; with several, no, so that a replica that is
// away moves the client on.
func (r *Reconnect) WaitForReady() bool { return r.replicas == nil || r.replicas.Len() == 1 }

// Server is the address the next stream goes to, or "" when conn is one
// server.
func (r *Reconnect) Server() string {
	if r.replicas == nil {
		return ""
	}
	return r.replicas.Current()
}

// Ended takes the end of a stream (err; gotState when the server sent
// anything), moves on to the next replica and returns how long to wait
// before the next attempt.
func (r *Reconnect) Ended(err error, gotState bool) time.Duration {
	if gotState {
		r.backoff, r.tried, r.refused = firstBackoff, 0, 0
	}
	r.tried++
	if IsNotCurrent(err) {
		r.refused++
	}
	if r.replicas != nil && !r.replicas.Next() {
		return 0 // another replica, not tried in this round
	}
	r.stale = r.refused == r.tried
	r.tried, r.refused = 0, 0
	// Jitter, so a restarted server is not hit by every client at once.
	wait := r.backoff/2 + rand.N(r.backoff/2+1)
	r.backoff = min(2*r.backoff, r.max)
	return wait
}
