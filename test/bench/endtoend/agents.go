package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/bench/internal/envelope"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// simAgent is one simulated agent: its own connection and stream, an ACK
// for every whole state the moment it arrives, and when each arrived.
type simAgent struct {
	name string
	// decode: each message is decoded whole, as an agent does; else
	// only its envelope (test/bench/internal/envelope).
	decode bool

	mu       sync.Mutex // guards arrivals and deltaBytes
	arrivals []arrival  // whole states, in the order they came (versions rise)
	// deltaBytes is the size of the last delta (not a whole state).
	deltaBytes int
	// bytes and messages are all the agent received.
	bytes, messages int
}

// arrival is a state version and when it was seen.
type arrival struct {
	version uint64
	at      time.Time
}

func (a *simAgent) run(ctx context.Context, conn *grpc.ClientConn) error {
	codec := &envelope.Codec{Decode: a.decode}
	stream, err := weirv1.NewAgentServiceClient(conn).Sync(ctx, grpc.ForceCodecV2(codec))
	if err != nil {
		return err
	}
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: a.name}}}); err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		a.mu.Lock()
		a.bytes += codec.Size
		a.messages++
		a.mu.Unlock()
		if msg.GetMore() {
			continue // a state in parts: it has arrived with its last part
		}
		now := time.Now()
		a.mu.Lock()
		a.arrivals = append(a.arrivals, arrival{msg.GetVersion(), now})
		if !msg.GetFull() {
			a.deltaBytes = codec.Size
		}
		a.mu.Unlock()
		if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: msg.GetVersion()}}}); err != nil {
			return err
		}
	}
}

// receivedAt is when the agent first held revision v: the first state of
// version v or later (a later one when the server coalesced v with what
// followed).
func (a *simAgent) receivedAt(v uint64) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return firstFrom(a.arrivals, v)
}

// firstFrom is when the first of arrivals (versions rising) at v or
// later came.
func firstFrom(arrivals []arrival, v uint64) (time.Time, bool) {
	i, _ := slices.BinarySearchFunc(arrivals, v, func(a arrival, v uint64) int { return cmp.Compare(a.version, v) })
	if i == len(arrivals) {
		return time.Time{}, false
	}
	return arrivals[i].at, true
}

// realNode follows one lab node's real agent from outside: when the
// server's status stream first shows each version applied, and, read from
// the agent's metrics right after, when the agent's kernel commit of that
// version ended.
type realNode struct {
	node    *lab.Node
	metrics *http.Client // from inside the node's namespace

	mu sync.Mutex // guards the fields below
	// shown is, per applied version, the first status message showing
	// it; latency is the server's programming_latency for it.
	shown   []shownStatus
	commits []commit
}

type shownStatus struct {
	arrival
	latency time.Duration
}

// commit is what the agent's metrics say of its last successful apply:
// the version, when Apply returned (its kernel transaction committed), and
// how many applies it had made by then.
type commit struct {
	arrival
	applies float64
}

// observe records a status of the node; it reports whether the node
// applied a version not seen before.
func (r *realNode) observe(at time.Time, st *weirv1.NodeStatus) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := st.GetAppliedVersion()
	if n := len(r.shown); n > 0 && r.shown[n-1].version >= v {
		return false
	}
	r.shown = append(r.shown, shownStatus{arrival{v, at}, st.GetProgrammingLatency().AsDuration()})
	return true
}

// scrape reads the agent's last apply from its metrics.
func (r *realNode) scrape(ctx context.Context) error {
	m, err := scrape(ctx, r.metrics, agentMetrics)
	if err != nil {
		return fmt.Errorf("%s's agent: %w", r.node.Name, err)
	}
	version, at, applies := m["weir_sync_applied_version"], m["weir_sync_proxy_rules_last_timestamp_seconds"], m["weir_sync_proxy_rules_duration_seconds_count"]
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.commits); n > 0 && r.commits[n-1].version >= uint64(version) {
		return nil
	}
	r.commits = append(r.commits, commit{arrival{uint64(version), time.Unix(0, int64(at*1e9))}, applies})
	return nil
}

// committedAt is when the node's kernel first held revision v: the end of
// the apply of the first version >= v the agent was seen to apply. exact
// is false when the agent applied another state in between that was never
// seen (it may have held v already): the time is then an upper bound.
func (r *realNode) committedAt(v uint64) (at time.Time, exact, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, c := range r.commits {
		if c.version >= v {
			return c.at, i > 0 && c.applies == r.commits[i-1].applies+1, true
		}
	}
	return time.Time{}, false, false
}

// shownAt is when the status stream first showed revision v applied, and
// the server's own programming latency when the node applied v itself.
func (r *realNode) shownAt(v uint64) (at time.Time, latency time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.shown {
		if s.version >= v {
			if s.version != v {
				return s.at, 0, true // coalesced: the latency is of an older change
			}
			return s.at, s.latency, true
		}
	}
	return time.Time{}, 0, false
}

// watchStatuses follows the server's node statuses until ctx ends; for
// each real node it records every newly applied version and reads the
// agent's metrics at once. first is closed after the first message.
func watchStatuses(ctx context.Context, status weirv1.StatusServiceClient, reals []*realNode, first chan<- struct{}) error {
	stream, err := status.WatchNodeStatuses(ctx, &weirv1.WatchNodeStatusesRequest{})
	if err != nil {
		return err
	}
	byName := map[string]*realNode{}
	for _, r := range reals {
		byName[r.node.Name] = r
	}
	for n := 0; ; n++ {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		for _, st := range msg.GetNodes() {
			if r := byName[st.GetName()]; r != nil && r.observe(at, st) {
				if err := r.scrape(ctx); err != nil {
					return err
				}
			}
		}
		if n == 0 {
			close(first)
		}
	}
}

// scrapes are the lab's metrics at one moment.
type scrapes struct {
	server     metrics
	serverTook time.Duration // to read the server's page
	agents     []metrics     // the real nodes', in order
}

func scrapeAll(ctx context.Context, c *weirlab.Cluster, reals []*realNode) (scrapes, error) {
	var s scrapes
	var err error
	// Prometheus's own default scrape timeout: a page with a series per
	// node for 500 nodes, read while they settle.
	start := time.Now()
	if s.server, err = scrape(ctx, c.Control.HTTPClient(10*time.Second), serverMetrics); err != nil {
		// What the server was doing instead.
		if dump, derr := get(ctx, c.Control.HTTPClient(30*time.Second), "http://"+serverMetrics+"/debug/pprof/goroutine?debug=1"); derr == nil {
			path := filepath.Join(c.Dir, "server-goroutines.txt")
			if os.WriteFile(path, dump, 0o644) == nil {
				err = fmt.Errorf("%w (its goroutines: %s)", err, path)
			}
		}
		return s, fmt.Errorf("the server: %w", err)
	}
	s.serverTook = time.Since(start)
	for _, r := range reals {
		m, err := scrape(ctx, r.metrics, agentMetrics)
		if err != nil {
			return s, fmt.Errorf("%s's agent: %w", r.node.Name, err)
		}
		s.agents = append(s.agents, m)
	}
	return s, nil
}

// get reads url through client.
func get(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}
