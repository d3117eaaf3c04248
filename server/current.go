package server

import (
	"context"
	"strings"

	"google.golang.org/grpc"

	"github.com/weirlb/weir/server/agentsync"
)

// currentOnly refuses every call of the registry and the status services
// while this replica is not current (it lost its store, or fell behind
// it): what it holds may be behind the cluster's state, so a read would
// show what is no longer so and a write would be decided against it. The
// refusal is Unavailable, "replica not current: why", which clients take
// as a cue to try another replica. Agents' and speakers' streams are the
// hub's to end (agentsync.Hub.SetNotCurrent); health and reflection keep
// answering, so that clients can tell.
func currentOnly(hub *agentsync.Hub) []grpc.ServerOption {
	gated := func(method string) bool {
		svc, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		return svc == "weir.v1.RegistryService" || svc == "weir.v1.StatusService"
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if gated(info.FullMethod) {
				if err := hub.CurrentErr(false); err != nil {
					return nil, err
				}
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if gated(info.FullMethod) {
				if err := hub.CurrentErr(false); err != nil {
					return err
				}
			}
			return h(srv, ss)
		}),
	}
}
