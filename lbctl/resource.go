package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

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
// get, apply and delete each have one path for all kinds.
type kind struct {
	name       string   // as in documents: "Service"
	singular   string   // as in messages and output lines: "service"
	plural     string   // "services"
	aliases    []string // further spellings accepted on the command line
	field      string   // the request field; server errors name paths from it
	namespaced bool
	columns    []column // between NAME and AGE
	wide       []column // after AGE with -o wide, before LABELS

	new    func() object
	get    func(ctx context.Context, c client, ns, name string) (object, error)
	list   func(ctx context.Context, c client, ns, selector string) ([]object, error)
	create func(ctx context.Context, c client, o object) error
	update func(ctx context.Context, c client, o object) error
	delete func(ctx context.Context, c client, ns, name string) error
}

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
			r, err := c.ListServices(ctx, &weirv1.ListServicesRequest{Namespace: ns, LabelSelector: sel})
			return objects(r.GetServices()), err
		},
		create: func(ctx context.Context, c client, o object) error {
			_, err := c.CreateService(ctx, &weirv1.CreateServiceRequest{Service: o.(*weirv1.Service)})
			return err
		},
		update: func(ctx context.Context, c client, o object) error {
			_, err := c.UpdateService(ctx, &weirv1.UpdateServiceRequest{Service: o.(*weirv1.Service)})
			return err
		},
		delete: func(ctx context.Context, c client, ns, name string) error {
			_, err := c.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: ns, Name: name})
			return err
		},
	},
	{
		name: "EndpointSlice", singular: "endpointslice", plural: "endpointslices", aliases: []string{"eps"},
		field: "endpoint_slice", namespaced: true, columns: endpointSliceColumns, wide: endpointSliceWide,
		new: func() object { return &weirv1.EndpointSlice{} },
		get: func(ctx context.Context, c client, ns, name string) (object, error) {
			r, err := c.GetEndpointSlice(ctx, &weirv1.GetEndpointSliceRequest{Namespace: ns, Name: name})
			return orNil(r.GetEndpointSlice(), err)
		},
		list: func(ctx context.Context, c client, ns, sel string) ([]object, error) {
			r, err := c.ListEndpointSlices(ctx, &weirv1.ListEndpointSlicesRequest{Namespace: ns, LabelSelector: sel})
			return objects(r.GetEndpointSlices()), err
		},
		create: func(ctx context.Context, c client, o object) error {
			_, err := c.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: o.(*weirv1.EndpointSlice)})
			return err
		},
		update: func(ctx context.Context, c client, o object) error {
			_, err := c.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: o.(*weirv1.EndpointSlice)})
			return err
		},
		delete: func(ctx context.Context, c client, ns, name string) error {
			_, err := c.DeleteEndpointSlice(ctx, &weirv1.DeleteEndpointSliceRequest{Namespace: ns, Name: name})
			return err
		},
	},
	{
		name: "Node", singular: "node", plural: "nodes", aliases: []string{"no"},
		field: "node", namespaced: false, columns: nodeColumns,
		new: func() object { return &weirv1.Node{} },
		get: func(ctx context.Context, c client, _, name string) (object, error) {
			r, err := c.GetNode(ctx, &weirv1.GetNodeRequest{Name: name})
			return orNil(r.GetNode(), err)
		},
		list: func(ctx context.Context, c client, _, sel string) ([]object, error) {
			r, err := c.ListNodes(ctx, &weirv1.ListNodesRequest{LabelSelector: sel})
			return objects(r.GetNodes()), err
		},
		create: func(ctx context.Context, c client, o object) error {
			_, err := c.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: o.(*weirv1.Node)})
			return err
		},
		update: func(ctx context.Context, c client, o object) error {
			_, err := c.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: o.(*weirv1.Node)})
			return err
		},
		delete: func(ctx context.Context, c client, _, name string) error {
			_, err := c.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: name})
			return err
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
	return nil, usageErrorf("unknown resource type %q (want services, endpointslices or nodes)", arg)
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
