// Package servertest runs a real weir-server on a loopback port, for the
// tests of the server and of its clients.
package servertest

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weirlb/weir/internal/tlsconfig"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/certs"
)

// Server is a running server and a client connection to it.
type Server struct {
	Addr     string
	DataDir  string
	Conn     *grpc.ClientConn
	Registry weirv1.RegistryServiceClient
	Agents   weirv1.AgentServiceClient
	// Hub is the server's agent hub, for tests that look inside.
	Hub *agentsync.Hub
	// Server is the server itself, for what it serves beside gRPC.
	Server *server.Server
	stop   func()
}

// Start serves dataDir in plain text on 127.0.0.1 until the test ends or
// Stop is called; options adjust the server's configuration.
func Start(t testing.TB, dataDir string, options ...func(*server.Config)) *Server {
	t.Helper()
	cfg := server.Config{DataDir: dataDir, Log: slog.New(slog.DiscardHandler)}
	for _, o := range options {
		o(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{
		Addr: lis.Addr().String(), DataDir: dataDir, Conn: conn,
		Registry: weirv1.NewRegistryServiceClient(conn), Agents: weirv1.NewAgentServiceClient(conn), Hub: srv.Agents, Server: srv,
	}
	s.stop = func() {
		conn.Close()
		cancel()
		<-done
	}
	t.Cleanup(s.Stop)
	return s
}

// Stop shuts the server down and waits for it; later calls do nothing.
func (s *Server) Stop() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// Roles are the clients PKI issues certificates for: a name of each role.
var Roles = map[string]string{"alice": certs.RoleAdmin, "victor": certs.RoleViewer, "node1": certs.RoleAgent, certs.FleetAgentName: certs.RoleAgent}

// PKI issues, in a new temporary directory, a CA, a server certificate
// for 127.0.0.1 and one client certificate for each of Roles, named after
// the client ("alice.crt", "alice.key").
func PKI(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := certs.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := certs.IssueServer(dir, []string{"127.0.0.1", "weir-server"}); err != nil {
		t.Fatal(err)
	}
	for name, role := range Roles {
		if err := certs.IssueClient(dir, name, role); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TLS is a server option for mutual TLS with the certificates PKI wrote
// to dir.
func TLS(t testing.TB, dir string) func(*server.Config) {
	t.Helper()
	cfg, err := tlsconfig.Load(tlsconfig.Files{Cert: filepath.Join(dir, "server.crt"), Key: filepath.Join(dir, "server.key"), CA: filepath.Join(dir, "ca.crt")}, tlsconfig.Options{Use: "server"})
	if err != nil {
		t.Fatal(err)
	}
	return func(c *server.Config) { c.TLS = cfg }
}

// Dial connects to addr as client (a name PKI issued; "" for none),
// closing the connection when the test ends.
func Dial(t testing.TB, addr, dir, client string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	files := tlsconfig.Files{CA: filepath.Join(dir, "ca.crt")}
	if client != "" {
		files.Cert, files.Key = filepath.Join(dir, client+".crt"), filepath.Join(dir, client+".key")
	}
	cfg, err := tlsconfig.Client(files)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
