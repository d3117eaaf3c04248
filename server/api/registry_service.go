//lint:file-ignore SA1019 answers still fill the deprecated resource_version, the revision as a string, for clients of the previous release

package api

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/internal/draintimeout"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/nodestate"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/resourcewire"
)

// RegistryService implements weir.v1.RegistryService over a registry.
type RegistryService struct {
	weirv1.UnimplementedRegistryServiceServer
	services  resource[*model.Service, *weirv1.Service]
	endpoints resource[*model.EndpointSlice, *weirv1.EndpointSlice]
	nodes     resource[*model.Node, *weirv1.Node]
	pools     resource[*model.AddressPool, *weirv1.AddressPool]
	peers     resource[*model.BGPPeer, *weirv1.BgpPeer]
	cidrs     resource[*model.ServiceCIDR, *weirv1.ServiceCidr]
	reg       *registry.Registry
}

// NewRegistryService serves reg.
func NewRegistryService(reg *registry.Registry) *RegistryService {
	return &RegistryService{
		services: resource[*model.Service, *weirv1.Service]{field: "service", coll: reg.Services, from: resourcewire.ServiceFromProto,
			to: func(s *model.Service) *weirv1.Service {
				p := resourcewire.ServiceToProto(s)
				reg.Read(func(v registry.View) {
					for _, c := range v.ServiceConflicts(s) {
						p.Status.Conflicts = append(p.Status.Conflicts, &weirv1.ServiceConflict{Field: c.Field(), Message: c.Message()})
					}
					chosen := nodestate.Announcers(v, s, nil)
					for _, ip := range s.LoadBalancerIPs {
						if nodes, ok := chosen[ip]; ok {
							p.Status.Announcers = append(p.Status.Announcers, &weirv1.AddressAnnouncers{Address: ip.String(), Nodes: nodes})
						}
					}
				})
				return p
			}},
		endpoints: resource[*model.EndpointSlice, *weirv1.EndpointSlice]{field: "endpoint_slice", coll: reg.EndpointSlices, from: resourcewire.EndpointSliceFromProto, to: resourcewire.EndpointSliceToProto},
		nodes: resource[*model.Node, *weirv1.Node]{field: "node", coll: reg.Nodes, from: resourcewire.NodeFromProto, to: func(n *model.Node) *weirv1.Node {
			return resourcewire.NodeToProto(reg.WithDrain(n))
		}},
		pools: resource[*model.AddressPool, *weirv1.AddressPool]{field: "address_pool", coll: reg.Pools, from: poolFromAPI, to: resourcewire.PoolToProto},
		peers: resource[*model.BGPPeer, *weirv1.BgpPeer]{field: "bgp_peer", coll: reg.Peers, from: resourcewire.BGPPeerFromProto, to: resourcewire.BGPPeerToProto},
		cidrs: resource[*model.ServiceCIDR, *weirv1.ServiceCidr]{field: "service_cidr", coll: reg.ServiceCIDRs, from: resourcewire.ServiceCIDRFromProto, to: resourcewire.ServiceCIDRToProto},
		reg:   reg,
	}
}

func (s *RegistryService) CreateServiceCidr(_ context.Context, req *weirv1.CreateServiceCidrRequest) (*weirv1.CreateServiceCidrResponse, error) {
	obj, err := s.cidrs.create(req.GetServiceCidr(), req.GetValidateOnly())
	return &weirv1.CreateServiceCidrResponse{ServiceCidr: obj}, err
}

func (s *RegistryService) GetServiceCidr(_ context.Context, req *weirv1.GetServiceCidrRequest) (*weirv1.GetServiceCidrResponse, error) {
	obj, err := s.cidrs.get("", req.GetName())
	return &weirv1.GetServiceCidrResponse{ServiceCidr: obj}, err
}

func (s *RegistryService) ListServiceCidrs(_ context.Context, req *weirv1.ListServiceCidrsRequest) (*weirv1.ListServiceCidrsResponse, error) {
	objs, _, next, err := s.cidrs.list("", "", req)
	return &weirv1.ListServiceCidrsResponse{ServiceCidrs: objs, NextPageToken: next}, err
}

func (s *RegistryService) UpdateServiceCidr(_ context.Context, req *weirv1.UpdateServiceCidrRequest) (*weirv1.UpdateServiceCidrResponse, error) {
	obj, err := s.cidrs.update(req.GetServiceCidr(), req.GetValidateOnly())
	return &weirv1.UpdateServiceCidrResponse{ServiceCidr: obj}, err
}

