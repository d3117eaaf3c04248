// Package faults lets the lab tests make an agent misbehave on purpose.
// Only a binary built with the weirfaults build tag has the hooks (the
// lab builds its agents so); in any other build Wrap changes nothing.
package faults

import (
	"log/slog"

	"github.com/weirlb/weir/agent/syncer"
)

// Wrap returns the applier the agent should use: a, or, with the
// weirfaults tag, a with the hooks of hooks.go around it.
func Wrap(a syncer.Applier, log *slog.Logger) syncer.Applier { return wrap(a, log) }
