package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// object is what the three resource messages have in common.
type object interface {
	proto.Message
	GetMetadata() *weirv1.ObjectMeta
}

// client is the generated registry client; named so the table below stays short.
type client = weirv1.RegistryServiceClient

// kind binds one resource kind to its RPCs and its table columns, so that
// get, describe, apply and delete each have one path for all kinds.
type kind struct {
	name       string   // as in documents: "Service"
	singular   string   // as in messages and output lines: "service"
	plural     string   // "services"
	aliases    []string // further spellings accepted on the command line
	field      string   // the request field; server errors name paths from it
	namespaced bool
	outputOnly []string // top-level fields the server sets, beside metadata's
	columns    []column // between NAME and AGE
	wide       []column // after AGE with -o wide, before LABELS

	new  func() object
	get  func(ctx context.Context, c client, ns, name string) (object, error)
	list func(ctx context.Context, c client, ns, selector string) ([]object, error)
	// create and update answer the resource as the server stores it, or
	// with validateOnly would store it: normalized, defaults filled in.
	create func(ctx context.Context, c client, o object, validateOnly bool) (object, error)
	update func(ctx context.Context, c client, o object, validateOnly bool) (object, error)
	// delete returns the revision of the deletion.
	delete func(ctx context.Context, c client, ns, name string) (uint64, error)
	watch  func(ctx context.Context, c client, ns, selector string) (events, error)
}

// events returns a watch's next event; the object is nil for SYNCED.
type events func() (weirv1.WatchEventType, object, error)

