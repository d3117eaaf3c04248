package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the coordination.k8s.io Lease that server replicas in a
// cluster elect their leader with.
const LeaseName = "weir-server"

// DefaultNamespace is where the Lease is when the server does not run in a
// pod: the namespace of deploy/kubernetes.
const DefaultNamespace = "weir-system"

// podNamespaceFile is where Kubernetes tells a pod its namespace.
const podNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// LeaderElection is how the server replicas of one cluster elect the one
// that writes to it. Each replica mirrors the cluster into a registry of
// its own, so only the writes back (Services' load-balancer status) must
// happen once: kube-controller-manager's Lease, with its timings.
type LeaderElection struct {
	// Namespace and Name are the Lease's (default PodNamespace() and
	// LeaseName).
	Namespace, Name string
	// Identity names this replica in the Lease (default Identity()); no
	// two replicas may share it.
	Identity string
	// LeaseDuration is how long a replica that died keeps the Lease,
	// RenewDeadline how long the leader tries to renew it before it gives
	// up leading, RetryPeriod how often every replica tries (defaults:
	// 15 s, 10 s and 2 s, as Kubernetes components).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       *slog.Logger
}

// PodNamespace is the namespace of the pod the server runs in, or
// DefaultNamespace outside a pod.
func PodNamespace() string {
	data, err := os.ReadFile(podNamespaceFile)
	if ns := strings.TrimSpace(string(data)); err == nil && ns != "" {
		return ns
	}
	return DefaultNamespace
}

// Identity names this process in the Lease: the pod's name (its host
// name) and a random suffix, so that a pod restarted under the same name
// is not taken for its predecessor, which may still hold the Lease.
func Identity() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return host + "_" + hex.EncodeToString(b)
}

func (le LeaderElection) withDefaults() LeaderElection {
	if le.Namespace == "" {
		le.Namespace = PodNamespace()
	}
	if le.Name == "" {
		le.Name = LeaseName
	}
	if le.Identity == "" {
		le.Identity = Identity()
	}
	if le.LeaseDuration == 0 {
		le.LeaseDuration = 15 * time.Second
	}
	if le.RenewDeadline == 0 {
		le.RenewDeadline = 10 * time.Second
	}
	if le.RetryPeriod == 0 {
		le.RetryPeriod = 2 * time.Second
	}
	if le.Log == nil {
		le.Log = slog.New(slog.DiscardHandler)
	}
	return le
}

// Check says whether the timings can work: the Lease outlasts the
// leader's attempts to renew it, which outlast one retry.
func (le LeaderElection) Check() error {
	le = le.withDefaults()
	switch {
	case le.RetryPeriod < 0:
		return fmt.Errorf("leader election: the retry period %v is negative", le.RetryPeriod)
	case le.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(le.RetryPeriod)):
		return fmt.Errorf("leader election: the renew deadline %v must be longer than %v times the retry period %v", le.RenewDeadline, leaderelection.JitterFactor, le.RetryPeriod)
	case le.LeaseDuration <= le.RenewDeadline:
		return fmt.Errorf("leader election: the lease duration %v must be longer than the renew deadline %v", le.LeaseDuration, le.RenewDeadline)
	}
	return nil
}

// RunLeased runs job while this replica holds the Lease, again each time
// it takes it, until ctx ends. job's context ends when the Lease is lost
// or ctx ends, and RunLeased tries for the Lease again, or returns, only
// once job has returned. When ctx ends the Lease is held until job has
// returned and then released, so that another replica takes it at once
// rather than after LeaseDuration. It fails only on a bad configuration.
func RunLeased(ctx context.Context, client clientset.Interface, cfg LeaderElection, job func(context.Context)) error {
	cfg = cfg.withDefaults()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	cfg.Log = cfg.Log.With("lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
	for ctx.Err() == nil {
		if err := runTerm(ctx, cfg, lock, job); err != nil {
			return err
		}
	}
	return nil
}

// runTerm tries for the Lease and, once it holds it, runs job until the
// Lease is lost or ctx ends.
func runTerm(ctx context.Context, cfg LeaderElection, lock resourcelock.Interface, job func(context.Context)) error {
	// The elector has a context of its own, ended only once job has
	// returned: it keeps renewing the Lease while job stops, and releases
	// it after (client-go releases as soon as its context ends).
	electing, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	t := &term{}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				cfg.Log.Info("took the lease: leading")
				t.run(ctx, leading, job)
			},
			OnStoppedLeading: t.end,
			OnNewLeader:      func(id string) { cfg.Log.Info("leader elected", "leader", id) },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		le.Run(electing)
	}()
	select {
	case <-ended: // the Lease was lost, and job has returned (t.end)
		if ctx.Err() == nil {
			cfg.Log.Warn("lost the lease: stopped leading")
		}
	case <-ctx.Done():
		t.end()
		stopElecting()
		<-ended
	}
	return nil
}

// term is one stretch of holding the Lease. client-go starts job in a
// goroutine of its own and may end the term before that goroutine runs,
// so whichever comes second of run and end decides: a job that started is
// waited for, one that did not never starts.
type term struct {
	mu   sync.Mutex
	over bool          // end was called: job must not start
	done chan struct{} // closed when job returned; nil if it never started
}

// run runs job until the Lease is lost (leading ends) or ctx ends.
func (t *term) run(ctx, leading context.Context, job func(context.Context)) {
	t.mu.Lock()
	if t.over {
		t.mu.Unlock()
		return
	}
	t.done = make(chan struct{})
	t.mu.Unlock()
	defer close(t.done)
	jobCtx, cancel := context.WithCancel(leading)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	job(jobCtx)
}

// end stops the term and waits for its job, if it started, to return; the
// caller has ended, or is about to end, the job's context.
func (t *term) end() {
	t.mu.Lock()
	t.over = true
	done := t.done
	t.mu.Unlock()
	if done != nil {
		<-done
	}
}
