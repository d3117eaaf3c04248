// Package faults lets the lab tests make an agent misbehave on purpose.
// Only a binary built with the weirfaults build tag has the hooks (the
// lab builds its agents so); in any other build Wrap changes nothing.
package faults

import (
	"context"
	"log/slog"

	"github.com/weirlb/weir/agent/syncer"
	"github.com/weirlb/weir/datapath"
)

// Wrap returns the applier the agent should use: a, or, with the
// weirfaults tag, a with the hooks of hooks.go around it.
func Wrap(a syncer.Applier, log *slog.Logger) syncer.Applier { return wrap(a, log) }

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
