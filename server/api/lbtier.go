package api

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/notify"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
)

// GoneSpeakerKept is how long the last report of a speaker that stopped
// watching is still shown (as not current).
const GoneSpeakerKept = time.Hour

// TargetsCoalesce is how long a targets watcher waits after a change for
// more before it sends: one agent's ACK and report become one message.
const TargetsCoalesce = 10 * time.Millisecond

// LoadBalancerTierService implements weir.v1.LoadBalancerTierService: it
// tells the load-balancer speakers which nodes should receive each
// load-balancer IP (the same decision GetServiceStatus explains) and keeps
// what they report.
type LoadBalancerTierService struct {
	weirv1.UnimplementedLoadBalancerTierServiceServer
	hub *agentsync.Hub
	reg *registry.Registry

	mu      sync.Mutex
	reports map[string]*weirv1.SpeakerStatus // by speaker
	watches map[string]*speakerWatch         // by speaker, while it watches
	gone    map[string]time.Time             // speakers whose watch ended, kept for GoneSpeakerKept
	changed notify.Signal                    // at every report or cover
}

// speakerWatch is what one speaker's watch was sent, in revisions: sent,
// of the last targets sent; covered, the newest revision whose targets
// were the same as those. A speaker that applied the last targets sent is
// programmed through covered.
type speakerWatch struct{ sent, covered uint64 }

// NewLoadBalancerTierService serves targets from what hub and reg know.
func NewLoadBalancerTierService(hub *agentsync.Hub, reg *registry.Registry) *LoadBalancerTierService {
	return &LoadBalancerTierService{hub: hub, reg: reg, reports: map[string]*weirv1.SpeakerStatus{},
		watches: map[string]*speakerWatch{}, gone: map[string]time.Time{}}
}

func (l *LoadBalancerTierService) WatchTargets(req *weirv1.WatchTargetsRequest, stream weirv1.LoadBalancerTierService_WatchTargetsServer) error {
	name := req.GetSpeaker()
	if name == "" {
		return invalidField("speaker", "a speaker name is required")
	}
	if err := auth.AuthorizeSpeaker(stream.Context(), "speaker", name); err != nil {
		return err
	}
	if err := l.hub.CurrentErr(req.GetAcceptStale()); err != nil {
		return err
	}
	// The speaker's report lives as long as its watch.
	w := &speakerWatch{}
	l.mu.Lock()
	l.watches[name] = w
	delete(l.gone, name)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.watches[name] == w { // not replaced by a newer watch
			// Its last report stays, shown as no longer current.
			delete(l.watches, name)
			l.gone[name] = time.Now()
		}
		l.tierChanged()
		l.mu.Unlock()
	}()
	var last []*weirv1.VipTargets
	var rev uint64
	return everyStatusChange(stream.Context(), l.hub, TargetsCoalesce, func() error {
		// A replica that lost the store sends its speakers to another.
		if err := l.hub.CurrentErr(req.GetAcceptStale()); err != nil {
			return err
		}
		now, through := l.targets()
		// Per watch, revisions only grow: targets computed later hold
		// every write an earlier computation held.
		rev = max(rev, through)
		if last != nil && slices.EqualFunc(now, last, func(a, b *weirv1.VipTargets) bool { return proto.Equal(a, b) }) {
			l.record(func() { w.covered = max(w.covered, rev) })
			return nil
		}
		last = now
		l.record(func() { w.sent, w.covered = rev, rev })
		return stream.Send(&weirv1.WatchTargetsResponse{Vips: now, Revision: rev})
	})
}

// record changes a watch's revisions and wakes the waiters.
func (l *LoadBalancerTierService) record(change func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	change()
	l.tierChanged()
}

// tierChanged wakes WaitProgrammed. Called with l.mu held.
func (l *LoadBalancerTierService) tierChanged() {
	l.changed.Broadcast()
}

// Changed returns a channel closed at the next speaker report or change
// of what a speaker was sent: take it before reading them.
func (l *LoadBalancerTierService) Changed() <-chan struct{} {
	return l.changed.Changed()
}

