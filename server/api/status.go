package api

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/l2owner"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// StatusService implements weir.v1.StatusService over the agent hub and
// the registry.
type StatusService struct {
	weirv1.UnimplementedStatusServiceServer
	hub  *agentsync.Hub
	reg  *registry.Registry
	info ServerInfo
	// speakers, when set, adds the load-balancer tier's paths to service
	// statuses.
	speakers *LoadBalancerTierService
	// l2, when set, adds who answers for the L2 addresses.
	l2 *l2owner.Owners
}

// ServerInfo is what the server says of itself.
type ServerInfo struct {
	Version string
	Started time.Time
	Sources []string
}

// NewStatusService serves what hub knows of the nodes and, when speakers
// is not nil, what the load-balancer tier does.
func NewStatusService(hub *agentsync.Hub, reg *registry.Registry, info ServerInfo, speakers *LoadBalancerTierService, l2 *l2owner.Owners) *StatusService {
	return &StatusService{hub: hub, reg: reg, info: info, speakers: speakers, l2: l2}
}

func (s *StatusService) GetServerInfo(context.Context, *weirv1.GetServerInfoRequest) (*weirv1.GetServerInfoResponse, error) {
	rev := s.hub.Version()
	info := &weirv1.GetServerInfoResponse{
		Version: s.info.Version, Revision: rev, AgentsConnected: int32(s.hub.Connected()),
		Started: timestamp(s.info.Started), Sources: s.info.Sources,
	}
	info.StateVersion = rev //lint:ignore SA1019 filled for clients of the previous release
	if since, err := s.reg.WriteFailure(); err != nil {
		info.StoreWriteError, info.StoreWriteFailingSince = err.Error(), timestamp(since)
	}
	return info, nil
}

// statuses is every node the registry or the hub knows, sorted by name:
// a registered node whose agent never connected shows as disconnected.
func (s *StatusService) statuses() []observed.Node {
	return withRegistered(s.reg, s.hub.Status(), func(n observed.Node) string { return n.Node }, func(name string) observed.Node { return observed.Node{Node: name} })
}

// progress is statuses' progress alone (observed.Progress).
func (s *StatusService) progress() []observed.Progress {
	return withRegistered(s.reg, s.hub.Progress(), func(n observed.Progress) string { return n.Node }, func(name string) observed.Progress { return observed.Progress{Node: name} })
}

// withRegistered adds to out, nodes as the hub has them, the registered
// nodes it lacks (unseen: as never connected), and sorts them by name.
func withRegistered[T any](reg *registry.Registry, out []T, name func(T) string, unseen func(string) T) []T {
	seen := map[string]bool{}
	for _, n := range out {
		seen[name(n)] = true
	}
	nodes, _ := reg.Nodes.List("", nil)
	for _, n := range nodes {
		if !seen[n.Name] {
			out = append(out, unseen(n.Name))
		}
	}
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(name(a), name(b)) })
	return out
}

func (s *StatusService) ListNodeStatuses(_ context.Context, req *weirv1.ListNodeStatusesRequest) (*weirv1.ListNodeStatusesResponse, error) {
	nodes, next, err := page(s.nodeStatuses(), (*weirv1.NodeStatus).GetName, func(n *weirv1.NodeStatus) *weirv1.NodeStatus { return n }, req)
	return &weirv1.ListNodeStatusesResponse{Nodes: nodes, NextPageToken: next}, err
}

// WaitProgrammed's default and longest waits.
const (
	WaitProgrammedDefault = 30 * time.Second
	WaitProgrammedMax     = 10 * time.Minute
)

