package auth

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/weirlb/weir/internal/bounded"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// AuditOptions log one line (message "audit") for every write the API is
// asked for, whatever its result, and every call it denies: who (the
// certificate's name and role, or the peer's address in plain text), the
// method, the resource (for an Apply, how many it carries), the result,
// whether it was a dry run (validate_only: nothing written) and, for a
// write done, its revision. An Apply done adds one line for each resource
// it wrote (kind, resource, created or replaced), so that a change among
// many is named as plainly as one alone. Writes are INFO, denials WARN,
// and writes the server failed to make (Internal, Unavailable, DataLoss,
// Unknown) ERROR. They come first in the chain, so the denials of the
// roles are seen.
//
// A caller cannot flood the log: each value is cut to MaxAuditValue bytes
// (a line has a fixed set of values), and a caller's denied calls log at
// most deniedBurst lines, then one a second, with the count of those left
// out.
func AuditOptions(log *slog.Logger) []grpc.ServerOption {
	a := &auditor{log: log, denials: map[string]*denials{}}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			a.audit(ctx, info.FullMethod, req, resp, err)
			return resp, err
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, ss)
			a.audit(ss.Context(), info.FullMethod, nil, nil, err)
			return err
		}),
	}
}

// MaxAuditValue is the most of one value (a resource name, an error) an
// audit line carries; the rest is said as a count of bytes.
const MaxAuditValue = 256

// Denied calls' lines: a burst per caller, then one a second.
const (
	deniedBurst = 10
	// maxDeniedCallers bounds the callers tracked; past it the oldest
	// records are dropped (a fresh caller gets a fresh burst).
	maxDeniedCallers = 4096
)

type auditor struct {
	log *slog.Logger

	mu      sync.Mutex // guards denials
	denials map[string]*denials
}

// denials is one caller's budget of denial lines.
type denials struct {
	limit      *rate.Limiter
	suppressed int
	seen       time.Time
}

func (a *auditor) audit(ctx context.Context, method string, req, resp any, err error) {
	code := status.Code(err)
	denied := code == codes.PermissionDenied || code == codes.Unauthenticated
	if !denied && !isWrite(method) {
		return
	}
	who := Caller(ctx)
	suppressed := 0
	if denied {
		var ok bool
		if ok, suppressed = a.allowDenial(who); !ok {
			return
		}
	}
	call := []any{"who", short(who), "method", short(strings.TrimPrefix(method, "/")), "result", code.String()}
	attrs := slices.Clone(call)
	if r := resource(req); r != "" {
		attrs = append(attrs, "resource", short(r))
	}
	batch, isApply := req.(*weirv1.ApplyRequest)
	if isApply {
		attrs = append(attrs, "resources", len(batch.GetResources()))
	}
	dryRun := boolField(req, "validate_only")
	if dryRun {
		attrs = append(attrs, "dry_run", true)
	}
	revision := ""
	if err == nil {
		if rv := field(resp, "resource_version"); rv != "" && !dryRun {
			revision = rv
			attrs = append(attrs, "revision", rv)
		}
	} else {
		attrs = append(attrs, "error", short(status.Convert(err).Message()))
	}
	level := slog.LevelInfo
	switch code {
	case codes.PermissionDenied, codes.Unauthenticated:
		level = slog.LevelWarn
		if suppressed > 0 {
			attrs = append(attrs, "denials_not_logged", suppressed)
		}
	case codes.Internal, codes.Unavailable, codes.DataLoss, codes.Unknown:
		// The server failed a write it should have made (a full disk, a
		// store out of reach): an operator must hear of it.
		level = slog.LevelError
	}
	a.log.Log(ctx, level, "audit", attrs...)
	if isApply && revision != "" {
		for _, w := range applied(batch, resp) {
			a.log.Log(ctx, level, "audit", append(slices.Clone(call), "kind", w.kind, "resource", short(w.name), "verb", w.verb, "revision", revision)...)
		}
	}
}

// allowDenial says whether a denied call of who gets its line, and how
// many of who's denials went unlogged before it.
func (a *auditor) allowDenial(who string) (bool, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.denials[who]
	if d == nil {
		if len(a.denials) >= maxDeniedCallers {
			a.forgetOldest()
		}
		d = &denials{limit: rate.NewLimiter(1, deniedBurst)}
		a.denials[who] = d
	}
	d.seen = time.Now()
	if !d.limit.Allow() {
		d.suppressed++
		return false, 0
	}
	n := d.suppressed
	d.suppressed = 0
	return true, n
}

// forgetOldest drops the half of the records seen longest ago.
func (a *auditor) forgetOldest() {
	seen := make([]time.Time, 0, len(a.denials))
	for _, d := range a.denials {
		seen = append(seen, d.seen)
	}
	slices.SortFunc(seen, time.Time.Compare)
	cut := seen[len(seen)/2]
	for who, d := range a.denials {
		if d.seen.Before(cut) {
			delete(a.denials, who)
		}
	}
}

// short cuts s to MaxAuditValue bytes.
func short(s string) string { return bounded.String(s, MaxAuditValue) }

// write is one resource an Apply wrote.
type write struct {
	kind string // "addresspool"
	name string // "namespace/name"
	verb string // "created", "replaced"
}

// applied lists the resources req wrote, in its order, as resp says.
func applied(req *weirv1.ApplyRequest, resp any) []write {
	r, ok := resp.(*weirv1.ApplyResponse)
	if !ok || r == nil {
		return nil
	}
	var out []write
	for i, res := range r.GetResults() {
		if i >= len(req.GetResources()) {
			break
		}
		var kind string
		req.GetResources()[i].ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			kind = string(fd.Name())
			return false
		})
		out = append(out, write{kind: strings.ReplaceAll(kind, "_", ""), name: resource(req.GetResources()[i]),
			verb: map[bool]string{true: "created", false: "replaced"}[res.GetCreated()]})
	}
	return out
}

// boolField reads a top-level bool field of a message.
func boolField(m any, name protoreflect.Name) bool {
	msg, ok := m.(proto.Message)
	if !ok || msg == nil || !msg.ProtoReflect().IsValid() {
		return false
	}
	r := msg.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(name)
	return fd != nil && fd.Kind() == protoreflect.BoolKind && r.Get(fd).Bool()
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
