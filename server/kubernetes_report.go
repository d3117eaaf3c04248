package server

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// AnnouncePeriod is how often the leader looks at what the nodes do with
// each Kubernetes service's addresses, and AnnounceSettle how long a
// change must hold before the service's Announced condition and Events
// say it: a write on its way to the nodes leaves them briefly not
// programmed, which is no news for the service's users.
var (
	AnnouncePeriod = time.Second
	AnnounceSettle = 3 * time.Second
)

// reportToKubernetes keeps, while this server leads, the Announced
// condition of every Kubernetes LoadBalancer service Weir handles
// current, with an Event at each change (kubernetes.StatusWriter). A
// round looks at every such service on every node, so rounds are spaced
// to take at most a tenth of a core.
func (s *Server) reportToKubernetes(ctx context.Context) {
	if s.kubeStatus == nil {
		return
	}
	type seen struct {
		said     string
		since    time.Time
		reported bool
	}
	last := map[string]*seen{}
	conflicted := map[string]string{} // service: the conflicts last told
	owner := func(a netip.Addr) (string, bool) {
		if s.l2 == nil {
			return "", false
		}
		r := s.l2.ReportOn(a)
		return r.Holder.Node, r.Held
	}
	wait := AnnouncePeriod
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		start := time.Now()
		nodes, _ := s.Registry.Nodes.List("", nil)
		pools, _ := s.Registry.Pools.List("", nil)
		services, _ := s.Registry.Services.List("", nil)
		c := receive.Cluster{Nodes: nodes, Pools: pools, Observed: s.Agents.Status(), Aside: s.Registry.Aside}
		now := time.Now()
		live := map[string]bool{}
		for _, svc := range services {
			if svc.Source != model.SourceKubernetes || svc.Type != model.LoadBalancer || svc.OtherController || len(svc.LoadBalancerIPs) == 0 {
				continue
			}
			key := svc.Key()
			live[key] = true
			lines, missing := receive.Announced(c, svc, owner)
			said := fmt.Sprint(missing, lines)
			st := last[key]
			if st == nil || st.said != said {
				last[key] = &seen{said: said, since: now}
				continue
			}
			if st.reported || now.Sub(st.since) < AnnounceSettle {
				continue
			}
			if err := s.kubeStatus.WriteAnnounced(ctx, svc, kubernetes.Announcement{Lines: lines, Missing: missing}); err != nil {
				s.log.Warn("the Announced condition of a Kubernetes service not written", "service", key, "error", err)
				continue
			}
			st.reported = true
		}
		for key := range last {
			if !live[key] {
				delete(last, key)
			}
		}
		s.reportCustomResources(ctx, c.Observed, services)
		s.reportConflicts(ctx, conflicted)
		// A round weighs services × nodes: at most a tenth of a core.
		wait = max(AnnouncePeriod, 10*time.Since(start))
	}
}

// reportCustomResources writes the status of Weir's custom resources
// where it changed: whether the server took each, a pool's usage, a
// peer's sessions.
func (s *Server) reportCustomResources(ctx context.Context, nodes []observed.Node, services []*model.Service) {
	for _, p := range s.kube.CustomPools() {
		held, _ := s.Registry.Pools.Get(p.Name)
		st, changed := kubernetes.PoolStatus(p, held, s.kube.CustomRefused(v1alpha1.AddressPools.Resource, p.Name), services)
		if changed {
			if err := s.kube.WriteCustomStatus(ctx, v1alpha1.AddressPools.Resource, p, &st); err != nil {
				s.log.Debug("an AddressPool's status not written (again next round)", "pool", p.Name, "error", err)
			}
		}
	}
	for _, p := range s.kube.CustomPeers() {
		held, _ := s.Registry.Peers.Get(p.Name)
		st, changed := kubernetes.PeerStatus(p, held, s.kube.CustomRefused(v1alpha1.BGPPeers.Resource, p.Name), nodes)
		if changed {
			if err := s.kube.WriteCustomStatus(ctx, v1alpha1.BGPPeers.Resource, p, &st); err != nil {
				s.log.Debug("a BGPPeer's status not written (again next round)", "peer", p.Name, "error", err)
			}
		}
	}
}

// reportConflicts records an Event on each Kubernetes service whose
// conflicts (what the nodes leave out of it, and why) changed to some;
// told keeps what each was last told.
func (s *Server) reportConflicts(ctx context.Context, told map[string]string) {
	now := map[string]string{}
	svcs := map[string]*model.Service{}
	s.Registry.Read(func(v registry.View) {
		for _, key := range v.ServiceKeys() {
			svc := v.Service(key)
			if svc.Source != model.SourceKubernetes {
				continue
			}
			var said []string
			for _, c := range v.ServiceConflicts(svc) {
				said = append(said, c.String())
			}
			if len(said) > 0 {
				now[key], svcs[key] = strings.Join(said, "; "), svc
			}
		}
	})
	for key, said := range now {
		if told[key] == said {
			continue
		}
		if err := s.kubeStatus.WriteConflict(ctx, svcs[key], said); err != nil {
			s.log.Debug("a conflict Event not written (again next round)", "service", key, "error", err)
			continue
		}
		told[key] = said
	}
	for key := range told {
		if _, ok := now[key]; !ok {
			delete(told, key)
		}
	}
}
