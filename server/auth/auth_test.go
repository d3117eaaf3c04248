package auth_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/servertest"
)

// pki issues a CA, the server's certificate and one client per role.
func pki(t *testing.T) string {
	t.Helper()
	dir := servertest.PKI(t)
	if err := certs.InitCA(dir); err == nil {
		t.Error("init over an existing CA succeeded; want a refusal")
	}
	return dir
}

func startTLSServer(t *testing.T, dir string) string {
	t.Helper()
	return servertest.Start(t, t.TempDir(), servertest.TLS(t, dir)).Addr
}

func dial(t *testing.T, addr, dir, client string) *grpc.ClientConn {
	t.Helper()
	return servertest.Dial(t, addr, dir, client)
}

func node(name string) *weirv1.Node {
	return &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: name}, Addresses: []string{"192.0.2.11"}}
}

func TestRolesDecideWhoMayCallWhat(t *testing.T) {
	dir := pki(t)
	addr := startTLSServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	admin := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "alice"))
	if _, err := admin.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("node1")}); err != nil {
		t.Fatalf("admin create: %v", err)
	}
	viewer := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "victor"))
	if _, err := viewer.ListNodes(ctx, &weirv1.ListNodesRequest{}); err != nil {
		t.Errorf("viewer list: %v", err)
	}
	if _, err := viewer.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("node2")}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("viewer create: got %v, want PermissionDenied", err)
	}
	if list, _ := admin.ListNodes(ctx, &weirv1.ListNodesRequest{}); len(list.GetNodes()) != 1 {
		t.Errorf("a refused create changed the registry: %v", list.GetNodes())
	}
	agentConn := dial(t, addr, dir, "node1")
	if _, err := weirv1.NewRegistryServiceClient(agentConn).ListNodes(ctx, &weirv1.ListNodesRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("agent list: got %v, want PermissionDenied", err)
	}

	// An agent streams its own node's state, and no other's.
	sync := func(nodeName string) error {
		stream, err := weirv1.NewAgentServiceClient(agentConn).Sync(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: nodeName}}}); err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	if err := sync("node1"); err != nil {
		t.Errorf("agent node1 streaming node1: %v", err)
	}
	if err := sync("node2"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node2") {
		t.Errorf("agent node1 streaming node2: got %v, want PermissionDenied naming node2", err)
	}
	// The fleet certificate streams any node that has no stream on its
	// own certificate.
	if _, err := admin.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("node3")}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node3", "node1"} {
		fleet, err := weirv1.NewAgentServiceClient(dial(t, addr, dir, certs.FleetAgentName)).Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fleet.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: n}}})
		if _, err := fleet.Recv(); n == "node3" && err != nil {
			t.Errorf("the fleet agent certificate streaming node3: %v", err)
		} else if n == "node1" && status.Code(err) != codes.PermissionDenied {
			t.Errorf("the fleet agent certificate streaming node1 while node1 streams on its own: got %v, want PermissionDenied", err)
		}
	}
	s, err := weirv1.NewAgentServiceClient(dial(t, addr, dir, "alice")).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "alice"}}})
	if _, err := s.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("admin streaming agent state: got %v, want PermissionDenied", err)
	}
}

func TestNoCertificateNoOldTLS(t *testing.T) {
	dir := pki(t)
	addr := startTLSServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	anonymous := weirv1.NewRegistryServiceClient(dial(t, addr, dir, ""))
	if _, err := anonymous.ListNodes(ctx, &weirv1.ListNodesRequest{}); err == nil {
		t.Error("a client without a certificate was served")
	}
	// TLS 1.2 is refused: the server speaks TLS 1.3 only.
	cfg, err := tlsconfig.Client(tlsconfig.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "alice.crt"), Key: filepath.Join(dir, "alice.key")})
	if err != nil {
		t.Fatal(err)
	}
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	conn, err := tls.Dial("tcp", addr, cfg)
	if err == nil {
		conn.Close()
		t.Error("a TLS 1.2 handshake succeeded")
	}
}

