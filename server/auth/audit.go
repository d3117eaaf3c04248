package auth

import (
	"cmp"
	"context"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// AuditOptions log one line (message "audit") for every write the API is
// asked for, whatever its result, and every call it denies: who (the
// certificate's name and role, or the peer's address in plain text), the
// method, the resource, the result and, for a write done, its revision.
// They come first in the chain, so the denials of the roles are seen.
func AuditOptions(log *slog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			audit(ctx, log, info.FullMethod, req, resp, err)
			return resp, err
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, ss)
			audit(ss.Context(), log, info.FullMethod, nil, nil, err)
			return err
		}),
	}
}

func audit(ctx context.Context, log *slog.Logger, method string, req, resp any, err error) {
	code := status.Code(err)
	denied := code == codes.PermissionDenied || code == codes.Unauthenticated
	if !denied && !isWrite(method) {
		return
	}
	attrs := []any{"who", Caller(ctx), "method", strings.TrimPrefix(method, "/"), "result", code.String()}
	if r := resource(req); r != "" {
		attrs = append(attrs, "resource", r)
	}
	if err == nil {
		if rv := field(resp, "resource_version"); rv != "" {
			attrs = append(attrs, "revision", rv)
		}
	} else {
		attrs = append(attrs, "error", status.Convert(err).Message())
	}
	level := slog.LevelInfo
	if denied {
		level = slog.LevelWarn
	}
	log.Log(ctx, level, "audit", attrs...)
}

// isWrite: every registry method but reads.
func isWrite(method string) bool {
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	return svc == "weir.v1.RegistryService" &&
		!strings.HasPrefix(name, "Get") && !strings.HasPrefix(name, "List") && !strings.HasPrefix(name, "Watch")
}

// Caller names the caller from its certificate (whether or not its role
// allows the call), else by address.
func Caller(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "unknown"
	}
	if id, ok := certIdentity(p); ok {
		return id.Name + " (" + cmp.Or(id.Role, "none") + ")"
	}
	return "unauthenticated " + p.Addr.String()
}

// resource is "namespace/name" of what a request is about: its own name
// fields, or those of the resource it carries.
func resource(req any) string {
	name, ns := field(req, "name"), field(req, "namespace")
	if ns != "" {
		return ns + "/" + name
	}
	return name
}

// field reads a top-level string field of a message, or of the resource
// it carries ("resource_version" of a created service).
func field(m any, name protoreflect.Name) string {
	msg, ok := m.(proto.Message)
	if !ok || msg == nil {
		return ""
	}
	r := msg.ProtoReflect()
	if !r.IsValid() {
		return ""
	}
	if fd := r.Descriptor().Fields().ByName(name); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() {
		return r.Get(fd).String()
	}
	var found string
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() {
			if md := v.Message().Descriptor().Fields().ByName("metadata"); md != nil {
				found = field(v.Message().Get(md).Message().Interface(), name)
				return false
			}
		}
		return true
	})
	return found
}
