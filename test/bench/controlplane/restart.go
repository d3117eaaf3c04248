package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/weirlb/weir/agent/health"
	"github.com/weirlb/weir/agent/syncer"
	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/dial"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// noDatapath applies nothing: the bench measures the control plane.
type noDatapath struct{}

func (noDatapath) Apply(context.Context, datapath.NodeState) error { return nil }
func (noDatapath) Resync(context.Context) error                    { return nil }

// measureServerRestart runs one real agent syncer per node (the agent's
// own dialer and backoff, no datapath), waits until every one has applied
// the newest state, stops the server (SIGTERM) and starts it again on the
// same data, and reports how long after the server listened again each
// agent's stream was back.
func measureServerRestart(ctx context.Context, addr string, nAgents int, srv *exec.Cmd, start func() (*exec.Cmd, error)) (*exec.Cmd, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	healths := make([]*health.Agent, nAgents)
	syncers := make([]*syncer.Syncer, nAgents)
	for i := range nAgents {
		conn, err := dial.Server(addr, nil)
		if err != nil {
			return srv, err
		}
		defer conn.Close()
		// The agent's own health, with its default timeout: what its
		// /healthz would answer through the restart.
		healths[i] = health.NewAgent(60*time.Second, health.ServiceLimits, slog.New(slog.DiscardHandler), nil)
		s := syncer.New(syncer.Config{NodeName: fmt.Sprintf("node-%d", i)}, conn, noDatapath{}, healths[i], slog.New(slog.DiscardHandler))
		syncers[i] = s
		go s.Run(ctx)
	}
	// Which agents' /healthz would have answered other than 200, while
	// they take their first state and then through the restart.
	var unhealthy [2]sync.Map
	var phase atomic.Int32
	sampling, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() {
		for sampling.Err() == nil {
			p := phase.Load()
			for i, h := range healths {
				if code, _ := h.Node.Codes(); code != http.StatusOK {
					unhealthy[p].Store(i, true)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	admin, err := dial.Server(addr, nil)
	if err != nil {
		return srv, err
	}
	defer admin.Close()
	if _, err := waitConnected(ctx, admin, nAgents, time.Minute); err != nil {
		return srv, err
	}
	// Every syncer holds the whole state before the server goes.
	info, err := weirv1.NewStatusServiceClient(admin).GetServerInfo(ctx, &weirv1.GetServerInfoRequest{})
	if err != nil {
		return srv, err
	}
	began := time.Now()
	if _, err := waitApplied(syncers, info.GetRevision(), 15*time.Minute); err != nil {
		return srv, err
	}
	fmt.Printf("%d real agent syncers took the whole state in %v\n", nAgents, time.Since(began).Round(time.Millisecond))
	phase.Store(1)

	srv, down, listening, err := restart(addr, srv, start)
	if err != nil {
		return srv, err
	}
	written, err := writeAfterRestart(ctx, admin)
	if err != nil {
		return srv, err
	}
	var back map[string]time.Time
	var backErr error
	connected := make(chan struct{})
	go func() {
		defer close(connected)
		back, backErr = waitConnected(ctx, admin, nAgents, time.Minute)
	}()
	applied, err := waitApplied(syncers, written, 5*time.Minute)
	if err != nil {
		return srv, err
	}
	<-connected
	if backErr != nil {
		return srv, backErr
	}
	var tookApplied []time.Duration
	for _, at := range applied {
		tookApplied = append(tookApplied, at.Sub(listening))
	}
	slices.Sort(tookApplied)
	fmt.Printf("server restart: a write made as it listened again applied by all %d syncers p50 %v  p99 %v  max %v after it listened\n", nAgents,
		tookApplied[len(tookApplied)/2].Round(time.Millisecond), tookApplied[len(tookApplied)*99/100].Round(time.Millisecond), tookApplied[len(tookApplied)-1].Round(time.Millisecond))
	var took []time.Duration
	for _, at := range back {
		took = append(took, at.Sub(listening))
	}
	slices.Sort(took)
	q := func(p int) time.Duration { return took[min(len(took)-1, len(took)*p/100)].Round(time.Millisecond) }
	fmt.Printf("server restart (SIGTERM, %v to listen again): %d real agent syncers back p50 %v  p99 %v  max %v after it listened\n",
		listening.Sub(down).Round(time.Millisecond), nAgents, q(50), q(99), took[len(took)-1].Round(time.Millisecond))
	stopSampling()
	var bad [2]int
	for p := range unhealthy {
		unhealthy[p].Range(func(any, any) bool { bad[p]++; return true })
	}
	fmt.Printf("agents whose /healthz would have answered other than 200 (sampled every 20 ms): through the restart %d of %d; while they took their first state, all at once, %d (a new agent is unhealthy until its first state is applied, after the 60 s timeout)\n",
		bad[1], nAgents, bad[0])
	return srv, nil
}

// measureServerRestartSimulated stops the server (SIGTERM) under the
// connected simulated agents, starts it again on the same data, writes as
// soon as it listens, and times each agent's return (its first message,
// and whether that was a whole state) and its receipt of that write.
func measureServerRestartSimulated(ctx context.Context, addr string, srv *exec.Cmd, start func() (*exec.Cmd, error), all []*agent) (*exec.Cmd, error) {
	for _, a := range all {
		a.mu.Lock()
		a.back, a.backFull = time.Time{}, false
		a.mu.Unlock()
	}
	srv, down, listening, err := restart(addr, srv, start)
	if err != nil {
		return srv, err
	}
	admin, err := dial.Server(addr, nil)
	if err != nil {
		return srv, err
	}
	defer admin.Close()
	written, err := writeAfterRestart(ctx, admin)
	if err != nil {
		return srv, err
	}
	var back, got []time.Duration
	full := 0
	deadline := time.Now().Add(5 * time.Minute)
	for _, a := range all {
		for {
			a.mu.Lock()
			at, ok := a.received[written]
			b, wasFull := a.back, a.backFull
			a.mu.Unlock()
			if ok && !b.IsZero() {
				back, got = append(back, b.Sub(listening)), append(got, at.Sub(listening))
				if wasFull {
					full++
				}
				break
			}
			if time.Now().After(deadline) {
				return srv, fmt.Errorf("%s did not receive version %d within 5 minutes of the restart", a.name, written)
			}
			time.Sleep(time.Millisecond)
		}
	}
	slices.Sort(back)
	slices.Sort(got)
	q := func(d []time.Duration, p int) time.Duration {
		return d[min(len(d)-1, len(d)*p/100)].Round(time.Millisecond)
	}
	fmt.Printf("server restart (SIGTERM, %v to listen again), %d simulated agents: back p50 %v  p99 %v  max %v after it listened (%d took a whole state, the rest resumed); a write made as it listened received by all: p50 %v  p99 %v  max %v\n",
		listening.Sub(down).Round(time.Millisecond), len(all), q(back, 50), q(back, 99), back[len(back)-1].Round(time.Millisecond), full,
		q(got, 50), q(got, 99), got[len(got)-1].Round(time.Millisecond))
	return srv, nil
}

// restart stops the server with SIGTERM, starts it again and returns when
// it listens: the new process, when the old one had gone and when the new
// one listened.
func restart(addr string, srv *exec.Cmd, start func() (*exec.Cmd, error)) (*exec.Cmd, time.Time, time.Time, error) {
	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
	down := time.Now()
	srv, err := start()
	if err != nil {
		return srv, down, time.Time{}, err
	}
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return srv, down, time.Now(), nil
		}
		if time.Since(down) > 30*time.Second {
			return srv, down, time.Time{}, fmt.Errorf("the restarted server does not listen")
		}
		time.Sleep(time.Millisecond)
	}
}

// writeAfterRestart creates a service as soon as the restarted server
// takes writes and returns the version it made: every agent must get it,
// which it can only over a stream to the restarted server.
func writeAfterRestart(ctx context.Context, admin *grpc.ClientConn) (uint64, error) {
	for began := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		created, err := weirv1.NewRegistryServiceClient(admin).CreateService(ctx, &weirv1.CreateServiceRequest{Service: &weirv1.Service{
			Metadata: &weirv1.ObjectMeta{Namespace: "bench", Name: "after-restart"},
			Spec:     &weirv1.ServiceSpec{ClusterIps: []string{"10.95.0.1"}, Ports: []*weirv1.ServicePort{{Name: "http", Port: 80}}}}})
		if err == nil {
			return strconv.ParseUint(created.GetService().GetMetadata().GetResourceVersion(), 10, 64)
		}
		if time.Since(began) > 30*time.Second {
			return 0, err
		}
	}
}

// waitApplied polls the syncers until each has applied version v and
// returns when each was first seen so (within 10 ms).
func waitApplied(syncers []*syncer.Syncer, v uint64, limit time.Duration) ([]time.Time, error) {
	at := make([]time.Time, len(syncers))
	left := len(syncers)
	for deadline := time.Now().Add(limit); left > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d syncers had not applied version %d after %v", left, len(syncers), v, limit)
		}
		now := time.Now()
		for i, s := range syncers {
			if at[i].IsZero() && s.Status().AppliedVersion >= v {
				at[i], left = now, left-1
			}
		}
	}
	return at, nil
}

// waitConnected polls the server's node statuses until n agents are
// connected and returns when each was first seen so (within 5 ms).
func waitConnected(ctx context.Context, conn *grpc.ClientConn, n int, limit time.Duration) (map[string]time.Time, error) {
	st := weirv1.NewStatusServiceClient(conn)
	seen := map[string]time.Time{}
	deadline := time.Now().Add(limit)
	for len(seen) < n {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d agents connected after %v", len(seen), n, limit)
		}
		token := ""
		for {
			r, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{PageSize: 5000, PageToken: token})
			if err != nil {
				break // the server is still starting
			}
			now := time.Now()
			for _, s := range r.GetNodes() {
				if _, ok := seen[s.GetName()]; !ok && s.GetConnected() {
					seen[s.GetName()] = now
				}
			}
			if token = r.GetNextPageToken(); token == "" {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return seen, nil
}
