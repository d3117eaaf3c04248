// Package auth decides who may call what: every caller presents a client
// certificate (mTLS) whose CommonName is its identity and whose
// Organization "weir:<role>" is its role. Admins write, viewers read, and an
// agent may only stream the state of the node it is named after.
package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/server/certs"
)

// Identity is an authenticated caller.
type Identity struct {
	Name string
	Role string
	// NodeToken: an agent on the shared certificate whose node token
	// names the node Name (Options.NodeTokens).
	NodeToken bool
}

type identityKey struct{}

// FromContext returns the caller's identity; ok is false without
// authentication (plain text).
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// rolesFor lists the roles that may call a full method name.
func rolesFor(method string) []string {
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	switch svc {
	case "weir.v1.RegistryService":
		if strings.HasPrefix(name, "Get") || strings.HasPrefix(name, "List") || strings.HasPrefix(name, "Watch") {
			return []string{certs.RoleAdmin, certs.RoleViewer}
		}
		return []string{certs.RoleAdmin}
	case "weir.v1.StatusService":
		return []string{certs.RoleAdmin, certs.RoleViewer}
	case "weir.v1.AgentService":
		return []string{certs.RoleAgent}
	case "weir.v1.LoadBalancerTierService":
		return []string{certs.RoleSpeaker}
	case "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection":
		return []string{certs.RoleAdmin, certs.RoleViewer, certs.RoleAgent, certs.RoleSpeaker}
	}
	return nil
}

// authorize finds the caller and checks its role for method.
func (o Options) authorize(ctx context.Context, tokens *nodeTokens, method string) (context.Context, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	id, ok := certIdentity(p)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "a client certificate signed by the server's CA is required")
	}
	if id.Name == certs.FleetAgentName && id.Role == certs.RoleAgent {
		var err error
		if id, err = o.bindShared(ctx, tokens, id); err != nil {
			return nil, err
		}
	}
	allowed := rolesFor(method)
	for _, r := range allowed {
		if r == id.Role {
			return context.WithValue(ctx, identityKey{}, id), nil
		}
	}
	return nil, status.Errorf(codes.PermissionDenied, "%s (role %q) may not call %s; it needs one of the roles %v", id.Name, id.Role, method, allowed)
}

// Certified is the identity of ctx's peer by its verified client
// certificate, whether or not its role allows what it calls; false without
// one (plain text).
func Certified(ctx context.Context) (Identity, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, false
	}
	return certIdentity(p)
}

// certIdentity reads the name and role of a peer's verified client
// certificate; false without one.
func certIdentity(p *peer.Peer) (Identity, bool) {
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	cert := info.State.VerifiedChains[0][0]
	id := Identity{Name: cert.Subject.CommonName}
	var roles []string
	for _, o := range cert.Subject.Organization {
		if r, ok := strings.CutPrefix(o, certs.RolePrefix); ok && !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	switch len(roles) {
	case 0:
	case 1:
		id.Role = roles[0]
	default:
		// Which one was meant is not for the server to guess: none holds.
		id.Role = "several: " + strings.Join(roles, ", ")
	}
	return id, true
}

// ServerOptions are the interceptors that enforce the roles.
func ServerOptions(o Options) []grpc.ServerOption {
	var tokens *nodeTokens
	if o.NodeTokens != nil {
		tokens = newNodeTokens(o.NodeTokens)
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			ctx, err := o.authorize(ctx, tokens, info.FullMethod)
			if err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			ctx, err := o.authorize(ss.Context(), tokens, info.FullMethod)
			if err != nil {
				return err
			}
			return h(srv, &identityStream{ss, ctx})
		}),
	}
}

type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// AuthorizeNode checks that the caller may speak for node: only the agent
// named after it may, when callers are authenticated.
func AuthorizeNode(ctx context.Context, node string) error {
	id, ok := FromContext(ctx)
	if !ok {
		return nil // plain text: no identities
	}
	if id.Name != node && id.Name != certs.FleetAgentName {
		return status.Error(codes.PermissionDenied, fmt.Sprintf("hello.node_name: agent %q may not stream the state of node %q", id.Name, node))
	}
	return nil
}

// AuthorizeSpeaker checks that the caller may speak for the named
// load-balancer speaker.
func AuthorizeSpeaker(ctx context.Context, field, speaker string) error {
	id, ok := FromContext(ctx)
	if ok && id.Name != speaker {
		return status.Error(codes.PermissionDenied, fmt.Sprintf("%s: speaker %q may not act as %q", field, id.Name, speaker))
	}
	return nil
}
