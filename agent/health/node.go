// Package health answers load balancers' questions about this node, with
// kube-proxy's exact contract: the per-service health-check node ports (200
// while the node has a ready local endpoint, 503 without) and the node's own
// /healthz and /livez.
package health

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Node tracks whether the agent keeps the kernel in step with what it was
// told, as kube-proxy's proxier health does: it is healthy unless an update
// has been waiting longer than the timeout, and eligible unless the node is
// being deleted.
type Node struct {
	timeout time.Duration
	now     func() time.Time
	healthz *prometheus.CounterVec
	livez   *prometheus.CounterVec

	mu          sync.Mutex  // guards the fields below
	ready       func() bool // more that /readyz waits for; nil: nothing
	lastUpdated time.Time   // last successful apply
	oldestQueue time.Time   // oldest update not yet applied; zero when none
	eligible    bool
}

// NewNode returns a tracker that is unhealthy until the first update is
// applied. Counters are registered with reg when it is not nil.
func NewNode(timeout time.Duration, reg prometheus.Registerer) *Node {
	n := &Node{
		timeout:  timeout,
		now:      time.Now,
		eligible: true,
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_proxy_healthz_total", Help: "Answers of /healthz, by HTTP code.",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_proxy_livez_total", Help: "Answers of /livez, by HTTP code.",
		}, []string{"code"}),
	}
	// The codes answered exist from the start, at 0, so that rate()
	// sees the first answers.
	for _, code := range []string{"200", "503"} {
		n.healthz.WithLabelValues(code)
		n.livez.WithLabelValues(code)
	}
	if reg != nil {
		reg.MustRegister(n.healthz, n.livez)
	}
	n.oldestQueue = n.now()
	return n
}

// Queued records that an update arrived and is not applied yet.
func (n *Node) Queued() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.oldestQueue.IsZero() {
		n.oldestQueue = n.now()
	}
}

// Updated records that every queued update is applied.
func (n *Node) Updated() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lastUpdated, n.oldestQueue = n.now(), time.Time{}
}

// SetEligible records whether the node should receive traffic at all.
func (n *Node) SetEligible(eligible bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.eligible = eligible
}

// SetReady adds what /readyz waits for besides a first apply (the BGP
// sessions, say).
func (n *Node) SetReady(ready func() bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ready = ready
}

// Ready reports whether a rollout may go on to the next node: a state was
// applied, the agent is healthy, and what SetReady gave says yes. Unlike
// /healthz (kube-proxy's, healthy from the start until an update waits too
// long), it is false until the first apply.
func (n *Node) Ready() bool {
	n.mu.Lock()
	ready := n.ready
	n.mu.Unlock()
	st := n.Status()
	return st.Healthy && !st.LastUpdated.IsZero() && (ready == nil || ready())
}

// Status is the node's health right now.
type Status struct {
	LastUpdated  time.Time
	CurrentTime  time.Time
	Healthy      bool
	NodeEligible bool
}

// Status reports the node's health.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	return Status{
		LastUpdated:  n.lastUpdated,
		CurrentTime:  now,
		Healthy:      n.oldestQueue.IsZero() || now.Sub(n.oldestQueue) < n.timeout,
		NodeEligible: n.eligible,
	}
}

// Healthy reports whether the agent is programming successfully.
func (n *Node) Healthy() bool { return n.Status().Healthy }

// Codes are the HTTP codes /healthz and /livez answer now.
func (n *Node) Codes() (healthz, livez int) {
	st := n.Status()
	return code(st.Healthy && st.NodeEligible), code(st.Healthy)
}

func code(ok bool) int {
	if ok {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// familyStatus is one family's part of the answer; both families are
// programmed together, so they share their state.
type familyStatus struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// answer is kube-proxy's /healthz and /livez body; nodeEligible is in
// /healthz's only, as in kube-proxy (a pointer, nil for /livez).
type answer struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]familyStatus `json:"status"`
}

// Handler serves /healthz (healthy and eligible), /livez (healthy) and
// /readyz (Ready).
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(counter *prometheus.CounterVec, needEligible bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			st := n.Status()
			ok := st.Healthy && (st.NodeEligible || !needEligible)
			fam := familyStatus{LastUpdated: st.LastUpdated, Healthy: st.Healthy}
			a := answer{
				LastUpdated: st.LastUpdated, CurrentTime: st.CurrentTime, Healthy: st.Healthy,
				Status: map[string]familyStatus{"IPv4": fam, "IPv6": fam},
			}
			if needEligible {
				a.NodeEligible = &st.NodeEligible
			}
			body, _ := json.Marshal(a)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code(ok))
			w.Write(body)
			counter.WithLabelValues(strconv.Itoa(code(ok))).Inc()
		}
	}
	mux.Handle("/healthz", serve(n.healthz, true))
	mux.Handle("/livez", serve(n.livez, false))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !n.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}
