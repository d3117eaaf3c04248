// Package replicas runs what replicas of the server share through etcd
// besides the registry: a lease that says the replica is alive, the
// election of the one that runs the jobs that must run once, the test of
// whether the replica's state is current, and the status of the agents
// connected to each, so that every replica shows every node.
package replicas

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
	"github.com/weirlb/weir/server/store/etcdstore"
)

// Config is one replica.
type Config struct {
	Store    *etcdstore.Etcd
	Registry *registry.Registry
	Hub      *agentsync.Hub
	// Name names the replica in the election and in logs.
	Name string
	// LeaseTTL is how long a dead replica keeps its leadership and its
	// agents' status: a new leader is elected within about that long.
	LeaseTTL time.Duration
	// StaleAfter is how long a replica may fail to reach the store, or
	// lag behind it, before its state is not current.
	StaleAfter time.Duration
	// Serving is told whether the replica is current (gRPC health).
	Serving func(bool)
	// WentBack is told when the store is at a revision below the one the
	// replica holds: it was restored from a snapshot, and what the
	// replica holds is of another history. The server stops (its
	// supervisor starts it again on the restored store).
	WentBack func(error)
	Log      *slog.Logger
}

// Lead runs the leader-only jobs until ctx ends; it is called each time
// this replica becomes the leader, with ctx carrying the leadership's
// guard (store.WithGuard).
type Lead func(ctx context.Context)

// Run keeps the replica's lease, campaigns, watches currency and shares
// status, until ctx ends.
func Run(ctx context.Context, cfg Config, lead Lead) {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 2 * time.Second
	}
	go watchCurrency(ctx, cfg)
	go watchStatus(ctx, cfg)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(cfg.Store.Client(), concurrency.WithTTL(ttlSeconds(cfg.LeaseTTL)), concurrency.WithContext(ctx))
		if err != nil {
			cfg.Log.Warn("no lease from the store; retrying", "error", err, "retry_in", backoff)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		live(ctx, cfg, sess, lead)
		sess.Close()
	}
}

// live is one lease: while it holds, the replica publishes its agents'
// status with it and campaigns with it.
func live(ctx context.Context, cfg Config, sess *concurrency.Session, lead Lead) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cfg.Log.Warn("the replica's lease ended")
			cancel()
		case <-ctx.Done():
		}
	}()
	go publishStatus(ctx, cfg, sess)
	election := concurrency.NewElection(sess, cfg.Store.Prefix()+"/leader")
	for ctx.Err() == nil {
		if err := election.Campaign(ctx, cfg.Name); err != nil {
			if ctx.Err() == nil {
				cfg.Log.Warn("campaigning for leader", "error", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		g := store.Guard{Key: election.Key(), Rev: election.Rev()}
		cfg.Log.Info("leading: assigning addresses and running the sources' writes", "replica", cfg.Name)
		lead(store.WithGuard(ctx, g))
		// The jobs stopped with ctx: the lease ended (another replica
		// may lead already; the guard refuses any write still on its
		// way) or the server is stopping.
		cfg.Log.Info("no longer leading", "replica", cfg.Name)
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		election.Resign(rctx)
		rcancel()
	}
}

func ttlSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// watchCurrency checks, twice a second, that the replica reaches the store
// and keeps up with it: a replica that holds a head it read at time T had
// every write made before T. When that T is StaleAfter old (the store is
// out of reach, or the replica has fallen behind), the replica is not
// current: its health says so and its agents are sent to another
// replica. When it is again, both come back. A store below what the
// replica holds went back (a restore): the server stops.
func watchCurrency(ctx context.Context, cfg Config) {
	tick := time.NewTicker(StaleCheckPeriod)
	defer tick.Stop()
	type seen struct {
		rev uint64
		at  time.Time // the head was read after this
	}
	var heads []seen // read, not yet held
	lastGood, current := time.Now(), true
	reason := ""
	for {
		// held first: a write between the two reads then only makes the
		// store look ahead, never behind.
		held := cfg.Registry.Revision()
		at := time.Now()
		head, err := cfg.Store.Head(ctx)
		switch {
		case err != nil:
			reason = "cannot reach the store: " + err.Error()
		case head < held:
			cfg.WentBack(fmt.Errorf("the store is at revision %d, below the %d this replica holds: restored from a snapshot? restart to load it", head, held))
			return
		default:
			heads = append(heads, seen{head, at})
		}
		held = cfg.Registry.Revision()
		for len(heads) > 0 && heads[0].rev <= held {
			lastGood = heads[0].at
			heads = heads[1:]
		}
		if len(heads) > 0 {
			reason = fmt.Sprintf("behind the store: holds revision %d, the store was at %d %v ago", held, heads[0].rev, time.Since(heads[0].at).Round(time.Millisecond))
		}
		fresh := time.Since(lastGood) < cfg.StaleAfter
		switch {
		case fresh && !current:
			current = true
			cfg.Log.Info("the replica is current again", "revision", held)
			cfg.Hub.SetNotCurrent("")
			cfg.Serving(true)
		case !fresh && current:
			current = false
			cfg.Log.Warn("the replica is not current: agents are sent to another", "reason", reason)
			cfg.Hub.SetNotCurrent(reason)
			cfg.Serving(false)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// StaleCheckPeriod is how often a replica checks that it is current.
var StaleCheckPeriod = 500 * time.Millisecond
