package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// addWaitFlag adds --wait[=TIMEOUT]: after writing, wait until every
// connected node's kernel holds the write.
func addWaitFlag(f *pflag.FlagSet, wait *time.Duration) {
	f.DurationVar(wait, "wait", 0, "after writing, wait up to this long (--wait alone: 30s) until every connected node forwards the change; exit 4 if some do not")
	f.Lookup("wait").NoOptDefVal = "30s"
}

// notProgrammedError is a write that some connected node does not forward
// (yet): exit code 4.
type notProgrammedError struct{ msg string }

func (e *notProgrammedError) Error() string { return e.msg }

// waitProgrammed waits until every connected node is programmed through
// revision rev, printing where they stand; an error names the nodes that
// are not and why.
func (a *app) waitProgrammed(ctx context.Context, rev uint64, timeout time.Duration) error {
	_, st, err := a.clients()
	if err != nil {
		return err
	}
	r, err := st.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(timeout)})
	if err != nil {
		return plain(nil, err)
	}
	connected := 0
	var behind, away []string
	for _, n := range r.GetNodes() {
		switch {
		case !n.GetConnected():
			away = append(away, n.GetName())
		case n.GetReason() != "":
			behind = append(behind, fmt.Sprintf("%s: %s (programmed through %d)", n.GetName(), n.GetReason(), n.GetProgrammedVersion()))
		}
		if n.GetConnected() {
			connected++
		}
	}
	for _, sp := range r.GetSpeakers() {
		if sp.GetReason() != "" {
			behind = append(behind, fmt.Sprintf("speaker %s: %s (programmed through %d)", sp.GetName(), sp.GetReason(), sp.GetProgrammedVersion()))
		}
	}
	where := fmt.Sprintf("%d connected node(s)", connected)
	if n := len(r.GetSpeakers()); n > 0 {
		where += fmt.Sprintf(" and %d load-balancer speaker(s)", n)
	}
	if len(away) > 0 {
		fmt.Fprintf(a.stderr, "not connected, not waited for: %s\n", strings.Join(away, ", "))
	}
	if r.GetProgrammed() {
		fmt.Fprintf(a.stdout, "revision %d programmed on %s\n", rev, where)
		return nil
	}
	return &notProgrammedError{fmt.Sprintf("revision %d is not programmed on every connected node and speaker after %v:\n  %s",
		rev, timeout, strings.Join(behind, "\n  "))}
}

// revisioned is a reply or an object that names a store revision.
type revisioned interface {
	GetRevision() uint64
	GetResourceVersion() string
}

// revisionOf is the store revision r names: its revision, or, from a
// server older than that field, its resource_version read as a number;
// 0 when there is none.
func revisionOf(r revisioned) uint64 {
	if v := r.GetRevision(); v != 0 {
		return v
	}
	v, _ := strconv.ParseUint(r.GetResourceVersion(), 10, 64)
	return v
}