var kinds = []*kind{
	{
		name: "Service", singular: "service", plural: "services", aliases: []string{"svc"},
		field: "service", namespaced: true, columns: serviceColumns, wide: serviceWide,
		new: func() object { return &weirv1.Service{} },
		get: func(ctx context.Context, c client, ns, name string) (object, error) {
			r, err := c.GetService(ctx, &weirv1.GetServiceRequest{Namespace: ns, Name: name})
			return orNil(r.GetService(), err)
		},
		list: func(ctx context.Context, c client, ns, sel string) ([]object, error) {
			items, err := listServices(ctx, c, &weirv1.ListServicesRequest{Namespace: ns, LabelSelector: sel})
			return objects(items), err
		},
		create: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.CreateService(ctx, &weirv1.CreateServiceRequest{Service: o.(*weirv1.Service), ValidateOnly: validateOnly})
			return orNil(r.GetService(), err)
		},
		update: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: o.(*weirv1.Service), ValidateOnly: validateOnly})
			return orNil(r.GetService(), err)
		},
		delete: func(ctx context.Context, c client, ns, name string) (uint64, error) {
			r, err := c.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: ns, Name: name})
			return revisionOf(r), err
		},
		watch: func(ctx context.Context, c client, ns, sel string) (events, error) {
			s, err := c.WatchServices(ctx, &weirv1.WatchServicesRequest{Namespace: ns, LabelSelector: sel})
			return recv(s, (*weirv1.WatchServicesResponse).GetService), err
		},
	},
	{
		name: "EndpointSlice", singular: "endpointslice", plural: "endpointslices", aliases: []string{"eps", "endpoints", "ep"},
		field: "endpoint_slice", namespaced: true, columns: endpointSliceColumns, wide: endpointSliceWide,
		new: func() object { return &weirv1.EndpointSlice{} },
		get: func(ctx context.Context, c client, ns, name string) (object, error) {
			r, err := c.GetEndpointSlice(ctx, &weirv1.GetEndpointSliceRequest{Namespace: ns, Name: name})
			return orNil(r.GetEndpointSlice(), err)
		},
		list: func(ctx context.Context, c client, ns, sel string) ([]object, error) {
			items, err := listEndpointSlices(ctx, c, &weirv1.ListEndpointSlicesRequest{Namespace: ns, LabelSelector: sel})
			return objects(items), err
		},
		create: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: o.(*weirv1.EndpointSlice), ValidateOnly: validateOnly})
			return orNil(r.GetEndpointSlice(), err)
		},
		update: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: o.(*weirv1.EndpointSlice), ValidateOnly: validateOnly})
			return orNil(r.GetEndpointSlice(), err)
		},
		delete: func(ctx context.Context, c client, ns, name string) (uint64, error) {
			r, err := c.DeleteEndpointSlice(ctx, &weirv1.DeleteEndpointSliceRequest{Namespace: ns, Name: name})
			return revisionOf(r), err
		},
		watch: func(ctx context.Context, c client, ns, sel string) (events, error) {
			s, err := c.WatchEndpointSlices(ctx, &weirv1.WatchEndpointSlicesRequest{Namespace: ns, LabelSelector: sel})
			return recv(s, (*weirv1.WatchEndpointSlicesResponse).GetEndpointSlice), err
		},
	},
	{
		name: "Node", singular: "node", plural: "nodes", aliases: []string{"no"},
		field: "node", namespaced: false, outputOnly: []string{"drained", "drain_deadline"}, columns: nodeColumns,
		new: func() object { return &weirv1.Node{} },
		get: func(ctx context.Context, c client, _, name string) (object, error) {
			r, err := c.GetNode(ctx, &weirv1.GetNodeRequest{Name: name})
			return orNil(r.GetNode(), err)
		},
		list: func(ctx context.Context, c client, _, sel string) ([]object, error) {
			items, err := listNodes(ctx, c, &weirv1.ListNodesRequest{LabelSelector: sel})
			return objects(items), err
		},
		create: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: o.(*weirv1.Node), ValidateOnly: validateOnly})
			return orNil(r.GetNode(), err)
		},
		update: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: o.(*weirv1.Node), ValidateOnly: validateOnly})
			return orNil(r.GetNode(), err)
		},
		delete: func(ctx context.Context, c client, _, name string) (uint64, error) {
			r, err := c.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: name})
			return revisionOf(r), err
		},
		watch: func(ctx context.Context, c client, _, sel string) (events, error) {
			s, err := c.WatchNodes(ctx, &weirv1.WatchNodesRequest{LabelSelector: sel})
			return recv(s, (*weirv1.WatchNodesResponse).GetNode), err
		},
	},
	{
		name: "AddressPool", singular: "pool", plural: "pools", aliases: []string{"addresspool", "addresspools"},
		field: "address_pool", namespaced: false, columns: poolColumns, wide: poolWide,
		new: func() object { return &weirv1.AddressPool{} },
		get: func(ctx context.Context, c client, _, name string) (object, error) {
			r, err := c.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: name})
			return orNil(r.GetAddressPool(), err)
		},
		list: func(ctx context.Context, c client, _, _ string) ([]object, error) {
			items, err := listAddressPools(ctx, c)
			return objects(items), err
		},
		create: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: o.(*weirv1.AddressPool), ValidateOnly: validateOnly})
			return orNil(r.GetAddressPool(), err)
		},
		update: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.UpdateAddressPool(ctx, &weirv1.UpdateAddressPoolRequest{AddressPool: o.(*weirv1.AddressPool), ValidateOnly: validateOnly})
			return orNil(r.GetAddressPool(), err)
		},
		delete: func(ctx context.Context, c client, _, name string) (uint64, error) {
			r, err := c.DeleteAddressPool(ctx, &weirv1.DeleteAddressPoolRequest{Name: name})
			return revisionOf(r), err
		},
		watch: func(context.Context, client, string, string) (events, error) {
			return nil, usageErrorf("address pools cannot be watched yet")
		},
	},
	{
		name: "BgpPeer", singular: "peer", plural: "peers", aliases: []string{"bgppeer", "bgppeers"},
		field: "bgp_peer", namespaced: false, columns: peerColumns, wide: peerWide,
		new: func() object { return &weirv1.BgpPeer{} },
		get: func(ctx context.Context, c client, _, name string) (object, error) {
			r, err := c.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: name})
			return orNil(r.GetBgpPeer(), err)
		},
		list: func(ctx context.Context, c client, _, _ string) ([]object, error) {
			items, err := listBgpPeers(ctx, c)
			return objects(items), err
		},
		create: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: o.(*weirv1.BgpPeer), ValidateOnly: validateOnly})
			return orNil(r.GetBgpPeer(), err)
		},
		update: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.UpdateBgpPeer(ctx, &weirv1.UpdateBgpPeerRequest{BgpPeer: o.(*weirv1.BgpPeer), ValidateOnly: validateOnly})
			return orNil(r.GetBgpPeer(), err)
		},
		delete: func(ctx context.Context, c client, _, name string) (uint64, error) {
			r, err := c.DeleteBgpPeer(ctx, &weirv1.DeleteBgpPeerRequest{Name: name})
			return revisionOf(r), err
		},
		watch: func(context.Context, client, string, string) (events, error) {
			return nil, usageErrorf("BGP peers cannot be watched yet")
		},
	},
	{
		name: "ServiceCidr", singular: "servicecidr", plural: "servicecidrs", aliases: []string{"servicecidr"},
		field: "service_cidr", namespaced: false, columns: serviceCIDRColumns,
		new: func() object { return &weirv1.ServiceCidr{} },
		get: func(ctx context.Context, c client, _, name string) (object, error) {
			r, err := c.GetServiceCidr(ctx, &weirv1.GetServiceCidrRequest{Name: name})
			return orNil(r.GetServiceCidr(), err)
		},
		list: func(ctx context.Context, c client, _, _ string) ([]object, error) {
			items, err := allPages(func(token string) ([]*weirv1.ServiceCidr, string, error) {
				r, err := c.ListServiceCidrs(ctx, &weirv1.ListServiceCidrsRequest{PageToken: token})
				return r.GetServiceCidrs(), r.GetNextPageToken(), err
			})
			return objects(items), err
		},
		create: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: o.(*weirv1.ServiceCidr), ValidateOnly: validateOnly})
			return orNil(r.GetServiceCidr(), err)
		},
		update: func(ctx context.Context, c client, o object, validateOnly bool) (object, error) {
			r, err := c.UpdateServiceCidr(ctx, &weirv1.UpdateServiceCidrRequest{ServiceCidr: o.(*weirv1.ServiceCidr), ValidateOnly: validateOnly})
			return orNil(r.GetServiceCidr(), err)
		},
		delete: func(ctx context.Context, c client, _, name string) (uint64, error) {
			r, err := c.DeleteServiceCidr(ctx, &weirv1.DeleteServiceCidrRequest{Name: name})
			return revisionOf(r), err
		},
		watch: func(context.Context, client, string, string) (events, error) {
			return nil, usageErrorf("service CIDRs cannot be watched yet")
		},
	},
}

