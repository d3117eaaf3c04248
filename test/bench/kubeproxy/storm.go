package main

// Storms, as test/bench/endtoend makes them for Weir: endpoint changes at
// a steady rate, or a burst, handed to the proxier as its informers would,
// while it syncs as kube-proxy's loop does: a sync as soon as changes are
// pending, at most once per minSyncPeriod.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	discovery "k8s.io/api/discovery/v1"
)

type stormPhase struct {
	rate  int
	dur   time.Duration
	burst int
}

func (p stormPhase) String() string {
	if p.rate == 0 {
		return fmt.Sprintf("a burst of %d changes", p.burst)
	}
	return fmt.Sprintf("%d changes/s for %v", p.rate, p.dur)
}

func parseStorms(rates string, dur time.Duration, burst int) ([]stormPhase, error) {
	var phases []stormPhase
	for f := range strings.SplitSeq(rates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.Atoi(f)
		if err != nil || r < 1 {
			return nil, fmt.Errorf("-storm %q: rates are positive numbers of changes a second", rates)
		}
		phases = append(phases, stormPhase{rate: r, dur: dur})
	}
	if len(phases) > 0 && dur <= 0 {
		return nil, errors.New("-storm-for: a positive duration")
	}
	if burst > 0 {
		phases = append(phases, stormPhase{burst: burst})
	}
	return phases, nil
}

const stormTick = 10 * time.Millisecond

// handed is a tick's changes, handed to the proxier at once.
type handed struct {
	at      time.Time
	changes int
}

// syncRun is one syncProxyRules.
type syncRun struct{ start, end time.Time }

// stormer hands the proxier endpoint changes: each moves the first
// endpoint of one service to its next generation, services round robin.
type stormer struct {
	current []*discovery.EndpointSlice
	gen     []int
	next    int
	update  func(old, updated *discovery.EndpointSlice)
}

func (s *stormer) change(n int) {
	for range n {
		i := s.next
		s.next = (s.next + 1) % len(s.current)
		s.gen[i]++
		old := s.current[i]
		updated := old.DeepCopy()
		updated.Endpoints[0].Addresses = []string{addr4(10, 192+s.gen[i]%64, i>>8, i).String()}
		s.current[i] = updated
		s.update(old, updated)
	}
}

// cpuTime is this process's CPU and its waited-for children's (the nft
// processes kube-proxy runs).
func cpuTime() (self, children time.Duration) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		children = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return self, children
}

// runStorm runs one phase: a goroutine hands the changes over every tick
// while this one syncs, each sync starting once changes are pending and
// minSync after the previous one started; it returns when every change
// is synced. syncOnce runs one syncProxyRules and reports its error.
func runStorm(p stormPhase, s *stormer, minSync time.Duration, syncOnce func() error) ([]handed, []syncRun, error) {
	var (
		mu      sync.Mutex
		batches []handed
		pending bool
	)
	total := p.burst
	if p.rate > 0 {
		total = int(int64(p.rate) * int64(p.dur) / int64(time.Second))
	}
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		start := time.Now()
		done := 0
		for done < total {
			due := total
			if p.rate > 0 {
				due = min(total, int(int64(p.rate)*int64(time.Since(start))/int64(time.Second)))
			}
			if n := due - done; n > 0 {
				s.change(n)
				mu.Lock()
				batches = append(batches, handed{time.Now(), n})
				pending = true
				mu.Unlock()
				done = due
			}
			time.Sleep(stormTick - time.Since(start)%stormTick)
		}
	}()
	var runs []syncRun
	var last time.Time
	for {
		mu.Lock()
		due := pending
		pending = false
		mu.Unlock()
		if !due {
			select {
			case <-fed:
				mu.Lock()
				due = pending
				mu.Unlock()
				if !due {
					return batches, runs, nil
				}
			case <-time.After(time.Millisecond):
				continue
			}
		}
		if wait := minSync - time.Since(last); wait > 0 {
			time.Sleep(wait)
		}
		mu.Lock()
		pending = false // what comes until here is in this sync
		mu.Unlock()
		last = time.Now()
		if err := syncOnce(); err != nil {
			return nil, nil, err
		}
		runs = append(runs, syncRun{last, time.Now()})
	}
}

// lags is each change's lag: from its hand-over to the end of the first
// sync that started after it (an upper bound by at most that sync: a sync
// takes what is pending when it reads the changes, a little after it
// starts).
func lagsOf(batches []handed, runs []syncRun) (p50, p99, max time.Duration) {
	type lag struct {
		d time.Duration
		n int
	}
	var all []lag
	total := 0
	for _, b := range batches {
		i, _ := slices.BinarySearchFunc(runs, b.at, func(r syncRun, t time.Time) int { return r.start.Compare(t) })
		if i == len(runs) {
			continue // cannot happen: the last sync starts after the last hand-over
		}
		all = append(all, lag{runs[i].end.Sub(b.at), b.changes})
		total += b.changes
	}
	slices.SortFunc(all, func(a, b lag) int { return cmp.Compare(a.d, b.d) })
	q := func(f float64) time.Duration {
		seen := 0
		for _, l := range all {
			if seen += l.n; float64(seen) >= f*float64(total) {
				return l.d
			}
		}
		return all[len(all)-1].d
	}
	return q(0.5), q(0.99), q(1)
}

func reportStorm(p stormPhase, minSync time.Duration, batches []handed, runs []syncRun, took time.Duration, cpuSelf, cpuChildren time.Duration) {
	changes := 0
	for _, b := range batches {
		changes += b.changes
	}
	var syncs []time.Duration
	for _, r := range runs {
		syncs = append(syncs, r.end.Sub(r.start))
	}
	slices.Sort(syncs)
	p50, p99, worst := lagsOf(batches, runs)
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	fmt.Printf("\n%v (min-sync-period %v): %d changes handed over and synced in %v (%.0f changes/s)\n",
		p, minSync, changes, r(took), float64(changes)/took.Seconds())
	fmt.Printf("  each change's lag, from its hand-over to the end of the sync that took it: p50 %v  p99 %v  max %v\n", r(p50), r(p99), r(worst))
	fmt.Printf("  %d syncs: p50 %v  max %v\n", len(runs), r(syncs[len(syncs)/2]), r(syncs[len(syncs)-1]))
	per := func(d time.Duration) time.Duration {
		return (d / time.Duration(max(1, changes))).Round(10 * time.Nanosecond)
	}
	fmt.Printf("  CPU per change: %v in this process (the proxier, and the handing over), %v in its nft processes (%v and %v in all)\n",
		per(cpuSelf), per(cpuChildren), r(cpuSelf), r(cpuChildren))
}
