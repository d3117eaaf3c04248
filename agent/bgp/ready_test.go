package bgp

import (
	"context"
	"log/slog"
	"testing"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/report"
)

// sessionSpeaker reports the sessions it is given.
type sessionSpeaker struct {
	failingSpeaker
	sessions []bgpspeaker.Session
}

func (s *sessionSpeaker) Sessions(context.Context) ([]bgpspeaker.Session, error) {
	return s.sessions, nil
}

func TestEstablishedNeedsAnAppliedStateAndASession(t *testing.T) {
	sp := &sessionSpeaker{sessions: []bgpspeaker.Session{{State: report.BGPEstablished}}}
	a := NewAnnouncer(sp, func() bool { return true }, slog.New(slog.DiscardHandler))
	if a.Established() {
		t.Error("established before any state was applied (nothing announced yet)")
	}
	a.Received(datapath.NodeState{})
	a.Applied(0)
	if !a.Established() {
		t.Error("not established with a state applied and a session up")
	}
	sp.sessions = []bgpspeaker.Session{{State: report.BGPState("active")}}
	if a.Established() {
		t.Error("established with no session up")
	}
}