func (s *RegistryService) DeleteServiceCidr(_ context.Context, req *weirv1.DeleteServiceCidrRequest) (*weirv1.DeleteServiceCidrResponse, error) {
	rv, err := s.cidrs.delete("", req.GetName(), req.GetResourceVersion())
	return &weirv1.DeleteServiceCidrResponse{ResourceVersion: revisionString(rv), Revision: rv}, err
}

func (s *RegistryService) CreateBgpPeer(_ context.Context, req *weirv1.CreateBgpPeerRequest) (*weirv1.CreateBgpPeerResponse, error) {
	obj, err := s.peers.create(req.GetBgpPeer(), req.GetValidateOnly())
	return &weirv1.CreateBgpPeerResponse{BgpPeer: obj}, err
}

func (s *RegistryService) GetBgpPeer(_ context.Context, req *weirv1.GetBgpPeerRequest) (*weirv1.GetBgpPeerResponse, error) {
	obj, err := s.peers.get("", req.GetName())
	return &weirv1.GetBgpPeerResponse{BgpPeer: obj}, err
}

func (s *RegistryService) ListBgpPeers(_ context.Context, req *weirv1.ListBgpPeersRequest) (*weirv1.ListBgpPeersResponse, error) {
	objs, _, next, err := s.peers.list("", "", req)
	return &weirv1.ListBgpPeersResponse{BgpPeers: objs, NextPageToken: next}, err
}

func (s *RegistryService) UpdateBgpPeer(_ context.Context, req *weirv1.UpdateBgpPeerRequest) (*weirv1.UpdateBgpPeerResponse, error) {
	obj, err := s.peers.update(req.GetBgpPeer(), req.GetValidateOnly())
	return &weirv1.UpdateBgpPeerResponse{BgpPeer: obj}, err
}

func (s *RegistryService) DeleteBgpPeer(_ context.Context, req *weirv1.DeleteBgpPeerRequest) (*weirv1.DeleteBgpPeerResponse, error) {
	rv, err := s.peers.delete("", req.GetName(), req.GetResourceVersion())
	return &weirv1.DeleteBgpPeerResponse{ResourceVersion: revisionString(rv), Revision: rv}, err
}

func (s *RegistryService) CreateAddressPool(_ context.Context, req *weirv1.CreateAddressPoolRequest) (*weirv1.CreateAddressPoolResponse, error) {
	obj, err := s.pools.create(req.GetAddressPool(), req.GetValidateOnly())
	return &weirv1.CreateAddressPoolResponse{AddressPool: obj}, err
}

func (s *RegistryService) GetAddressPool(_ context.Context, req *weirv1.GetAddressPoolRequest) (*weirv1.GetAddressPoolResponse, error) {
	obj, err := s.pools.get("", req.GetName())
	return &weirv1.GetAddressPoolResponse{AddressPool: obj}, err
}

func (s *RegistryService) ListAddressPools(_ context.Context, req *weirv1.ListAddressPoolsRequest) (*weirv1.ListAddressPoolsResponse, error) {
	objs, _, next, err := s.pools.list("", "", req)
	return &weirv1.ListAddressPoolsResponse{AddressPools: objs, NextPageToken: next}, err
}

func (s *RegistryService) UpdateAddressPool(_ context.Context, req *weirv1.UpdateAddressPoolRequest) (*weirv1.UpdateAddressPoolResponse, error) {
	obj, err := s.pools.update(req.GetAddressPool(), req.GetValidateOnly())
	return &weirv1.UpdateAddressPoolResponse{AddressPool: obj}, err
}

func (s *RegistryService) DeleteAddressPool(_ context.Context, req *weirv1.DeleteAddressPoolRequest) (*weirv1.DeleteAddressPoolResponse, error) {
	rv, err := s.pools.delete("", req.GetName(), req.GetResourceVersion())
	return &weirv1.DeleteAddressPoolResponse{ResourceVersion: revisionString(rv), Revision: rv}, err
}

func (s *RegistryService) DrainNode(_ context.Context, req *weirv1.DrainNodeRequest) (*weirv1.DrainNodeResponse, error) {
	var change registry.DrainChange // absent: a drained node keeps its deadline
	if req.GetDrainTimeout() != nil {
		deadline, err := drainDeadline(req.GetDrainTimeout(), time.Now())
		if err != nil {
			return nil, Status("", err)
		}
		change = registry.DrainChange{SetDeadline: true, Deadline: deadline}
	}
	d, err := s.reg.DrainNode(req.GetName(), change)
	if err != nil {
		return nil, Status("", err)
	}
	resp := &weirv1.DrainNodeResponse{Node: s.nodes.to(d.Node), ResourceVersion: revisionString(d.Revision), Revision: d.Revision,
		WasDrained: d.WasDrained}
	if !d.PreviousDeadline.IsZero() {
		resp.PreviousDrainDeadline = timestamppb.New(d.PreviousDeadline)
	}
	return resp, nil
}

