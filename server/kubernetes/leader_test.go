package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/kubernetes"
)

// fastElection is a Lease with short timings, for tests.
func fastElection(identity string) kubernetes.LeaderElection {
	return kubernetes.LeaderElection{
		Namespace: "default", Name: kubernetes.LeaseName, Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond,
		Log: slog.New(slog.DiscardHandler),
	}
}

// leaders records what the participants' jobs do.
type leaders struct {
	mu      sync.Mutex
	leading []string // who runs the job now
	events  []string // "a started", "a stopped", in order
	twice   []string // moments two jobs ran at once
}

// job is a participant's job: it runs until its context ends, then takes
// stopDelay to stop, as assignment finishing a write would.
func (l *leaders) job(id string, stopDelay time.Duration) func(context.Context) {
	return func(ctx context.Context) {
		l.mu.Lock()
		l.leading = append(l.leading, id)
		if len(l.leading) > 1 {
			l.twice = append(l.twice, strings.Join(l.leading, ", "))
		}
		l.events = append(l.events, id+" started")
		l.mu.Unlock()
		<-ctx.Done()
		time.Sleep(stopDelay)
		l.mu.Lock()
		l.leading = slices.DeleteFunc(l.leading, func(s string) bool { return s == id })
		l.events = append(l.events, id+" stopped")
		l.mu.Unlock()
	}
}

// leader is the one participant whose job runs, or an error.
func (l *leaders) leader() (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leading) != 1 {
		return "", fmt.Errorf("leading: %v", l.leading)
	}
	return l.leading[0], nil
}

func (l *leaders) history() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func (l *leaders) checkNeverTwo(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.twice) > 0 {
		t.Errorf("two jobs ran at once: %v (events %v)", l.twice, l.events)
	}
}

// participant runs RunLeased until stop is called, which returns once
// RunLeased has.
type participant struct {
	stop func()
	err  error
}

func join(kc clientset.Interface, le kubernetes.LeaderElection, job func(context.Context)) *participant {
	ctx, cancel := context.WithCancel(context.Background())
	p := &participant{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.err = kubernetes.RunLeased(ctx, kc, le, job)
	}()
	p.stop = func() { cancel(); <-done }
	return p
}

func holder(kc clientset.Interface) (string, error) {
	lease, err := kc.CoordinationV1().Leases("default").Get(context.Background(), kubernetes.LeaseName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if lease.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *lease.Spec.HolderIdentity, nil
}

// TestLeaseHasOneLeaderAndHandsOverOnStop: of two replicas, exactly one
// runs the job; stopping it lets its job finish while it still holds the
// Lease, then releases it, and the other leads within a couple of seconds
// rather than after the Lease expires.
func TestLeaseHasOneLeaderAndHandsOverOnStop(t *testing.T) {
	_, kc := startCluster(t)
	var l leaders
	const stopDelay = 500 * time.Millisecond
	ps := map[string]*participant{
		"a": join(kc, fastElection("a"), l.job("a", stopDelay)),
		"b": join(kc, fastElection("b"), l.job("b", stopDelay)),
	}
	defer func() {
		for _, p := range ps {
			p.stop()
		}
	}()

	var first string
	eventually(t, "one participant leads", func() (err error) {
		first, err = l.leader()
		return err
	})
	// Several renewals later, still the same one, alone.
	time.Sleep(1500 * time.Millisecond)
	if got, err := l.leader(); err != nil || got != first {
		t.Fatalf("after 1.5 s the leader is %q (%v), want %q still", got, err, first)
	}
	if h, err := holder(kc); err != nil || h != first {
		t.Fatalf("the Lease's holder is %q (%v), want %q", h, err, first)
	}
	second := map[string]string{"a": "b", "b": "a"}[first]

	stopped := time.Now()
	ps[first].stop()
	if took := time.Since(stopped); took < stopDelay {
		t.Errorf("RunLeased returned %v after its context ended, before its job could have (%v)", took, stopDelay)
	}
	if h := l.history(); !slices.Contains(h, first+" stopped") {
		t.Errorf("RunLeased returned before its job: events %v", h)
	}
	delete(ps, first)
	eventually(t, "the other participant leads", func() error {
		got, err := l.leader()
		if err == nil && got != second {
			err = fmt.Errorf("leader %s", got)
		}
		return err
	})
	if took := time.Since(stopped); took > stopDelay+1500*time.Millisecond {
		t.Errorf("the other participant led %v after the leader was stopped: the Lease was not released", took)
	}
	l.checkNeverTwo(t)
	want := []string{first + " started", first + " stopped", second + " started"}
	if diff := strings.Join(l.history(), "; "); diff != strings.Join(want, "; ") {
		t.Errorf("events %q, want %q", diff, strings.Join(want, "; "))
	}
	for id, p := range ps {
		p.stop()
		if p.err != nil {
			t.Errorf("%s: %v", id, p.err)
		}
	}
	ps = nil
}

// TestLeaderThatLosesTheLeaseStopsItsJob: when another identity takes the
// Lease (a replica that could not renew in time, say), the leader's job is
// stopped within the renew deadline, and runs again once the Lease is
// free.
func TestLeaderThatLosesTheLeaseStopsItsJob(t *testing.T) {
	_, kc := startCluster(t)
	var l leaders
	p := join(kc, fastElection("a"), l.job("a", 0))
	defer p.stop()
	eventually(t, "a leads", func() error { _, err := l.leader(); return err })

	ctx := context.Background()
	lease, err := kc.CoordinationV1().Leases("default").Get(ctx, kubernetes.LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	intruder := "intruder"
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.AcquireTime = &intruder, &now, &now
	if _, err := kc.CoordinationV1().Leases("default").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	eventually(t, "a's job stopped", func() error {
		if h := l.history(); !slices.Contains(h, "a stopped") {
			return fmt.Errorf("events %v", h)
		}
		return nil
	})
	if took := time.Since(taken); took > 2*time.Second {
		t.Errorf("a's job stopped %v after the Lease was taken, want within the renew deadline (1 s) and a retry", took)
	}
	if h, err := holder(kc); err != nil || h != intruder {
		t.Errorf("while a's job is stopped the Lease's holder is %q (%v), want %q", h, err, intruder)
	}
	// The intruder never renews: a takes the Lease back once it expires.
	eventually(t, "a leads again", func() error {
		if h := l.history(); len(h) != 3 {
			return fmt.Errorf("events %v", h)
		}
		return nil
	})
	want := []string{"a started", "a stopped", "a started"}
	if got := l.history(); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	p.stop()
	if p.err != nil {
		t.Error(p.err)
	}
}

func TestLeaderElectionTimingsChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		le   kubernetes.LeaderElection
		ok   bool
	}{
		{"defaults", kubernetes.LeaderElection{}, true},
		{"short", fastElection("a"), true},
		{"lease not longer than the renew deadline", kubernetes.LeaderElection{LeaseDuration: 10 * time.Second, RenewDeadline: 10 * time.Second}, false},
		{"renew deadline within a retry", kubernetes.LeaderElection{RenewDeadline: 2 * time.Second, RetryPeriod: 2 * time.Second}, false},
		{"negative retry", kubernetes.LeaderElection{RetryPeriod: -time.Second}, false},
	} {
		if err := tc.le.Check(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
