package server_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/servertest"
)

// On a full disk the store refuses writes: the registry's health says so
// (the server's stays SERVING: reads and the agents' streams go on),
// GetServerInfo names the error, and once there is room a write is taken
// and the health comes back by itself.
func TestAFullDiskShowsInHealthAndComesBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a small tmpfs: run as root (CI does)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "weir-test-full", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	ts := servertest.Start(t, filepath.Join(dir, "data"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	health := healthpb.NewHealthClient(ts.Conn)
	registryHealth := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health of %q: %v", service, err)
		}
		return r.GetStatus()
	}
	if s := registryHealth("weir.v1.RegistryService"); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("registry health before: %v", s)
	}

	// Fill the disk.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()

	labels := map[string]string{}
	for i := range 60 {
		labels[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 63)
	}
	var werr error
	for i := 0; i < 2000 && werr == nil; i++ {
		_, werr = ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{
			Metadata: &weirv1.ObjectMeta{Name: fmt.Sprintf("n%d", i), Labels: labels}, Addresses: []string{"192.0.2.11"}}})
	}
	if status.Code(werr) != codes.Internal {
		t.Fatalf("writes on a full disk: %v; want one refused (Internal)", werr)
	}
	if s := registryHealth("weir.v1.RegistryService"); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("registry health after a refused write: %v; want NOT_SERVING", s)
	}
	if s := registryHealth(""); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("server health after a refused write: %v; want SERVING (reads and streams go on)", s)
	}
	info, err := weirv1.NewStatusServiceClient(ts.Conn).GetServerInfo(ctx, &weirv1.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.GetStoreWriteError(), "no space left on device") || info.GetStoreWriteFailingSince() == nil {
		t.Errorf("server info on a full disk: error %q since %v; want the disk named, and a time", info.GetStoreWriteError(), info.GetStoreWriteFailingSince())
	}
	if _, err := ts.Registry.ListNodes(ctx, &weirv1.ListNodesRequest{}); err != nil {
		t.Errorf("a read on a full disk: %v", err)
	}

	// Room again: the next write is taken, and the health is back.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{
		Metadata: &weirv1.ObjectMeta{Name: "after"}, Addresses: []string{"192.0.2.12"}}}); err != nil {
		t.Fatalf("a write with room again: %v", err)
	}
	if s := registryHealth("weir.v1.RegistryService"); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("registry health after a write taken: %v; want SERVING", s)
	}
	info, err = weirv1.NewStatusServiceClient(ts.Conn).GetServerInfo(ctx, &weirv1.GetServerInfoRequest{})
	if err != nil || info.GetStoreWriteError() != "" {
		t.Errorf("server info with room again: %v, error %q; want none", err, info.GetStoreWriteError())
	}
}
