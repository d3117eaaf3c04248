package health

import (
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/weirlb/weir/internal/report"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirlb/weir/datapath"
)

// Agent is the node's health: it follows the desired state as it arrives
// (so that a balancer hears about a node losing its last endpoint before
// the rules are even rewritten) and the datapath's progress.
type Agent struct {
	Node     *Node
	Services *Services

	mu       sync.Mutex // guards the fields below
	services map[string]report.ServiceReport
	reported map[string]report.ServiceReport
	lastNode report.NodeReport
	lastSync time.Duration
	// addrs and checks are the latest desired health checks; served is
	// the local ready count each port answers with. A count only drops
	// before the rules are applied: a balancer must hear at once that a
	// node lost its endpoints, but not that it gained one whose rules are
	// not in yet.
	addrs  []netip.Addr
	checks []Service
	served map[string]int
}

// NewAgent returns the node's health with the given staleness timeout.
func NewAgent(timeout time.Duration, log *slog.Logger, reg prometheus.Registerer) *Agent {
	a := &Agent{Node: NewNode(timeout, reg), services: map[string]report.ServiceReport{}, served: map[string]int{}}
	a.Services = NewServices(a.Node.Healthy, log, reg)
	return a
}

// Received takes a new desired state, before it is applied: health-check
// answers follow it at once.
func (a *Agent) Received(st datapath.NodeState) {
	a.Node.Queued()
	// A node going away, or drained by an operator, takes no new external
	// traffic: /healthz fails, and so does every health-check port.
	a.Node.SetEligible(!st.Node.Deleting && !st.Node.Drained)
	a.Services.SetDrained(st.Node.Drained)
	reports := map[string]report.ServiceReport{}
	var checks []Service
	for key, svc := range st.Services {
		r := localCounts(svc)
		r.Namespace, r.Name = key.Namespace, key.Name
		if svc.ExternalTrafficPolicy == datapath.Local && svc.HealthCheckNodePort != 0 {
			r.HealthCheckNodePort = svc.HealthCheckNodePort
			checks = append(checks, Service{Namespace: key.Namespace, Name: key.Name, Port: svc.HealthCheckNodePort, LocalReady: r.LocalReady})
		}
		if r.LocalReady+r.LocalServing+r.LocalTerminating > 0 || r.HealthCheckNodePort != 0 {
			reports[key.String()] = r
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Counts may drop now, never rise before the rules are in; a service
	// the change does not touch keeps what it served.
	served := make(map[string]int, len(checks))
	for _, c := range checks {
		key := c.Namespace + "/" + c.Name
		served[key] = min(c.LocalReady, a.served[key])
	}
	a.addrs, a.checks, a.services = nonLoopback(st.Node.Addresses), checks, reports
	a.syncChecks(served)
}

// Applied records a successful apply and how long it took: every
// health-check port now answers from the applied state.
func (a *Agent) Applied(took time.Duration) {
	a.Node.Updated()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastSync = took
	served := make(map[string]int, len(a.checks))
	for _, c := range a.checks {
		served[c.Namespace+"/"+c.Name] = c.LocalReady
	}
	a.syncChecks(served)
}

// syncChecks opens, closes and updates the listeners, each answering with
// its service's count in served ("namespace/name"), which it keeps as the
// counts now served. Called with mu held.
func (a *Agent) syncChecks(served map[string]int) {
	checks := make([]Service, len(a.checks))
	for i, c := range a.checks {
		checks[i] = c
		checks[i].LocalReady = served[c.Namespace+"/"+c.Name]
	}
	a.served = served
	results := a.Services.Sync(a.addrs, checks)
	for key, r := range a.services {
		r.HealthCheckError = ""
		if res, ok := results[key]; ok && res.Err != nil {
			r.HealthCheckError = res.Err.Error()
		}
		a.services[key] = r
	}
}

// Report returns what changed since the last call (everything when full),
// or nil when nothing did.
func (a *Agent) Report(full bool) *report.Report {
	healthz, livez := a.Node.Codes()
	st := a.Node.Status()
	node := report.NodeReport{HealthzCode: healthz, LivezCode: livez, LastUpdated: st.LastUpdated, NodeEligible: st.NodeEligible}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := &report.Report{Full: full, Node: node, LastSync: a.lastSync}
	if full {
		a.reported = map[string]report.ServiceReport{}
	}
	for key, s := range a.services {
		if s.HealthCheckNodePort != 0 && s.HealthCheckError == "" {
			s.HealthCheckCode = Verdict(a.served[key], st.Healthy, a.Services.drained.Load())
		}
		if old, ok := a.reported[key]; !ok || old != s {
			r.Services = append(r.Services, s)
			a.reported[key] = s
		}
	}
	for key := range a.reported {
		if _, ok := a.services[key]; !ok {
			r.Removed = append(r.Removed, key)
			delete(a.reported, key)
		}
	}
	if !full && len(r.Services) == 0 && len(r.Removed) == 0 && node == a.lastNode {
		return nil
	}
	a.lastNode = node
	slices.SortFunc(r.Services, func(x, y report.ServiceReport) int {
		if x.Namespace+"/"+x.Name < y.Namespace+"/"+y.Name {
			return -1
		}
		return 1
	})
	slices.Sort(r.Removed)
	return r
}

// localCounts counts the service's endpoints on this node, by condition.
// An endpoint backing several ports, or with an address in each family,
// counts once per family; the larger family count is taken.
func localCounts(svc *datapath.Service) report.ServiceReport {
	var r report.ServiceReport
	for _, is6 := range []bool{false, true} {
		ready, serving, terminating := svc.LocalCounts(is6)
		r.LocalReady = max(r.LocalReady, ready)
		r.LocalServing = max(r.LocalServing, serving)
		r.LocalTerminating = max(r.LocalTerminating, terminating)
	}
	return r
}

func nonLoopback(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if !a.IsLoopback() {
			out = append(out, a)
		}
	}
	return out
}
