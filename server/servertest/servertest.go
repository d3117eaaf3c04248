// Package servertest runs a real weir-server on a loopback port, for the
// tests of the server and of its clients.
package servertest

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/agentsync"
)

// Server is a running server and a client connection to it.
type Server struct {
	Addr     string
	DataDir  string
	Conn     *grpc.ClientConn
	Registry weirv1.RegistryServiceClient
	Agents   weirv1.AgentServiceClient
	// Hub is the server's agent hub, for tests that look inside.
	Hub  *agentsync.Hub
	stop func()
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
		Registry: weirv1.NewRegistryServiceClient(conn), Agents: weirv1.NewAgentServiceClient(conn), Hub: srv.Agents,
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