// drainDeadline is when a drain asked at now with timeout ends what the
// node still serves: zero for a timeout of 0, otherwise now plus the
// timeout, rounded up to the second so that it reads the same after a
// trip through the store.
func drainDeadline(timeout *durationpb.Duration, now time.Time) (time.Time, error) {
	if err := timeout.CheckValid(); err != nil {
		return time.Time{}, &model.FieldError{Field: "drain_timeout", Reason: err.Error()}
	}
	d := timeout.AsDuration()
	if err := draintimeout.Check(d); err != nil {
		return time.Time{}, &model.FieldError{Field: "drain_timeout", Reason: err.Error()}
	}
	if d == 0 {
		return time.Time{}, nil
	}
	return now.Add(d + time.Second - 1).Truncate(time.Second).UTC(), nil
}

func (s *RegistryService) UncordonNode(_ context.Context, req *weirv1.UncordonNodeRequest) (*weirv1.UncordonNodeResponse, error) {
	n, rev, err := s.reg.Uncordon(req.GetName())
	if err != nil {
		return nil, Status("", err)
	}
	return &weirv1.UncordonNodeResponse{Node: s.nodes.to(n), ResourceVersion: revisionString(rev), Revision: rev}, nil
}

func (s *RegistryService) CreateService(_ context.Context, req *weirv1.CreateServiceRequest) (*weirv1.CreateServiceResponse, error) {
	obj, err := s.services.create(req.GetService(), req.GetValidateOnly())
	return &weirv1.CreateServiceResponse{Service: obj}, err
}

func (s *RegistryService) GetService(_ context.Context, req *weirv1.GetServiceRequest) (*weirv1.GetServiceResponse, error) {
	obj, err := s.services.get(req.GetNamespace(), req.GetName())
	return &weirv1.GetServiceResponse{Service: obj}, err
}

func (s *RegistryService) ListServices(_ context.Context, req *weirv1.ListServicesRequest) (*weirv1.ListServicesResponse, error) {
	objs, rv, next, err := s.services.list(req.GetNamespace(), req.GetLabelSelector(), req)
	return &weirv1.ListServicesResponse{Services: objs, ResourceVersion: revisionString(rv), Revision: rv, NextPageToken: next}, err
}

func (s *RegistryService) UpdateService(_ context.Context, req *weirv1.UpdateServiceRequest) (*weirv1.UpdateServiceResponse, error) {
	var keep registry.Keep[*model.Service] // nil: a spec update's rule
	for i, p := range req.GetUpdateMask().GetPaths() {
		if p != "status.load_balancer_ips" {
			return nil, status.Errorf(codes.InvalidArgument, "update_mask.paths[%d]: %q is not a path an update can be told to replace (status.load_balancer_ips)", i, p)
		}
		keep = registry.KeepAddressReason
	}
	obj, err := s.services.updateKeeping(req.GetService(), req.GetValidateOnly(), keep)
	return &weirv1.UpdateServiceResponse{Service: obj}, err
}

func (s *RegistryService) DeleteService(_ context.Context, req *weirv1.DeleteServiceRequest) (*weirv1.DeleteServiceResponse, error) {
	rv, err := s.services.delete(req.GetNamespace(), req.GetName(), req.GetResourceVersion())
	return &weirv1.DeleteServiceResponse{ResourceVersion: revisionString(rv), Revision: rv}, err
}

func (s *RegistryService) WatchServices(req *weirv1.WatchServicesRequest, stream weirv1.RegistryService_WatchServicesServer) error {
	return s.services.watch(stream.Context(), req.GetNamespace(), req.GetLabelSelector(), func(t weirv1.WatchEventType, o *weirv1.Service) error {
		return stream.Send(&weirv1.WatchServicesResponse{Type: t, Service: o})
	})
}

func (s *RegistryService) CreateEndpointSlice(_ context.Context, req *weirv1.CreateEndpointSliceRequest) (*weirv1.CreateEndpointSliceResponse, error) {
	obj, err := s.endpoints.create(req.GetEndpointSlice(), req.GetValidateOnly())
	return &weirv1.CreateEndpointSliceResponse{EndpointSlice: obj}, err
}

func (s *RegistryService) GetEndpointSlice(_ context.Context, req *weirv1.GetEndpointSliceRequest) (*weirv1.GetEndpointSliceResponse, error) {
	obj, err := s.endpoints.get(req.GetNamespace(), req.GetName())
	return &weirv1.GetEndpointSliceResponse{EndpointSlice: obj}, err
}