// Every write and every denied call leaves one audit line: who, what,
// which resource, the result.
func TestAuditRecordsWritesAndDenials(t *testing.T) {
	dir, addr, auditLines := auditedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "alice"))
	viewer := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "victor"))
	if _, err := admin.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("node1")}); err != nil {
		t.Fatal(err)
	}
	admin.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("Bad_Name")})
	viewer.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "node1"})
	admin.ListNodes(ctx, &weirv1.ListNodesRequest{})
	lines := auditLines()
	for i, want := range [][]string{
		{"level=INFO", `who="alice (admin)"`, "method=weir.v1.RegistryService/CreateNode", "result=OK", "resource=node1", "revision=1"},
		{"level=INFO", `who="alice (admin)"`, "method=weir.v1.RegistryService/CreateNode", "result=InvalidArgument", "resource=Bad_Name", "error="},
		{"level=WARN", `who="victor (viewer)"`, "method=weir.v1.RegistryService/DeleteNode", "result=PermissionDenied", "resource=node1"},
	} {
		if i >= len(lines) {
			t.Fatalf("audit lines:\n%s\nwant %d", strings.Join(lines, "\n"), i+1)
		}
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("audit line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
	if len(lines) != 3 {
		t.Errorf("audit lines:\n%s\nwant 3 (reads are not audited)", strings.Join(lines, "\n"))
	}
}

// auditedServer is a TLS server whose log the test reads: auditLines
// returns the audit lines written since it was last called.
func auditedServer(t *testing.T) (dir, addr string, auditLines func() []string) {
	t.Helper()
	dir = pki(t)
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&lockedWriter{&mu, &buf}, nil))
	addr = servertest.Start(t, t.TempDir(), servertest.TLS(t, dir), func(c *server.Config) {
		c.Log = log
		c.Limits.CallsPerSecond = -1 // floods of denied calls, as fast as they come
	}).Addr
	return dir, addr, func() []string {
		mu.Lock()
		defer mu.Unlock()
		var lines []string
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, "msg=audit") {
				lines = append(lines, l)
			}
		}
		buf.Reset()
		return lines
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// An Apply's audit lines name every resource it wrote, and a dry run's
// line says so and carries no revision; a caller denied again and again,
// with names of megabytes, writes a bounded log.
func TestAuditNamesWhatApplyChangedAndCannotBeFlooded(t *testing.T) {
	dir, addr, auditLines := auditedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "alice"))
	apply := &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{
		{Resource: &weirv1.ApplyResource_Node{Node: node("node1")}},
		{Resource: &weirv1.ApplyResource_AddressPool{AddressPool: &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/28"}}}},
	}, ValidateOnly: true}
	if _, err := admin.Apply(ctx, apply); err != nil {
		t.Fatal(err)
	}
	apply.ValidateOnly = false
	if _, err := admin.Apply(ctx, apply); err != nil {
		t.Fatal(err)
	}
	lines := auditLines()
	if len(lines) != 4 {
		t.Fatalf("audit lines:\n%s\nwant 4", strings.Join(lines, "\n"))
	}
	for i, want := range [][]string{
		{"resources=2", "dry_run=true"},
		{"resources=2", "revision="},
		{"kind=node resource=node1 verb=created", "revision="},
		{"kind=addresspool resource=public verb=created", "revision="},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("audit line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
	if strings.Contains(lines[0], "revision=") || strings.Contains(lines[1], "dry_run") {
		t.Errorf("the dry run's line has a revision, or the write's says dry run:\n%s", strings.Join(lines, "\n"))
	}

	viewer := weirv1.NewRegistryServiceClient(dial(t, addr, dir, "victor"))
	huge := strings.Repeat("x", 1<<20)
	burst := time.Now()
	for range 200 {
		viewer.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: huge})
	}
	// A burst of 10 and one a second: on a busy machine the 200 calls
	// (a megabyte each) take seconds, and each second may log one more.
	allowed := 12 + int(time.Since(burst)/time.Second)
	lines = auditLines()
	if len(lines) > allowed {
		t.Errorf("200 denied calls in %v logged %d lines; want at most a burst of 10 and one a second (%d)", time.Since(burst).Round(time.Millisecond), len(lines), allowed)
	}
	for _, l := range lines {
		if len(l) > 2*auth.MaxAuditValue+512 {
			t.Fatalf("an audit line of %d bytes: %.300s...", len(l), l)
		}
	}
	// Twenty more at once, small and quick: whatever the pace of the
	// burst (seconds on a busy machine, a line a second), the bucket is
	// empty now, so these leave denials unlogged for the next line to
	// count.
	for range 20 {
		viewer.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "node1"})
	}
	auditLines()
	time.Sleep(1100 * time.Millisecond)
	viewer.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "node1"})
	lines = auditLines()
	if len(lines) != 1 || !strings.Contains(lines[0], "denials_not_logged=") || !strings.Contains(lines[0], "resource=node1") {
		t.Errorf("the next denied call a second later:\n%s\nwant one line with the count left out", strings.Join(lines, "\n"))
	}
}
