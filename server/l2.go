package server

import (
	"context"
	"net/netip"
	"slices"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// leadL2 decides the L2 owners while this server leads: it answers the
// nodes' lease streams (l2owner.Owners) and gives it, at every change of
// the registry or of a node's status, each L2 address's candidates
// (receive.L2Addresses).
func (s *Server) leadL2(ctx context.Context) {
	done := make(chan struct{})
	go func() { s.l2.Lead(ctx); close(done) }()
	defer func() { <-done }()
	for {
		statusChanged := s.Agents.StatusChanged()
		s.l2.SetCandidates(s.l2Candidates())
		select {
		case <-ctx.Done():
			return
		case <-s.registryChanged:
		case <-statusChanged:
		}
	}
}

// watchRegistry has registryChanged signalled after every write.
func (s *Server) watchRegistry() {
	s.registryChanged = make(chan struct{}, 1)
	s.Registry.OnChange(func(registry.Change) {
		select {
		case s.registryChanged <- struct{}{}:
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
	services, _ := s.Registry.Services.List("", nil)
	return receive.L2Addresses(receive.Cluster{Nodes: nodes, Pools: pools, Services: services, Observed: s.Agents.Status(), Drained: s.Registry.Drained})
}