// progress says where every watching speaker stands toward revision rev:
// programmed when it reported applying targets that hold rev.
func (l *LoadBalancerTierService) progress(rev uint64) (speakers []*weirv1.NodeProgress, programmed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	programmed = true
	for name, w := range l.watches {
		applied := l.reports[name].GetAppliedRevision()
		through := applied
		if applied >= w.sent {
			through = max(applied, w.covered)
		}
		p := &weirv1.NodeProgress{Name: name, Connected: true, ProgrammedVersion: through}
		if through < rev {
			p.Reason, programmed = "applying", false
		}
		speakers = append(speakers, p)
	}
	slices.SortFunc(speakers, func(a, b *weirv1.NodeProgress) int { return strings.Compare(a.Name, b.Name) })
	return speakers, programmed
}

func (l *LoadBalancerTierService) ReportSpeaker(ctx context.Context, req *weirv1.ReportSpeakerRequest) (*weirv1.ReportSpeakerResponse, error) {
	st := req.GetStatus()
	if st.GetName() == "" {
		return nil, invalidField("status.name", "a speaker name is required")
	}
	if err := auth.AuthorizeSpeaker(ctx, "status.name", st.GetName()); err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.reports[st.GetName()] = st
	l.tierChanged()
	l.mu.Unlock()
	return &weirv1.ReportSpeakerResponse{}, nil
}

// pathsOf is every speaker's paths of one service ("namespace/name").
func (l *LoadBalancerTierService) pathsOf(key string) []*weirv1.SpeakerServicePaths {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*weirv1.SpeakerServicePaths
	for name, st := range l.reports {
		sp := &weirv1.SpeakerServicePaths{Speaker: name}
		if since, ok := l.gone[name]; ok {
			if time.Since(since) > GoneSpeakerKept {
				delete(l.gone, name)
				delete(l.reports, name)
				continue
			}
			sp.GoneSince = timestamppb.New(since)
		}
		for _, p := range st.GetPaths() {
			if p.GetService() == key {
				sp.Paths = append(sp.Paths, p)
			}
		}
		out = append(out, sp)
	}
	slices.SortFunc(out, func(a, b *weirv1.SpeakerServicePaths) int { return strings.Compare(a.Speaker, b.Speaker) })
	return out
}

// targets is what every load-balancer IP is sent to now (the decision is
// server/receive's) and the store revision it reflects: the registry's,
// or less while a connected node (that has not refused a state) is not
// yet programmed through it, since the node becomes a target only once
// it is.
func (l *LoadBalancerTierService) targets() ([]*weirv1.VipTargets, uint64) {
	statuses := l.hub.Status()
	var rev uint64
	var cluster receive.Cluster
	l.reg.Read(func(v registry.View) { rev, cluster = v.Revision(), receive.ClusterOf(v, statuses) })
	for _, n := range statuses {
		if n.Connected && n.LastError == "" {
			rev = min(rev, n.ProgrammedVersion())
		}
	}
	vips := receive.Targets(cluster)
	out := make([]*weirv1.VipTargets, 0, len(vips))
	for _, v := range vips {
		vt := &weirv1.VipTargets{Address: v.Address.String(), Service: v.Service,
			Communities: v.Communities, LargeCommunities: nodewire.EncodeLargeCommunities(v.LargeCommunities), LocalPreference: v.LocalPreference,
			PrefixLength: uint32(v.PrefixLength)}
		for _, t := range v.Targets {
			vt.Targets = append(vt.Targets, &weirv1.Target{Node: t.Node, Address: t.Address.String(), Weight: t.Weight,
				HealthCheckPort: int32(t.HealthCheckPort), HealthCheckPath: t.HealthCheckPath})
		}
		out = append(out, vt)
	}
	return out, rev
}

// invalidField is InvalidArgument naming the field, like every other
// rejected request.
func invalidField(field, reason string) error {
	return Status("", &model.FieldError{Field: field, Reason: reason})
}
