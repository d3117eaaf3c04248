package health

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
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

	mu sync.Mutex // guards the fields below
	// services are the services to report, by "namespace/name"; unsent
	// those that may differ from what was reported last, and verdictWas
	// the proxy health and drain the last report's codes came from.
	services   map[string]report.ServiceReport
	reported   map[string]report.ServiceReport
	unsent     map[string]bool
	verdictWas [2]bool
	lastNode   report.NodeReport
	lastSync   time.Duration
	// addrs and checks are the latest desired health checks; served is
	// the local ready count each port answers with, and rising the checks
	// whose served count waits for an apply to rise. A count only drops
	// before the rules are applied: a balancer must hear at once that a
	// node lost its endpoints, but not that it gained one whose rules are
	// not in yet.
	addrs  []netip.Addr
	checks map[string]Service
	served map[string]int
	rising map[string]bool
}

// NewAgent returns the node's health with the given staleness timeout; its
// health-check node ports hold connections within limits.
func NewAgent(timeout time.Duration, limits Limits, log *slog.Logger, reg prometheus.Registerer) *Agent {
	a := &Agent{Node: NewNode(timeout, reg),
		services: map[string]report.ServiceReport{}, reported: map[string]report.ServiceReport{}, unsent: map[string]bool{},
		checks: map[string]Service{}, served: map[string]int{}, rising: map[string]bool{}}
	a.Services = NewServices(a.Node.Healthy, limits, log, reg)
	return a
}

// Received takes a new desired state, before it is applied: health-check
// answers follow it at once. Only the services st.Changed names are looked
// at (every one when it is nil): the others' answers stay as they are.
func (a *Agent) Received(st datapath.NodeState) {
	a.Node.Queued()
	// A node going away, or drained by an operator, takes no new external
	// traffic: /healthz fails, and so does every health-check port.
	a.Node.SetEligible(!st.Node.Deleting && !st.Node.Drained)
	a.Services.SetDrained(st.Node.Drained)
	a.mu.Lock()
	defer a.mu.Unlock()
	changed := st.Changed
	if changed == nil {
		// Every service, and those that went.
		changed = slices.Collect(maps.Keys(st.Services))
		for key := range a.services {
			if k, ok := parseKey(key); ok {
				if _, now := st.Services[k]; !now {
					changed = append(changed, k)
				}
			}
		}
	}
	var set []Service
	var gone []string
	for _, key := range changed {
		name := key.String()
		svc := st.Services[key]
		var r report.ServiceReport
		if svc != nil {
			r = localCounts(svc)
			r.Namespace, r.Name = key.Namespace, key.Name
		}
		a.unsent[name] = true
		if svc != nil && svc.ExternalTrafficPolicy == datapath.Local && svc.HealthCheckNodePort != 0 {
			r.HealthCheckNodePort = svc.HealthCheckNodePort
			c := Service{Namespace: key.Namespace, Name: key.Name, Port: svc.HealthCheckNodePort, LocalReady: r.LocalReady}
			a.checks[name] = c
			// Counts may drop now, never rise before the rules are in.
			a.served[name] = min(c.LocalReady, a.served[name])
			if a.served[name] < c.LocalReady {
				a.rising[name] = true
			} else {
				delete(a.rising, name)
			}
			c.LocalReady = a.served[name]
			set = append(set, c)
		} else if _, had := a.checks[name]; had {
			delete(a.checks, name)
			delete(a.served, name)
			delete(a.rising, name)
			gone = append(gone, name)
		}
		if r.LocalReady+r.LocalServing+r.LocalTerminating > 0 || r.HealthCheckNodePort != 0 {
			a.services[name] = r
		} else {
			delete(a.services, name)
		}
	}
	a.addrs = nonLoopback(st.Node.Addresses)
	a.updateChecks(set, gone)
}

// parseKey is the service key of "namespace/name".
func parseKey(s string) (datapath.ServiceKey, bool) {
	ns, name, ok := strings.Cut(s, "/")
	return datapath.ServiceKey{Namespace: ns, Name: name}, ok
}

// Applied records a successful apply and how long it took: every
// health-check port now answers from the applied state.
func (a *Agent) Applied(took time.Duration) {
	a.Node.Updated()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastSync = took
	var set []Service
	for name := range a.rising {
		c := a.checks[name]
		a.served[name] = c.LocalReady
		a.unsent[name] = true
		set = append(set, c)
	}
	// New maps, not cleared ones: a cleared map keeps its size, and
	// walking it would cost every service a whole state once named.
	a.rising = map[string]bool{}
	a.updateChecks(set, nil)
}

// updateChecks opens, closes and updates the listeners of the services
// named, and notes the results in their reports. Called with mu held.
func (a *Agent) updateChecks(set []Service, gone []string) {
	for name, res := range a.Services.Update(a.addrs, set, gone) {
		r, ok := a.services[name]
		if !ok {
			continue
		}
		r.HealthCheckError = ""
		if res.Err != nil {
			r.HealthCheckError = res.Err.Error()
		}
		a.services[name] = r
		a.unsent[name] = true
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
	drained := a.Services.drained.Load()
	if a.verdictWas != [2]bool{st.Healthy, drained} {
		// Every health-check code may have changed.
		for name := range a.checks {
			a.unsent[name] = true
		}
		a.verdictWas = [2]bool{st.Healthy, drained}
	}
	look := maps.Keys(a.unsent)
	if full {
		a.reported = map[string]report.ServiceReport{}
		look = maps.Keys(a.services)
	}
	for key := range look {
		s, ok := a.services[key]
		if !ok {
			if _, was := a.reported[key]; was {
				r.Removed = append(r.Removed, key)
				delete(a.reported, key)
			}
			continue
		}
		if s.HealthCheckNodePort != 0 && s.HealthCheckError == "" {
			s.HealthCheckCode = Verdict(a.served[key], st.Healthy, drained)
		}
		if old, ok := a.reported[key]; !ok || old != s {
			r.Services = append(r.Services, s)
			a.reported[key] = s
		}
	}
	a.unsent = map[string]bool{} // new, not cleared: see Applied
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
