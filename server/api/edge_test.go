package api

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// edge serves the package's services as the server assembles them, over a
// registry in a temporary folder and a hub with no agent, on a real gRPC
// connection (in memory): a test sees what a client sees, codes and
// details included.
type edge struct {
	reg      *registry.Registry
	hub      *agentsync.Hub
	registry weirv1.RegistryServiceClient
	status   weirv1.StatusServiceClient
	tier     weirv1.LoadBalancerTierServiceClient
}

func startEdge(t *testing.T) *edge {
	t.Helper()
	reg := registrytest.Open(t)
	hub := agentsync.New(reg, agentsync.Config{})
	tier := NewLoadBalancerTierService(hub, reg)
	srv := grpc.NewServer()
	weirv1.RegisterRegistryServiceServer(srv, NewRegistryService(reg))
	weirv1.RegisterStatusServiceServer(srv, NewStatusService(hub, reg, ServerInfo{Version: "v0.0.0-test"}, tier, nil))
	weirv1.RegisterLoadBalancerTierServiceServer(srv, tier)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///api",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	return &edge{reg: reg, hub: hub, registry: weirv1.NewRegistryServiceClient(conn),
		status: weirv1.NewStatusServiceClient(conn), tier: weirv1.NewLoadBalancerTierServiceClient(conn)}
}

// wantCode fails the test unless err is a status of code whose message
// names field first ("" for any message).
func wantCode(t *testing.T, what string, err error, code codes.Code, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.HasPrefix(st.Message(), field) {
		t.Errorf("%s: %v %q; want %v naming %q", what, st.Code(), st.Message(), code, field)
	}
}

// wantField is wantCode for InvalidArgument, with the field also named
// as the one BadRequest violation, the form clients read.
func wantField(t *testing.T, what string, err error, field string) {
	t.Helper()
	wantCode(t, what, err, codes.InvalidArgument, field+":")
	var got []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				got = append(got, v.GetField())
			}
		}
	}
	if len(got) != 1 || got[0] != field {
		t.Errorf("%s: field violations %v; want [%s]", what, got, field)
	}
}

func node(name string, addrs ...string) *weirv1.Node {
	return &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: name}, Addresses: addrs}
}
