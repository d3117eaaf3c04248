//lint:file-ignore SA1019 answers still fill the deprecated resource_version, the revision as a string, for clients of the previous release

package api

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// Apply writes every resource of the request in one registry batch: one
// revision, all or nothing.
func (s *RegistryService) Apply(_ context.Context, req *weirv1.ApplyRequest) (*weirv1.ApplyResponse, error) {
	var objs []model.Object
	var fields []string
	seen := map[string]int{}
	for i, res := range req.GetResources() {
		var obj model.Object
		var field string
		var err error
		switch r := res.GetResource().(type) {
		case *weirv1.ApplyResource_Service:
			field = "service"
			obj, err = s.services.prepare(r.Service)
		case *weirv1.ApplyResource_EndpointSlice:
			field = "endpoint_slice"
			obj, err = s.endpoints.prepare(r.EndpointSlice)
		case *weirv1.ApplyResource_Node:
			field = "node"
			obj, err = s.nodes.prepare(r.Node)
		case *weirv1.ApplyResource_AddressPool:
			field = "address_pool"
			obj, err = s.pools.prepare(r.AddressPool)
		case *weirv1.ApplyResource_BgpPeer:
			field = "bgp_peer"
			obj, err = s.peers.prepare(r.BgpPeer)
		case *weirv1.ApplyResource_ServiceCidr:
			field = "service_cidr"
			obj, err = s.cidrs.prepare(r.ServiceCidr)
		default:
			return nil, status.Errorf(codes.InvalidArgument, "resources[%d]: no resource", i)
		}
		path := fmt.Sprintf("resources[%d].%s", i, field)
		if err != nil {
			return nil, batchStatus(path, err)
		}
		id := field + "/" + obj.GetMeta().Key()
		if j, dup := seen[id]; dup {
			return nil, status.Errorf(codes.InvalidArgument, "%s: the same resource as resources[%d]", path, j)
		}
		seen[id] = i
		objs, fields = append(objs, obj), append(fields, path)
	}
	rev, applied, err := s.reg.ApplySpec(objs, req.GetValidateOnly())
	if err != nil {
		var be *registry.BatchError
		if errors.As(err, &be) {
			return nil, batchStatus(fields[be.Index], be.Err)
		}
		return nil, Status("", err)
	}
	resp := &weirv1.ApplyResponse{ResourceVersion: revisionString(rev), Revision: rev}
	for _, a := range applied {
		r := &weirv1.ApplyResult{Resource: s.wire(a.Object), Created: a.Created}
		if a.Old != nil {
			r.Previous = s.wire(a.Old)
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

// batchStatus is Status with the resource's place in the batch named.
func batchStatus(path string, err error) error {
	if _, ok := model.AsFieldError(err); ok {
		return Status(path, err)
	}
	return Status("", fmt.Errorf("%s: %w", path, err))
}

// wire is a stored resource in its wire form.
func (s *RegistryService) wire(obj model.Object) *weirv1.ApplyResource {
	switch o := obj.(type) {
	case *model.Service:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Service{Service: s.services.to(o)}}
	case *model.EndpointSlice:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_EndpointSlice{EndpointSlice: s.endpoints.to(o)}}
	case *model.Node:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Node{Node: s.nodes.to(o)}}
	case *model.AddressPool:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_AddressPool{AddressPool: s.pools.to(o)}}
	case *model.BGPPeer:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_BgpPeer{BgpPeer: s.peers.to(o)}}
	case *model.ServiceCIDR:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_ServiceCidr{ServiceCidr: s.cidrs.to(o)}}
	}
	return nil
}

// prepare reads one resource of a batch as an update of it would:
// native; what an update keeps the registry decides when it makes the
// write (Registry.ApplySpec).
func (r resource[T, P]) prepare(p P) (model.Object, error) {
	obj, err := r.from(p)
	if err != nil {
		return nil, err
	}
	obj.GetMeta().Source = model.SourceNative
	return obj, nil
}
