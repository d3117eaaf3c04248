package agentsync

import (
	"context"
	"sync"
)

// places bounds the whole states being sent at once: in all
// (FullStatesAtOnce), and per party (FullStatesPerParty, auth.Party) for
// callers with certificates, so that streams that never answer hold their
// own party's places, not every agent's. In plain text every caller may do
// anything and counts only against the total.
type places struct {
	all      chan struct{}
	perParty int

	mu      sync.Mutex // guards parties
	parties map[string]*partyPlaces
}

// partyPlaces are one party's places and how many of its sends hold or
// wait for one (the record goes when none does).
type partyPlaces struct {
	held  chan struct{}
	users int
}

func newPlaces(all, perParty int) *places {
	return &places{all: make(chan struct{}, all), perParty: perParty, parties: map[string]*partyPlaces{}}
}

// take waits for one of party's places ("" when parties are not
// counted), then for one of all; release gives both back.
func (p *places) take(ctx context.Context, party string) (release func(), err error) {
	var mine *partyPlaces
	if party != "" {
		p.mu.Lock()
		mine = p.parties[party]
		if mine == nil {
			mine = &partyPlaces{held: make(chan struct{}, p.perParty)}
			p.parties[party] = mine
		}
		mine.users++
		p.mu.Unlock()
		select {
		case mine.held <- struct{}{}:
		case <-ctx.Done():
			p.leave(party, mine)
			return nil, ctx.Err()
		}
	}
	select {
	case p.all <- struct{}{}:
	case <-ctx.Done():
		if mine != nil {
			<-mine.held
			p.leave(party, mine)
		}
		return nil, ctx.Err()
	}
	return func() {
		<-p.all
		if mine != nil {
			<-mine.held
			p.leave(party, mine)
		}
	}, nil
}

func (p *places) leave(party string, mine *partyPlaces) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if mine.users--; mine.users == 0 {
		delete(p.parties, party)
	}
}
