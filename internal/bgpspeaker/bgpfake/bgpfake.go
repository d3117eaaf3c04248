// Package bgpfake is a BGP speaker for unit tests: it records every
// announce and withdraw in order, keeps the routes they leave, and refuses
// them while told to.
package bgpfake

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"

	"github.com/weirlb/weir/internal/bgpspeaker"
)

// Recorder records what it is told to announce and withdraw.
type Recorder struct {
	mu     sync.Mutex
	calls  []string
	routes map[Path]bgpspeaker.Announcement
	fail   bool
}

// Path is one path of a prefix (ADD-PATH: by path ID).
type Path struct {
	Prefix netip.Prefix
	PathID uint32
}

// ErrRefused is what a Recorder told to fail answers.
var ErrRefused = errors.New("bgpfake: refused")

// Fail makes every later announce and withdraw fail (true) or succeed.
func (r *Recorder) Fail(fail bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = fail
}

func (r *Recorder) Announce(_ context.Context, p netip.Prefix, a bgpspeaker.Announcement) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return ErrRefused
	}
	if r.routes == nil {
		r.routes = map[Path]bgpspeaker.Announcement{}
	}
	r.routes[Path{p, a.PathID}] = a
	r.calls = append(r.calls, fmt.Sprintf("announce %s via %s weight %d", p, a.NextHop, a.Weight))
	return nil
}

func (r *Recorder) Withdraw(_ context.Context, p netip.Prefix, a bgpspeaker.Announcement) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return ErrRefused
	}
	delete(r.routes, Path{p, a.PathID})
	r.calls = append(r.calls, fmt.Sprintf("withdraw %s via %s", p, a.NextHop))
	return nil
}

func (r *Recorder) Sessions(context.Context) ([]bgpspeaker.Session, error) { return nil, nil }

// Calls returns the announces and withdraws since the last call, in
// order ("announce 203.0.113.7/32 via 192.0.2.11 weight 2", "withdraw
// 203.0.113.7/32 via 192.0.2.11"), and forgets them.
func (r *Recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

// Routes is what the announces and withdraws left announced.
func (r *Recorder) Routes() map[Path]bgpspeaker.Announcement {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.routes)
}
