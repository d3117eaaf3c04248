package server_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/test/wait"
)

// Ready is what the kubelet's readiness probe reads (through /readyz):
// false before Serve, true while serving, false once stopped.
func TestReadyFollowsServing(t *testing.T) {
	srv, err := server.New(server.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if srv.Ready() {
		t.Error("ready before Serve")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	wait.Until(t, 5*time.Second, "ready while serving", srv.Ready)
	cancel()
	<-done
	if srv.Ready() {
		t.Error("ready after the server stopped")
	}
}
