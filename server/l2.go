package server

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// leadL2 decides the L2 owners while this server leads: it answers the
// nodes' lease streams (l2owner.Owners) and gives it, at every change of
// the registry or of a node's status, each L2 address's candidates
// (receive.L2Addresses).
func (s *Server) leadL2(ctx context.Context) {
	done, heard := make(chan struct{}), make(chan struct{})
	go func() { s.l2.Lead(ctx, heard); close(done) }()
	defer func() { <-done }()
	s.awaitNodes(ctx, L2WarmUp)
	close(heard)
	for {
		statusChanged := s.Agents.StatusChanged()
		s.l2.SetCandidates(s.l2Candidates())
		// A node's status changes with every state it is sent and
		// applies: computations are L2Period apart at least, so a burst
		// of changes costs one more, while a lone change after a quiet
		// spell is taken at once (a change made meanwhile is already
		// signalled). A failing owner is seen sooner by its lease stream
		// (Owners).
		select {
		case <-ctx.Done():
			return
		case <-time.After(L2Period):
		}
		select {
		case <-ctx.Done():
			return
		case <-s.l2InputChanged:
		case <-statusChanged:
		}
	}
}

// L2Period is the least time between two computations of the L2
// candidates.
var L2Period = 50 * time.Millisecond

// L2WarmUp bounds how long a server that starts leading waits to hear
// from every node before it decides L2 owners.
var L2WarmUp = 10 * time.Second

// awaitNodes returns once every registered node's agent is connected, has
// applied a state and, where L2 addresses exist, has asked for its leases
// (and so said which it held), or after at most within: a server that has
// not heard from the nodes would take addresses from those that hold them.
// Meanwhile the owners keep theirs (l2owner.Owners.Lead).
func (s *Server) awaitNodes(ctx context.Context, within time.Duration) {
	timeout := time.After(within)
	poll := time.NewTicker(50 * time.Millisecond) // the lease streams have no signal of their own
	defer poll.Stop()
	for {
		changed := s.Agents.StatusChanged()
		// The addresses bound what the nodes may claim meanwhile.
		candidates := s.l2Candidates()
		s.l2.SetCandidates(candidates)
		l2 := len(candidates) > 0
		ready := map[string]bool{}
		for _, n := range s.Agents.Status() {
			ready[n.Node] = n.Connected && n.AppliedVersion > 0 && (!l2 || s.l2.Asked(n.Node))
		}
		var waiting []string
		s.Registry.Read(func(v registry.View) {
			for _, name := range v.NodeNames() {
				if !ready[name] {
					waiting = append(waiting, name)
				}
			}
		})
		if len(waiting) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-timeout:
			s.log.Warn("deciding L2 owners without having heard from every node", "waiting_for", waiting)
			return
		case <-changed:
		case <-poll.C:
		}
	}
}

// watchRegistry has l2InputChanged signalled after every write of what
// the L2 candidates are worked out from in the registry: a service's own
// object, a node or its drain, a pool. Not after an endpoint slice's: the
// endpoints a node has reach the candidates through its agent's report,
// a change of its status.
func (s *Server) watchRegistry() {
	s.l2InputChanged = make(chan struct{}, 1)
	s.Registry.OnChange(func(ch registry.Change) {
		if len(ch.ServiceObjects) == 0 && len(ch.Nodes) == 0 && len(ch.Pools) == 0 {
			return
		}
		select {
		case s.l2InputChanged <- struct{}{}:
		default:
		}
	})
}

// l2Candidates are the candidates of every L2 address now.
func (s *Server) l2Candidates() map[netip.Addr][]string {
	pools, _ := s.Registry.Pools.List("", nil)
	if !slices.ContainsFunc(pools, func(p *model.AddressPool) bool { return p.L2 != nil }) {
		return nil
	}
	nodes, _ := s.Registry.Nodes.List("", nil)
	// Only a load balancer has L2 addresses: the other services are
	// not looked at, however many there are.
	var services []*model.Service
	s.Registry.Read(func(v registry.View) { services = v.LoadBalancerServices() })
	return receive.L2Addresses(receive.Cluster{Nodes: nodes, Pools: pools, Services: services, Observed: s.Agents.Status(), Aside: s.Registry.Aside})
}
