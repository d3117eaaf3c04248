//go:build weirfaults

package faults

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/weirlb/weir/agent/syncer"
	"github.com/weirlb/weir/datapath"
)

// wrap holds every apply from SIGUSR1 to SIGUSR2: the agent keeps
// receiving states from the server but programs none, as when nft hangs.
// It is what lets the tests see /healthz turn 503 once an update has
// waited longer than --health-timeout.
func wrap(a syncer.Applier, log *slog.Logger) syncer.Applier {
	var mu sync.Mutex
	held := false
	released := make(chan struct{})
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for sig := range sigs {
			mu.Lock()
			switch {
			case sig == syscall.SIGUSR1 && !held:
				held, released = true, make(chan struct{})
				log.Warn("fault hook: holding every apply until SIGUSR2")
			case sig == syscall.SIGUSR2 && held:
				held = false
				close(released)
				log.Warn("fault hook: applying again")
			}
			mu.Unlock()
		}
	}()
	return applier{Applier: a, gate: func(ctx context.Context) error {
		mu.Lock()
		wait, ch := held, released
		mu.Unlock()
		if !wait {
			return nil
		}
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

// applier is an Applier whose applies a hook may hold.
type applier struct {
	syncer.Applier
	gate func(context.Context) error // waits while applies are held
}

func (a applier) Apply(ctx context.Context, st datapath.NodeState) error {
	if err := a.gate(ctx); err != nil {
		return err
	}
	return a.Applier.Apply(ctx, st)
}
