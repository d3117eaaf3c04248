package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/weirlb/weir/agent/health"
	"github.com/weirlb/weir/agent/syncer"
	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/tlsconfig"
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
	for i := range nAgents {
		conn, err := dial.Server(addr, true, tlsconfig.Files{})
		if err != nil {
			return srv, err
		}
		defer conn.Close()
		// The agent's own health, with its default timeout: what its
		// /healthz would answer through the restart.
		healths[i] = health.NewAgent(60*time.Second, slog.New(slog.DiscardHandler), nil)
		s := syncer.New(syncer.Config{NodeName: fmt.Sprintf("node-%d", i)}, conn, noDatapath{}, healths[i], slog.New(slog.DiscardHandler))
		go s.Run(ctx)
	}
	var unhealthy sync.Map // node -> true once its /healthz would have answered other than 200
	sampling, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() {
		for sampling.Err() == nil {
			for i, h := range healths {
				if code, _ := h.Node.Codes(); code != http.StatusOK {
					unhealthy.Store(i, true)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	admin, err := dial.Server(addr, true, tlsconfig.Files{})
	if err != nil {
		return srv, err
	}
	defer admin.Close()
	if _, err := waitConnected(ctx, admin, nAgents, time.Minute); err != nil {
		return srv, err
	}

	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
	down := time.Now()
	srv, err = start()
	if err != nil {
		return srv, err
	}
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Since(down) > 30*time.Second {
			return srv, fmt.Errorf("the restarted server does not listen")
		}
		time.Sleep(time.Millisecond)
	}
	listening := time.Now()
	back, err := waitConnected(ctx, admin, nAgents, time.Minute)
	if err != nil {
		return srv, err
	}
	var took []time.Duration
	for _, at := range back {
		took = append(took, at.Sub(listening))
	}
	slices.Sort(took)
	q := func(p int) time.Duration { return took[min(len(took)-1, len(took)*p/100)].Round(time.Millisecond) }
	fmt.Printf("server restart (SIGTERM, %v to listen again): %d real agent syncers back p50 %v  p99 %v  max %v after it listened\n",
		listening.Sub(down).Round(time.Millisecond), nAgents, q(50), q(99), took[len(took)-1].Round(time.Millisecond))
	stopSampling()
	bad := 0
	unhealthy.Range(func(any, any) bool { bad++; return true })
	fmt.Printf("agents whose /healthz would have answered other than 200 at any moment (sampled every 20 ms): %d of %d\n", bad, nAgents)
	return srv, nil
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
