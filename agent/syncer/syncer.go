// Package syncer is the agent's side of the state stream: it keeps the
// node's desired state as the server sends it, applies every version to the
// datapath, answers ACK or NACK, and reconnects with backoff when the server
// goes away, while the kernel keeps forwarding on the last good rules.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Applier programs a node's state; *datapath.Datapath is the real one.
type Applier interface {
	Apply(context.Context, datapath.NodeState) error
	Resync(context.Context) error
}

// Config is how the syncer runs.
type Config struct {
	NodeName     string
	AgentVersion string
	// ResyncPeriod is how often the whole table is rewritten, repairing
	// rules someone else changed.
	ResyncPeriod time.Duration
	// RetryPeriod is how soon a failed apply is tried again.
	RetryPeriod time.Duration
	// MaxBackoff caps the wait between reconnection attempts.
	MaxBackoff time.Duration
}

// Syncer keeps one node in step with the server.
type Syncer struct {
	cfg  Config
	conn grpc.ClientConnInterface
	dp   Applier
	log  *slog.Logger

	mu       sync.Mutex // guards the fields below
	state    datapath.NodeState
	received uint64 // version of state
	applied  uint64 // last version applied successfully
	lastErr  error  // why state is not applied, if it is not
	synced   time.Time
}

// New returns a syncer for conn's server.
func New(cfg Config, conn grpc.ClientConnInterface, dp Applier, log *slog.Logger) *Syncer {
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = 5 * time.Minute
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	return &Syncer{cfg: cfg, conn: conn, dp: dp, log: log,
		state: datapath.NodeState{Services: map[datapath.ServiceKey]*datapath.Service{}}}
}

// Status is what the syncer has done so far.
type Status struct {
	ReceivedVersion, AppliedVersion uint64
	LastError                       error
	LastSync                        time.Time
}

// Status returns the syncer's progress.
func (s *Syncer) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{ReceivedVersion: s.received, AppliedVersion: s.applied, LastError: s.lastErr, LastSync: s.synced}
}

// Run keeps streaming until ctx ends.
func (s *Syncer) Run(ctx context.Context) error {
	backoff := 250 * time.Millisecond
	for {
		gotState, err := s.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if gotState {
			backoff = 250 * time.Millisecond
		}
		// Jitter, so a restarted server is not hit by every agent at once.
		wait := backoff/2 + rand.N(backoff/2+1)
		s.log.Warn("stream to server ended; keeping the programmed rules and reconnecting", "error", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		backoff = min(backoff*2, s.cfg.MaxBackoff)
	}
}

// session runs one stream; gotState reports whether the server sent anything.
func (s *Syncer) session(ctx context.Context) (gotState bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := weirv1.NewAgentServiceClient(s.conn).Sync(ctx)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	applied := s.applied
	s.mu.Unlock()
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{
		NodeName: s.cfg.NodeName, AppliedVersion: applied, AgentVersion: s.cfg.AgentVersion,
	}}}); err != nil {
		return false, err
	}

	msgs := make(chan *weirv1.SyncResponse)
	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()

	// One timer: the retry of a failed apply when there is one, else the
	// periodic resync.
	timer := time.NewTimer(s.cfg.ResyncPeriod)
	defer timer.Stop()
	rearm := func() {
		s.mu.Lock()
		failing := s.lastErr != nil
		s.mu.Unlock()
		if failing {
			timer.Reset(s.cfg.RetryPeriod)
		} else {
			timer.Reset(s.cfg.ResyncPeriod)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return gotState, ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				err = errors.New("server closed the stream")
			}
			return gotState, err
		case msg := <-msgs:
			gotState = true
			if err := stream.Send(s.handle(ctx, msg)); err != nil {
				return gotState, err
			}
			rearm()
		case <-timer.C:
			answer := s.resync(ctx)
			rearm()
			if answer != nil {
				if err := stream.Send(answer); err != nil {
					return gotState, err
				}
			}
		}
	}
}

// handle folds one message into the desired state, applies it and returns
// the answer. A message that cannot be decoded changes nothing.
func (s *Syncer) handle(ctx context.Context, msg *weirv1.SyncResponse) *weirv1.SyncRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := merge(s.state, msg)
	if err != nil {
		s.log.Error("rejecting state from server", "version", msg.GetVersion(), "error", err)
		return nack(msg.GetVersion(), err)
	}
	s.state, s.received = next, msg.GetVersion()
	return s.applyLocked(ctx)
}

func (s *Syncer) applyLocked(ctx context.Context) *weirv1.SyncRequest {
	start := time.Now()
	if err := s.dp.Apply(ctx, s.state); err != nil {
		s.lastErr = err
		s.log.Error("applying state failed; the last good rules stay in place", "version", s.received, "error", err)
		return nack(s.received, err)
	}
	s.applied, s.lastErr, s.synced = s.received, nil, time.Now()
	s.log.Debug("applied state", "version", s.received, "services", len(s.state.Services), "took", time.Since(start))
	return &weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: s.received}}}
}

// resync retries a failed apply, or rewrites the table from the applied
// state; it returns an answer for the server when the retry settles a version.
func (s *Syncer) resync(ctx context.Context) *weirv1.SyncRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr != nil {
		if answer := s.applyLocked(ctx); answer.GetAck() != nil {
			return answer
		}
		return nil // already nacked this version
	}
	if err := s.dp.Resync(ctx); err != nil {
		s.lastErr = err
		s.log.Error("periodic resync failed", "error", err)
		return nil
	}
	s.synced = time.Now()
	return nil
}

func nack(version uint64, err error) *weirv1.SyncRequest {
	return &weirv1.SyncRequest{Message: &weirv1.SyncRequest_Nack{Nack: &weirv1.Nack{Version: version, Error: err.Error()}}}
}

// merge returns the state msg leads to from cur, sharing the unchanged
// services so the datapath sees which ones changed.
func merge(cur datapath.NodeState, msg *weirv1.SyncResponse) (datapath.NodeState, error) {
	next := datapath.NodeState{Node: cur.Node}
	if msg.GetFull() {
		next.Services = make(map[datapath.ServiceKey]*datapath.Service, len(msg.GetUpserts()))
	} else {
		next.Services = maps.Clone(cur.Services)
	}
	if msg.GetNode() != nil {
		n, err := nodewire.DecodeNode(msg.GetNode())
		if err != nil {
			return cur, err
		}
		next.Node = n
	}
	for _, ws := range msg.GetUpserts() {
		svc, err := nodewire.DecodeService(ws)
		if err != nil {
			return cur, err
		}
		next.Services[svc.Key] = svc
	}
	for _, key := range msg.GetRemovals() {
		ns, name, ok := strings.Cut(key, "/")
		if !ok || ns == "" || name == "" {
			return cur, fmt.Errorf("removal %q is not namespace/name", key)
		}
		delete(next.Services, datapath.ServiceKey{Namespace: ns, Name: name})
	}
	return next, nil
}
