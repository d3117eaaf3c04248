package lbtier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ProbeKey is one health-check URL: a node's address, a port and a path.
type ProbeKey struct {
	Addr netip.Addr
	Port uint16
	Path string
}

func (k ProbeKey) url() string {
	return "http://" + netip.AddrPortFrom(k.Addr, k.Port).String() + k.Path
}

// ProbeState is what the probes of one URL found.
type ProbeState struct {
	// Known: the URL has been probed at least once.
	Known bool
	Up    bool
	// Last is the last probe's outcome: the HTTP status code, or why
	// there was none ("connection refused", "timeout").
	Last string
}

// ProbeConfig is how a load balancer probes: every Interval, each probe
// given Timeout; Rise successes in a row bring a target up and Fall
// failures in a row take it down. The first probe of a new target decides
// at once, so a new service is not held back by Rise intervals.
type ProbeConfig struct {
	Interval, Timeout time.Duration
	Rise, Fall        int
}

// Prober probes every URL it is given and tells OnChange when one goes
// up or down.
type Prober struct {
	cfg      ProbeConfig
	client   *http.Client
	onChange func()

	mu     sync.Mutex
	probes map[ProbeKey]*probe
}

type probe struct {
	stop    context.CancelFunc
	verdict riseFall
}

// riseFall is a target's verdict from its probes' outcomes, as a load
// balancer keeps it: the first outcome decides; then rise successes in a
// row bring the target up and fall failures in a row take it down.
type riseFall struct {
	rise, fall int
	succ, fail int
	state      ProbeState
}

// observe takes one probe's outcome and reports whether the target came
// up, went down or became known.
func (r *riseFall) observe(ok bool, outcome string) (changed bool) {
	before := r.state
	r.state.Last = outcome
	if ok {
		r.succ, r.fail = r.succ+1, 0
	} else {
		r.succ, r.fail = 0, r.fail+1
	}
	switch {
	case !r.state.Known:
		r.state.Known, r.state.Up = true, ok
	case ok && r.succ >= r.rise:
		r.state.Up = true
	case !ok && r.fail >= r.fall:
		r.state.Up = false
	}
	return before.Known != r.state.Known || before.Up != r.state.Up
}

// NewProber probes with cfg; onChange must return quickly.
func NewProber(cfg ProbeConfig, onChange func()) *Prober {
	// A new connection per probe, as a load balancer's probe: a node
	// that stopped accepting connections must fail.
	tr := &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: cfg.Timeout}).DialContext}
	return &Prober{cfg: cfg, onChange: onChange, probes: map[ProbeKey]*probe{},
		client: &http.Client{Timeout: cfg.Timeout, Transport: tr}}
}

// Set makes keys the probed URLs: new ones start at once, missing ones
// stop.
func (p *Prober) Set(keys map[ProbeKey]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, pr := range p.probes {
		if !keys[k] {
			pr.stop()
			delete(p.probes, k)
		}
	}
	for k := range keys {
		if _, ok := p.probes[k]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		pr := &probe{stop: cancel, verdict: riseFall{rise: p.cfg.Rise, fall: p.cfg.Fall}}
		p.probes[k] = pr
		go p.run(ctx, k, pr)
	}
}

// State is what the probes of k found so far.
func (p *Prober) State(k ProbeKey) ProbeState {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr, ok := p.probes[k]; ok {
		return pr.verdict.state
	}
	return ProbeState{}
}

// Stop ends every probe.
func (p *Prober) Stop() { p.Set(nil) }

func (p *Prober) run(ctx context.Context, k ProbeKey, pr *probe) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		ok, outcome := p.once(ctx, k)
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		changed := pr.verdict.observe(ok, outcome)
		p.mu.Unlock()
		if changed {
			p.onChange()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// once probes k: up only on 200, as kube-proxy's health answers mean it.
func (p *Prober) once(ctx context.Context, k ProbeKey) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url(), nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := p.client.Do(req)
	if err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return false, "connection refused"
		case errors.As(err, &ne) && ne.Timeout():
			return false, "timeout"
		}
		return false, fmt.Sprint(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, strconv.Itoa(resp.StatusCode)
}
