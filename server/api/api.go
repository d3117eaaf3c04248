// Package api is the gRPC edge of the server: it translates requests into
// the registry's model types, and registry errors into gRPC status codes
// that name the field or the reason.
package api

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
)

// Status turns an error into a gRPC status. field is the request field the
// resource came in ("service"), so that a field error names its full path.
func Status(field string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if fe, ok := model.AsFieldError(err); ok {
		path := fe.Field
		if field != "" {
			path = field + "." + path
		}
		st := status.New(codes.InvalidArgument, path+": "+fe.Reason)
		if d, derr := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: path, Description: fe.Reason}}}); derr == nil {
			st = d
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, registry.ErrAlreadyExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, registry.ErrConflict):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, registry.ErrInUse):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, registry.ErrBehind):
		// The store (etcd) is away or this replica cannot catch up with
		// it. A write that timed out may still have been made: reading
		// says, and the registry reads it back if it was.
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// resource binds one kind of resource to its collection and translations.
type resource[T model.Object, P proto.Message] struct {
	field string // the request field that carries it: "service"
	coll  *registry.Collection[T]
	from  func(P) (T, error)
	to    func(T) P
}

func (r resource[T, P]) create(p P, validateOnly bool) (P, error) {
	obj, err := r.from(p)
	if err != nil {
		return *new(P), Status(r.field, err)
	}
	obj.GetMeta().Source = model.SourceNative // this API is the native source
	if validateOnly {
		obj, err = r.coll.CheckCreate(obj)
	} else {
		obj, err = r.coll.Create(obj)
	}
	if err != nil {
		return *new(P), Status(r.field, err)
	}
	return r.to(obj), nil
}

// update writes the request's spec: what Weir writes itself is kept as
// the registry decides when it makes the write (registry.Keep).
func (r resource[T, P]) update(p P, validateOnly bool) (P, error) {
	return r.updateKeeping(p, validateOnly, nil)
}

// updateKeeping is update with keep in place of the collection's rule
// for a spec update (nil: that rule).
func (r resource[T, P]) updateKeeping(p P, validateOnly bool, keep registry.Keep[T]) (P, error) {
	obj, err := r.from(p)
	if err != nil {
		return *new(P), Status(r.field, err)
	}
	obj.GetMeta().Source = model.SourceNative
	if keep != nil {
		obj, err = r.coll.UpdateKeeping(obj, keep, validateOnly)
	} else {
		obj, err = r.coll.UpdateSpec(obj, validateOnly)
	}
	if err != nil {
		return *new(P), Status(r.field, err)
	}
	return r.to(obj), nil
}

func (r resource[T, P]) get(namespace, name string) (P, error) {
	obj, err := r.coll.Get(key(namespace, name))
	if err != nil {
		return *new(P), Status("", err)
	}
	return r.to(obj), nil
}

// list is one page of the objects in namespace (all when "") that
// selector matches, the revision it was read at, and the next page's token.
func (r resource[T, P]) list(namespace, selector string, pg pageRequest) ([]P, uint64, string, error) {
	sel, err := registry.ParseSelector(selector)
	if err != nil {
		return nil, 0, "", status.Error(codes.InvalidArgument, "label_selector: "+err.Error())
	}
	objs, rev := r.coll.List(namespace, sel)
	out, next, err := page(objs, func(o T) string { return o.GetMeta().Key() }, r.to, pg)
	if err != nil {
		return nil, 0, "", err
	}
	return out, rev, next, nil
}

// delete deletes one object and returns the revision of the deletion.
func (r resource[T, P]) delete(namespace, name, resourceVersion string) (uint64, error) {
	var rv uint64
	if resourceVersion != "" {
		var err error
		if rv, err = strconv.ParseUint(resourceVersion, 10, 64); err != nil {
			return 0, status.Errorf(codes.InvalidArgument, "resource_version: %q is not a resource version", resourceVersion)
		}
	}
	rev, err := r.coll.Delete(key(namespace, name), rv, model.SourceNative)
	if err != nil {
		return 0, Status("", err)
	}
	return rev, nil
}

// revisionString is a store revision as resource_version spells it.
func revisionString(rev uint64) string { return strconv.FormatUint(rev, 10) }

// watch streams the initial state, a SYNCED marker, then every change.
func (r resource[T, P]) watch(ctx context.Context, namespace, selector string, send func(weirv1.WatchEventType, P) error) error {
	sel, err := registry.ParseSelector(selector)
	if err != nil {
		return status.Error(codes.InvalidArgument, "label_selector: "+err.Error())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	initial, events := r.coll.Watch(ctx, namespace, sel)
	for _, o := range initial {
		if err := send(weirv1.WatchEventType_WATCH_EVENT_TYPE_ADDED, r.to(o)); err != nil {
			return err
		}
	}
	if err := send(weirv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED, *new(P)); err != nil {
		return err
	}
	for ev := range events {
		typ := map[registry.EventType]weirv1.WatchEventType{
			registry.Added:    weirv1.WatchEventType_WATCH_EVENT_TYPE_ADDED,
			registry.Modified: weirv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED,
			registry.Deleted:  weirv1.WatchEventType_WATCH_EVENT_TYPE_DELETED,
		}[ev.Type]
		if err := send(typ, r.to(ev.Object)); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Errorf(codes.ResourceExhausted, "watch fell more than %d events behind; list and watch again", registry.WatchBuffer)
}

func key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}