func (s *RegistryService) ListEndpointSlices(_ context.Context, req *weirv1.ListEndpointSlicesRequest) (*weirv1.ListEndpointSlicesResponse, error) {
	objs, rv, next, err := s.endpoints.list(req.GetNamespace(), req.GetLabelSelector(), req)
	return &weirv1.ListEndpointSlicesResponse{EndpointSlices: objs, ResourceVersion: revisionString(rv), Revision: rv, NextPageToken: next}, err
}

func (s *RegistryService) UpdateEndpointSlice(_ context.Context, req *weirv1.UpdateEndpointSliceRequest) (*weirv1.UpdateEndpointSliceResponse, error) {
	obj, err := s.endpoints.update(req.GetEndpointSlice(), req.GetValidateOnly())
	return &weirv1.UpdateEndpointSliceResponse{EndpointSlice: obj}, err
}

func (s *RegistryService) DeleteEndpointSlice(_ context.Context, req *weirv1.DeleteEndpointSliceRequest) (*weirv1.DeleteEndpointSliceResponse, error) {
	rv, err := s.endpoints.delete(req.GetNamespace(), req.GetName(), req.GetResourceVersion())
	return &weirv1.DeleteEndpointSliceResponse{ResourceVersion: revisionString(rv), Revision: rv}, err
}

func (s *RegistryService) WatchEndpointSlices(req *weirv1.WatchEndpointSlicesRequest, stream weirv1.RegistryService_WatchEndpointSlicesServer) error {
	return s.endpoints.watch(stream.Context(), req.GetNamespace(), req.GetLabelSelector(), func(t weirv1.WatchEventType, o *weirv1.EndpointSlice) error {
		return stream.Send(&weirv1.WatchEndpointSlicesResponse{Type: t, EndpointSlice: o})
	})
}

func (s *RegistryService) CreateNode(_ context.Context, req *weirv1.CreateNodeRequest) (*weirv1.CreateNodeResponse, error) {
	obj, err := s.nodes.create(req.GetNode(), req.GetValidateOnly())
	return &weirv1.CreateNodeResponse{Node: obj}, err
}

func (s *RegistryService) GetNode(_ context.Context, req *weirv1.GetNodeRequest) (*weirv1.GetNodeResponse, error) {
	obj, err := s.nodes.get("", req.GetName())
	return &weirv1.GetNodeResponse{Node: obj}, err
}

func (s *RegistryService) ListNodes(_ context.Context, req *weirv1.ListNodesRequest) (*weirv1.ListNodesResponse, error) {
	objs, rv, next, err := s.nodes.list("", req.GetLabelSelector(), req)
	return &weirv1.ListNodesResponse{Nodes: objs, ResourceVersion: revisionString(rv), Revision: rv, NextPageToken: next}, err
}

func (s *RegistryService) UpdateNode(_ context.Context, req *weirv1.UpdateNodeRequest) (*weirv1.UpdateNodeResponse, error) {
	obj, err := s.nodes.update(req.GetNode(), req.GetValidateOnly())
	return &weirv1.UpdateNodeResponse{Node: obj}, err
}

func (s *RegistryService) DeleteNode(_ context.Context, req *weirv1.DeleteNodeRequest) (*weirv1.DeleteNodeResponse, error) {
	rv, err := s.nodes.delete("", req.GetName(), req.GetResourceVersion())
	return &weirv1.DeleteNodeResponse{ResourceVersion: revisionString(rv), Revision: rv}, err
}

func (s *RegistryService) WatchNodes(req *weirv1.WatchNodesRequest, stream weirv1.RegistryService_WatchNodesServer) error {
	return s.nodes.watch(stream.Context(), "", req.GetLabelSelector(), func(t weirv1.WatchEventType, o *weirv1.Node) error {
		return stream.Send(&weirv1.WatchNodesResponse{Type: t, Node: o})
	})
}

// poolFromAPI reads a pool given through this API, which registers
// namespaces by name only: a namespace selector could select no service
// it registers, so it is refused rather than kept doing nothing.
func poolFromAPI(p *weirv1.AddressPool) (*model.AddressPool, error) {
	if len(p.GetServiceAllocation().GetNamespaceSelector()) > 0 {
		return nil, &model.FieldError{Field: "service_allocation.namespace_selector",
			Reason: "namespaces registered through this API have no labels: list them in service_allocation.namespaces, or select by label on a WeirAddressPool in Kubernetes"}
	}
	return resourcewire.PoolFromProto(p)
}
