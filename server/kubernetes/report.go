package kubernetes

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/server/ipam"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/l2owner"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// The reporter's timing defaults: how often the leader looks at what the
// nodes do with each Kubernetes service's addresses, and how long a
// change must hold before the service's Announced condition and Events
// say it (a write on its way to the nodes leaves them briefly not
// programmed, which is no news for the service's users).
const (
	DefaultAnnouncePeriod = time.Second
	DefaultAnnounceSettle = 3 * time.Second
)

// ReportRegistry is what the reporter reads of the registry.
type ReportRegistry interface {
	Read(func(registry.View))
}

// NodeStatus is the nodes' status as the hub observes it
// (agentsync.Hub).
type NodeStatus interface {
	Status() []observed.Node
}

// L2Owners tells who holds each L2 address's lease (l2owner.Owners).
type L2Owners interface {
	ReportOn(netip.Addr) l2owner.Report
}

// ServiceReports is where a Kubernetes service's users are told what the
// nodes do with it (StatusWriter).
type ServiceReports interface {
	WriteAnnounced(ctx context.Context, svc *model.Service, a Announcement) error
	WriteConflict(ctx context.Context, svc *model.Service, message string) error
	ClearConditions(ctx context.Context, svc *model.Service) error
}

// CustomResources are Weir's custom resources as the cluster has them
// (Source).
type CustomResources interface {
	CustomPools() []*v1alpha1.WeirAddressPool
	CustomPeers() []*v1alpha1.WeirBGPPeer
	CustomRefused(resource, name string) error
	WriteCustomStatus(ctx context.Context, resource string, obj metav1.Object, status any) error
}

// ReporterConfig is what a Reporter reads, where it writes, and how it is
// timed.
type ReporterConfig struct {
	Registry ReportRegistry
	Status   NodeStatus
	L2       L2Owners
	Services ServiceReports
	Custom   CustomResources
	// Clock times the reporter (nil: the real clock).
	Clock clock.Clock
	// Period is the least time between two rounds, Settle how long a
	// service's announcement must hold before it is told (zero:
	// DefaultAnnouncePeriod, DefaultAnnounceSettle).
	Period, Settle time.Duration
	Log            *slog.Logger
}

// Reporter keeps, while its server leads, the Announced condition of
// every Kubernetes LoadBalancer service Weir handles current, with an
// Event at each change; an Event on each service whose conflicts changed
// to some; and the status of Weir's custom resources.
type Reporter struct {
	cfg ReporterConfig
}

// NewReporter returns a reporter over cfg; Run does the work.
func NewReporter(cfg ReporterConfig) *Reporter {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultAnnouncePeriod
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultAnnounceSettle
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Reporter{cfg: cfg}
}

// told is what the reporter has seen and said, from round to round.
type told struct {
	announced map[string]*announcement // by service
	conflicts map[string]string        // by service: the conflicts last told
}

// announcement is one service's announcement as last seen.
type announcement struct {
	lines    []string
	missing  bool
	since    time.Time // when it was first seen so
	reported bool
}

func (a *announcement) same(lines []string, missing bool) bool {
	return a.missing == missing && slices.Equal(a.lines, lines)
}

// Run reports until ctx ends. A round looks at every such service on
// every node, so rounds are spaced to take at most a tenth of a core. It
// may run again after it stopped (a replica leading again).
func (r *Reporter) Run(ctx context.Context) {
	t := told{announced: map[string]*announcement{}, conflicts: map[string]string{}}
	wait := r.cfg.Period
	for {
		timer := r.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C():
		}
		start := r.cfg.Clock.Now()
		r.round(ctx, &t)
		// A round weighs services × nodes: at most a tenth of a core.
		wait = max(r.cfg.Period, 10*r.cfg.Clock.Since(start))
	}
}

// round reads the cluster once, then tells what changed.
func (r *Reporter) round(ctx context.Context, t *told) {
	s := r.read()
	r.reportAnnounced(ctx, s.cluster, t.announced)
	r.reportCustomResources(ctx, s)
	r.reportConflicts(ctx, s.conflicts, t.conflicts)
	r.clearLeftStatus(ctx, s.left)
}

// clearLeftStatus removes Weir's conditions from the services that are no
// longer Weir's: a service moved to another controller, or no longer a
// LoadBalancer, says nothing of Weir.
func (r *Reporter) clearLeftStatus(ctx context.Context, left []*model.Service) {
	for _, svc := range left {
		if err := r.cfg.Services.ClearConditions(ctx, svc); err != nil {
			r.cfg.Log.Warn("a service that is no longer Weir's keeps Weir's conditions", "service", svc.Key(), "error", err)
		}
	}
}

// snapshot is what one round reads of the cluster.
type snapshot struct {
	cluster receive.Cluster
	pools   map[string]*model.AddressPool
	peers   map[string]*model.BGPPeer
	// conflicts are the Kubernetes services that have some, with what
	// they say.
	conflicts map[string]conflict
	// left are the Kubernetes services no longer Weir's whose status
	// still carries Weir's conditions.
	left []*model.Service
}

type conflict struct {
	svc  *model.Service
	said string
}

