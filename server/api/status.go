package api

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
)

// StatusService implements weir.v1.StatusService over the agent hub.
type StatusService struct {
	weirv1.UnimplementedStatusServiceServer
	hub *agentsync.Hub
}

// NewStatusService serves what hub knows of the nodes.
func NewStatusService(hub *agentsync.Hub) *StatusService { return &StatusService{hub: hub} }

func (s *StatusService) ListNodeStatuses(context.Context, *weirv1.ListNodeStatusesRequest) (*weirv1.ListNodeStatusesResponse, error) {
	out := &weirv1.ListNodeStatusesResponse{}
	for _, n := range s.hub.Status() {
		out.Nodes = append(out.Nodes, &weirv1.NodeStatus{
			Name: n.Node, Connected: n.Connected, SentVersion: n.SentVersion, AppliedVersion: n.AppliedVersion,
			LastError: n.LastError, LastErrorVersion: n.LastErrorVersion, LastSeen: timestamp(n.LastSeen),
			Health: &weirv1.NodeHealth{
				HealthzCode: int32(n.Health.HealthzCode), LivezCode: int32(n.Health.LivezCode),
				LastUpdated: timestamp(n.Health.LastUpdated), NodeEligible: n.Health.NodeEligible,
			},
			LastSyncDuration: durationpb.New(n.LastSync),
		})
	}
	return out, nil
}

func (s *StatusService) GetServiceStatus(_ context.Context, req *weirv1.GetServiceStatusRequest) (*weirv1.GetServiceStatusResponse, error) {
	key := req.GetNamespace() + "/" + req.GetName()
	report := &weirv1.ServiceReport{Namespace: req.GetNamespace(), Name: req.GetName()}
	for _, n := range s.hub.Status() {
		h, ok := n.Services[key]
		if !ok {
			continue
		}
		report.Nodes = append(report.Nodes, &weirv1.ServiceNodeStatus{
			Node: n.Node,
			Health: &weirv1.ServiceHealth{
				Namespace: req.GetNamespace(), Name: req.GetName(),
				LocalReady: int32(h.LocalReady), LocalServing: int32(h.LocalServing), LocalTerminating: int32(h.LocalTerminating),
				HealthCheckNodePort: int32(h.HealthCheckNodePort), HealthCheckCode: int32(h.HealthCheckCode), HealthCheckError: h.HealthCheckError,
			},
			Programmed: n.Connected && n.AppliedVersion >= n.SentVersion && n.LastError == "",
		})
	}
	return &weirv1.GetServiceStatusResponse{Status: report}, nil
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
