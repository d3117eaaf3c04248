package api

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// A speaker must say who it is.
func TestSpeakersNameThemselves(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	w, err := e.tier.WatchTargets(ctx, &weirv1.WatchTargetsRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	wantField(t, "a watch by no speaker", err, "speaker")
	_, err = e.tier.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{}})
	wantField(t, "a report by no speaker", err, "status.name")
}

// A replica that is not current sends its speakers to another, unless
// they accept a stale state.
func TestTargetsOfAReplicaNotCurrent(t *testing.T) {
	e := startEdge(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.hub.SetNotCurrent("the store is away")
	w, err := e.tier.WatchTargets(ctx, &weirv1.WatchTargetsRequest{Speaker: "s1"})
	if err == nil {
		_, err = w.Recv()
	}
	wantCode(t, "a watch on a replica not current", err, codes.Unavailable, "")
	stale, err := e.tier.WatchTargets(ctx, &weirv1.WatchTargetsRequest{Speaker: "s1", AcceptStale: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stale.Recv(); err != nil {
		t.Errorf("a watch that accepts a stale state: %v", err)
	}
}

// A write is programmed on the LB tier once every watching speaker
// reported applying targets that hold it; a speaker that stops watching
// is no longer waited for.
func TestWaitProgrammedFollowsTheSpeakers(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	created, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.11")})
	if err != nil {
		t.Fatal(err)
	}
	rev := revision(t, created.GetNode().GetMetadata().GetResourceVersion())
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := e.tier.WatchTargets(watchCtx, &weirv1.WatchTargetsRequest{Speaker: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.GetRevision() != rev || len(first.GetVips()) != 0 {
		t.Errorf("targets %v at revision %d; want none at %d (no load-balancer IP)", first.GetVips(), first.GetRevision(), rev)
	}
	wait := func() *weirv1.WaitProgrammedResponse {
		t.Helper()
		r, err := e.status.WaitProgrammed(ctx, &weirv1.WaitProgrammedRequest{Revision: rev, Timeout: durationpb.New(300 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := wait(); r.GetProgrammed() || len(r.GetSpeakers()) != 1 || r.GetSpeakers()[0].GetReason() != "applying" {
		t.Errorf("before the speaker reports: %v; want it applying", r)
	}
	if _, err := e.tier.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: "s1", AppliedRevision: rev}}); err != nil {
		t.Fatal(err)
	}
	if r := wait(); !r.GetProgrammed() || len(r.GetSpeakers()) != 1 || r.GetSpeakers()[0].GetProgrammedVersion() != rev {
		t.Errorf("after the speaker reports revision %d: %v; want programmed", rev, r)
	}
	stopWatch()
	deadline := time.Now().Add(10 * time.Second)
	for len(wait().GetSpeakers()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a speaker that stopped watching is still waited for")
		}
	}
}