// read reads the nodes' status, then the registry once.
func (r *Reporter) read() snapshot {
	obs := r.cfg.Status.Status()
	var s snapshot
	r.cfg.Registry.Read(func(v registry.View) {
		s.cluster = receive.ClusterOf(v, obs)
		s.pools = byName(s.cluster.Pools)
		s.peers = byName(v.Peers())
		s.conflicts = conflictsOf(v)
		for _, key := range v.ServiceKeys() {
			if svc := v.Service(key); svc.Source == model.SourceKubernetes && svc.WeirStatusLeft {
				s.left = append(s.left, svc)
			}
		}
	})
	return s
}

// byName indexes objects by name.
func byName[T model.Object](objs []T) map[string]T {
	out := make(map[string]T, len(objs))
	for _, o := range objs {
		out[o.GetMeta().Name] = o
	}
	return out
}

// conflictsOf are the Kubernetes services' conflicts (what the nodes
// leave out of each, and why), for those that have some. Another
// load-balancer controller's services are left out, and those it
// addressed although their class is Weir's: Weir writes nothing to them,
// Events included (their conflicts stay in Weir's API).
func conflictsOf(v registry.View) map[string]conflict {
	out := map[string]conflict{}
	pools := v.Pools()
	for _, key := range v.ServiceKeys() {
		svc := v.Service(key)
		if svc.Source != model.SourceKubernetes || svc.OtherController || ipam.SetOutside(svc, pools) {
			continue
		}
		var said []string
		for _, c := range v.ServiceConflicts(svc) {
			said = append(said, c.String())
		}
		if len(said) > 0 {
			out[key] = conflict{svc: svc, said: strings.Join(said, "; ")}
		}
	}
	return out
}

// reportAnnounced writes the Announced condition of each Kubernetes
// LoadBalancer service whose announcement changed and held for Settle;
// seen keeps each service's as last seen.
func (r *Reporter) reportAnnounced(ctx context.Context, c receive.Cluster, seen map[string]*announcement) {
	now := r.cfg.Clock.Now()
	live := map[string]bool{}
	for _, svc := range c.Services {
		if svc.Source != model.SourceKubernetes || svc.Type != model.LoadBalancer || svc.OtherController || len(svc.LoadBalancerIPs) == 0 ||
			ipam.SetOutside(svc, c.Pools) {
			continue
		}
		key := svc.Key()
		live[key] = true
		lines, missing := receive.Announced(c, svc, r.holder)
		a := seen[key]
		if a == nil || !a.same(lines, missing) {
			seen[key] = &announcement{lines: lines, missing: missing, since: now}
			continue
		}
		if a.reported || now.Sub(a.since) < r.cfg.Settle {
			continue
		}
		if err := r.cfg.Services.WriteAnnounced(ctx, svc, Announcement{Lines: lines, Missing: missing}); err != nil {
			r.cfg.Log.Warn("the Announced condition of a Kubernetes service not written", "service", key, "error", err)
			continue
		}
		a.reported = true
	}
	maps.DeleteFunc(seen, func(key string, _ *announcement) bool { return !live[key] })
}

// holder is the node that holds addr's L2 lease now, if one does.
func (r *Reporter) holder(addr netip.Addr) (string, bool) {
	if r.cfg.L2 == nil {
		return "", false
	}
	rep := r.cfg.L2.ReportOn(addr)
	return rep.Holder.Node, rep.Held
}

// reportCustomResources writes the status of Weir's custom resources
// where it changed: whether the server took each, a pool's usage, a
// peer's sessions.
func (r *Reporter) reportCustomResources(ctx context.Context, s snapshot) {
	for _, p := range r.cfg.Custom.CustomPools() {
		st, changed := PoolStatus(p, s.pools[p.Name], r.cfg.Custom.CustomRefused(v1alpha1.AddressPools.Resource, p.Name), s.cluster.Services)
		if changed {
			if err := r.cfg.Custom.WriteCustomStatus(ctx, v1alpha1.AddressPools.Resource, p, &st); err != nil {
				r.cfg.Log.Debug("a WeirAddressPool's status not written (again next round)", "pool", p.Name, "error", err)
			}
		}
	}
	for _, p := range r.cfg.Custom.CustomPeers() {
		st, changed := PeerStatus(p, s.peers[p.Name], r.cfg.Custom.CustomRefused(v1alpha1.BGPPeers.Resource, p.Name), s.cluster.Observed)
		if changed {
			if err := r.cfg.Custom.WriteCustomStatus(ctx, v1alpha1.BGPPeers.Resource, p, &st); err != nil {
				r.cfg.Log.Debug("a WeirBGPPeer's status not written (again next round)", "peer", p.Name, "error", err)
			}
		}
	}
}

// reportConflicts records an Event on each Kubernetes service whose
// conflicts changed to some (now); told keeps what each was last told.
func (r *Reporter) reportConflicts(ctx context.Context, now map[string]conflict, told map[string]string) {
	for key, c := range now {
		if told[key] == c.said {
			continue
		}
		if err := r.cfg.Services.WriteConflict(ctx, c.svc, c.said); err != nil {
			r.cfg.Log.Debug("a conflict Event not written (again next round)", "service", key, "error", err)
			continue
		}
		told[key] = c.said
	}
	maps.DeleteFunc(told, func(key string, _ string) bool { _, ok := now[key]; return !ok })
}