// kindFor finds a kind by any of its command-line spellings.
func kindFor(arg string) (*kind, error) {
	arg = strings.ToLower(arg)
	for _, k := range kinds {
		if arg == k.singular || arg == k.plural || slices.Contains(k.aliases, arg) {
			return k, nil
		}
	}
	return nil, usageErrorf("unknown resource type %q (want %s)", arg, strings.Join(plurals(), ", "))
}

// kindNames lists the kinds as documents name them.
func kindNames() []string {
	var names []string
	for _, k := range kinds {
		names = append(names, k.name)
	}
	return names
}

// kindNamed finds a kind by its name in a document ("Service").
func kindNamed(name string) *kind {
	for _, k := range kinds {
		if k.name == name {
			return k
		}
	}
	return nil
}

// ref names one resource as the API keys it: "default/web", or "node1" for a node.
func (k *kind) ref(ns, name string) string {
	if k.namespaced {
		return ns + "/" + name
	}
	return name
}

// objRef is ref for a resource in hand.
func (k *kind) objRef(o object) string {
	return k.ref(o.GetMetadata().GetNamespace(), o.GetMetadata().GetName())
}

func objects[T object](xs []T) []object {
	out := make([]object, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// recv adapts one kind's watch stream to events.
func recv[R interface{ GetType() weirv1.WatchEventType }, T object](s interface{ Recv() (R, error) }, obj func(R) T) events {
	return func() (weirv1.WatchEventType, object, error) {
		r, err := s.Recv()
		if err != nil {
			return 0, nil, err
		}
		if r.GetType() == weirv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED {
			return r.GetType(), nil, nil // no object, and no typed nil in the interface
		}
		return r.GetType(), obj(r), nil
	}
}

// settable is o without what the server sets on every write (version,
// creation time, source) or alone (a node's drain), so that two
// versions compare equal when a write would change nothing.
func (k *kind) settable(o object) object {
	o = proto.Clone(o).(object)
	if m := o.GetMetadata(); m != nil {
		m.ResourceVersion, m.Revision, m.CreateTime, m.Source = "", 0, nil, ""
	}
	r := o.ProtoReflect()
	for _, f := range k.outputOnly {
		r.Clear(r.Descriptor().Fields().ByName(protoreflect.Name(f)))
	}
	return o
}

// orNil keeps a failed call from returning a typed nil inside a non-nil interface.
func orNil[T object](x T, err error) (object, error) {
	if err != nil {
		return nil, err
	}
	return x, nil
}

// describeKinds lists the spellings for help texts.
func describeKinds() string {
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s (%s)", k.plural, strings.Join(append([]string{k.singular}, k.aliases...), ", ")))
	}
	return strings.Join(parts, ", ")
}