func (s *StatusService) WaitProgrammed(ctx context.Context, req *weirv1.WaitProgrammedRequest) (*weirv1.WaitProgrammedResponse, error) {
	rev := req.GetRevision()
	if rev == 0 {
		return nil, status.Error(codes.InvalidArgument, "revision: required (the resource_version a write returned)")
	}
	timeout := WaitProgrammedDefault
	if t := req.GetTimeout(); t != nil {
		if err := t.CheckValid(); err != nil || t.AsDuration() < 0 {
			return nil, status.Error(codes.InvalidArgument, "timeout: must be a duration of 0 or more")
		}
		if d := t.AsDuration(); d > 0 {
			timeout = min(d, WaitProgrammedMax)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	answer := func() *weirv1.WaitProgrammedResponse {
		resp := progressToward(s.progress(), rev)
		if s.speakers != nil {
			var ok bool
			resp.Speakers, ok = s.speakers.progress(rev)
			resp.Programmed = resp.Programmed && ok
		}
		return resp
	}
	for {
		changed := s.hub.StatusChanged()
		var tierChanged <-chan struct{} // nil without a tier: never ready
		// Asked at every status change (each agent's answer): the
		// nodes are read in place, and the answer built once.
		settled := !s.hub.Applying(rev)
		if s.speakers != nil {
			tierChanged = s.speakers.Changed()
			// A speaker only follows: it can always still get there.
			_, ok := s.speakers.progress(rev)
			settled = settled && ok
		}
		if settled {
			return answer(), nil
		}
		select {
		case <-ctx.Done():
			return answer(), nil
		case <-changed:
		case <-tierChanged:
		}
	}
}

// progressToward says where every node stands toward revision rev.
func progressToward(nodes []observed.Progress, rev uint64) *weirv1.WaitProgrammedResponse {
	resp := &weirv1.WaitProgrammedResponse{Programmed: true}
	for _, n := range nodes {
		p := &weirv1.NodeProgress{Name: n.Node, Connected: n.Connected, ProgrammedVersion: n.Programmed}
		switch {
		case p.ProgrammedVersion >= rev:
		case !n.Connected:
			p.Reason = "not connected"
		case n.Applying(rev):
			p.Reason = "applying"
			resp.Programmed = false
		default:
			p.Reason = fmt.Sprintf("refused version %d: %s", n.LastErrorVersion, n.LastError)
			resp.Programmed = false
		}
		resp.Nodes = append(resp.Nodes, p)
	}
	return resp
}

// WatchStatusPeriod is the least time between two statuses sent to a
// watcher: a burst of reports becomes one message.
const WatchStatusPeriod = 100 * time.Millisecond

func (s *StatusService) WatchNodeStatuses(_ *weirv1.WatchNodeStatusesRequest, stream weirv1.StatusService_WatchNodeStatusesServer) error {
	return everyStatusChange(stream.Context(), s.hub, WatchStatusPeriod, func() error {
		return stream.Send(&weirv1.WatchNodeStatusesResponse{Nodes: s.nodeStatuses()})
	})
}

// everyStatusChange calls send now, then after each change of the hub's
// statuses, waiting gap after a change for more to come, until ctx ends.
func everyStatusChange(ctx context.Context, hub *agentsync.Hub, gap time.Duration, send func() error) error {
	for {
		changed := hub.StatusChanged()
		if err := send(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(gap):
		}
	}
}

func (s *StatusService) nodeStatuses() []*weirv1.NodeStatus {
	var out []*weirv1.NodeStatus
	owned := map[string]int{}
	if s.l2 != nil {
		owned = s.l2.Owned()
	}
	for _, n := range s.statuses() {
		out = append(out, &weirv1.NodeStatus{
			Name: n.Node, Connected: n.Connected, SentVersion: n.SentVersion, AppliedVersion: n.AppliedVersion,
			ProgrammedVersion: n.ProgrammedVersion(), ProgrammingLatency: durationpb.New(n.ProgrammingLatency),
			LastError: n.LastError, LastErrorVersion: n.LastErrorVersion, LastSeen: timestamp(n.LastSeen),
			Health: &weirv1.NodeHealth{
				HealthzCode: int32(n.Health.HealthzCode), LivezCode: int32(n.Health.LivezCode),
				LastUpdated: timestamp(n.Health.LastUpdated), NodeEligible: n.Health.NodeEligible,
			},
			LastSyncDuration:    durationpb.New(n.LastSync),
			BgpSessions:         bgpSessions(n),
			L2Addresses:         uint32(owned[n.Node]),
			AgentVersion:        n.AgentVersion,
			CertificateNotAfter: timestamp(n.CertificateNotAfter),
			MovedConnections:    movedConnections(n),
			Drain:               drainStatus(n.Drain),
		})
	}
	return out
}

// movedConnections is unset for a node that does not pass moved
// connections on (no report of them).
func movedConnections(n observed.Node) *weirv1.MovedConnections {
	if n.Moved.ChangedAt.IsZero() {
		return nil
	}
	return nodewire.EncodeMoved(n.Moved)
}

// drainStatus is what a drained node still serves; nil when it is not
// drained.
func drainStatus(d observed.Drain) *weirv1.DrainStatus {
	if d == (observed.Drain{}) {
		return nil
	}
	return nodewire.EncodeDrain(report.DrainReport{Connections: d.ConnectionsLeft, CountedAt: d.CountedAt, Deadline: d.Deadline, Ended: d.EndedAtDeadline})
}

// GetServiceStatus tells, per node, what it sees of the service and
// whether it should receive external traffic, with the reason when not.
func (s *StatusService) GetServiceStatus(_ context.Context, req *weirv1.GetServiceStatusRequest) (*weirv1.GetServiceStatusResponse, error) {
	key := req.GetNamespace() + "/" + req.GetName()
	svc, err := s.reg.Services.Get(key)
	if err != nil {
		return nil, Status("", err)
	}
	report := &weirv1.ServiceReport{Namespace: req.GetNamespace(), Name: req.GetName()}
	for _, n := range s.statuses() {
		h, seen := n.Services[key]
		v := receive.Of(svc, n, s.reg.Aside(n.Node))
		st := &weirv1.ServiceNodeStatus{Node: n.Node, Programmed: n.Programmed(), ReceivesExternalTraffic: v.Receives(),
			Reason: v.Reason, Message: v.Message, Families: families(v),
			Announcements: nodewire.EncodeAnnouncements(receive.Announcing(n.BGPAnnouncements, svc.LoadBalancerIPs))}
		if seen {
			st.Health = &weirv1.ServiceHealth{
				Namespace: req.GetNamespace(), Name: req.GetName(),
				LocalReady: int32(h.LocalReady), LocalServing: int32(h.LocalServing), LocalTerminating: int32(h.LocalTerminating),
				HealthCheckNodePort: int32(h.HealthCheckNodePort), HealthCheckCode: int32(h.HealthCheckCode), HealthCheckError: h.HealthCheckError,
			}
		}
		if v.Receives() {
			report.ReceivingNodes = append(report.ReceivingNodes, n.Node)
		}
		report.Nodes = append(report.Nodes, st)
	}
	if s.speakers != nil {
		report.Speakers = s.speakers.pathsOf(key)
	}
	report.L2Addresses = s.l2Status(svc)
	return &weirv1.GetServiceStatusResponse{Status: report}, nil
}

// l2Status is who answers for each of svc's L2 addresses, and why the
// other nodes may not.
func (s *StatusService) l2Status(svc *model.Service) []*weirv1.L2AddressStatus {
	pools, _ := s.reg.Pools.List("", nil)
	if s.l2 == nil || !slices.ContainsFunc(pools, func(p *model.AddressPool) bool { return p.L2 != nil }) {
		return nil
	}
	nodes, _ := s.reg.Nodes.List("", nil)
	why := map[netip.Addr]map[string]receive.Verdict{}
	candidates := receive.L2Why(receive.Cluster{Nodes: nodes, Pools: pools, Observed: s.statuses(), Aside: s.reg.Aside}, svc, why)
	var out []*weirv1.L2AddressStatus
	for _, a := range slices.SortedFunc(maps.Keys(candidates), netip.Addr.Compare) {
		r := s.l2.ReportOn(a)
		st := &weirv1.L2AddressStatus{Address: a.String(), Decided: r.Deciding, Chosen: r.Chosen}
		if r.Held {
			st.Owner, st.Epoch, st.Since = r.Holder.Node, r.Holder.Epoch, timestamp(r.Holder.Since)
		}
		for _, n := range candidates[a] {
			if why, refused := r.Refused[n]; refused {
				st.PassedOver = append(st.PassedOver, &weirv1.L2NodeReason{Node: n, Reason: l2owner.CannotAnswer, Message: why})
				continue
			}
			st.Candidates = append(st.Candidates, n)
		}
		for _, n := range slices.Sorted(maps.Keys(why[a])) {
			st.PassedOver = append(st.PassedOver, &weirv1.L2NodeReason{Node: n, Reason: why[a][n].Reason, Message: why[a][n].Message})
		}
		slices.SortFunc(st.PassedOver, func(x, y *weirv1.L2NodeReason) int { return strings.Compare(x.GetNode(), y.GetNode()) })
		out = append(out, st)
	}
	return out
}

// bgpSessions is the wire form of a node speaker's sessions; none when
// the node runs no speaker.
func bgpSessions(n observed.Node) []*weirv1.BgpSession {
	if len(n.BGPSessions) == 0 {
		return nil
	}
	return nodewire.EncodeSessions(n.BGPSessions)
}

// families is the wire form of a verdict's families.
func families(v receive.Verdict) []*weirv1.ServiceFamilyStatus {
	var out []*weirv1.ServiceFamilyStatus
	for _, f := range v.Families {
		pf := &weirv1.ServiceFamilyStatus{AddressFamily: nodewire.AddressFamily(report.Family(f.Family)),
			Reason: f.Reason, Message: f.Message, ReceivesExternalTraffic: f.Reason == ""}
		pf.Family = f.Family //lint:ignore SA1019 filled for clients of the previous release
		for _, a := range f.Addresses {
			pf.Addresses = append(pf.Addresses, a.String())
		}
		out = append(out, pf)
	}
	return out
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
