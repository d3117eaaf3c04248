package tlsconfig_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/server/certs"
)

// pki makes a CA in a new folder, with a server certificate for 127.0.0.1
// and a client certificate "agent1".
func pki(t *testing.T, server, client time.Duration) string {
	t.Helper()
	dir := t.TempDir()
	if err := certs.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := certs.IssueServer(dir, []string{"127.0.0.1"}, certs.ValidFor(server)); err != nil {
		t.Fatal(err)
	}
	if err := certs.IssueClient(dir, "agent1", certs.RoleAgent, certs.ValidFor(client)); err != nil {
		t.Fatal(err)
	}
	return dir
}

func notAfter(t *testing.T, file string) time.Time {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(file, strings.TrimSuffix(file, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf.NotAfter
}

// A Source takes rotated files at its next read, keeps the last good pair
// while a rotation is half written, and says so once.
func TestSourceReloads(t *testing.T) {
	dir := pki(t, time.Hour, time.Hour)
	now := time.Now()
	var logged bytes.Buffer
	src, err := tlsconfig.Load(tlsconfig.Files{Cert: filepath.Join(dir, "server.crt"), Key: filepath.Join(dir, "server.key"), CA: filepath.Join(dir, "ca.crt")},
		tlsconfig.Options{Use: "server", Log: slog.New(slog.NewTextHandler(&logged, nil)), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	first := src.State().CertNotAfter
	served := func() time.Time {
		cfg, err := src.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		c, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Certificates[0].Leaf.NotAfter
	}

	// A new certificate beside the old key: not a pair.
	oldKey, _ := os.ReadFile(filepath.Join(dir, "server.key"))
	if err := certs.IssueServer(dir, []string{"127.0.0.1"}, certs.ValidFor(48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	newKey, _ := os.ReadFile(filepath.Join(dir, "server.key"))
	os.WriteFile(filepath.Join(dir, "server.key"), oldKey, 0o600)
	if got := served(); !got.Equal(first) {
		t.Errorf("before ReloadPeriod: serves a certificate ending %v, want the first (%v)", got, first)
	}
	now = now.Add(tlsconfig.ReloadPeriod)
	for range 3 {
		if got := served(); !got.Equal(first) {
			t.Errorf("half-written rotation: serves a certificate ending %v, want the last good one (%v)", got, first)
		}
		now = now.Add(tlsconfig.ReloadPeriod)
	}
	if n := strings.Count(logged.String(), "do not load"); n != 1 {
		t.Errorf("half-written rotation logged %d times, want once:\n%s", n, logged.String())
	}
	os.WriteFile(filepath.Join(dir, "server.key"), newKey, 0o600)
	now = now.Add(tlsconfig.ReloadPeriod)
	if got := served(); got.Sub(first) < 40*time.Hour {
		t.Errorf("after the rotation: serves a certificate ending %v, want the new one (two days)", got)
	}
	if st := src.State(); st.Reloads != 1 || st.FailedReloads != 1 {
		t.Errorf("state %+v: want 1 reload and 1 failed", st)
	}
}

// startServer serves gRPC health over the Source's credentials.
func startServer(t *testing.T, src *tlsconfig.Source) string {
	t.Helper()
	creds, err := src.ServerCredentials()
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(s, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// watch opens a health Watch stream and returns the server certificate's
// serial number and a channel closed when the stream ends.
func watch(t *testing.T, conn *grpc.ClientConn) (string, chan struct{}) {
	t.Helper()
	stream, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				close(ended)
				return
			}
		}
	}()
	p, _ := peer.FromContext(stream.Context())
	return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String(), ended
}

// A stream ends when the server's certificate does, and the client's next
// stream is on the certificate rotated in meanwhile; the same for the
// client's certificate. Real gRPC over loopback.
func TestConnectionsEndWithTheirCertificates(t *testing.T) {
	for _, tc := range []struct {
		name           string
		server, client time.Duration
		rotate         func(dir string) error
	}{
		{"server certificate", 3 * time.Second, time.Hour, func(dir string) error {
			return certs.IssueServer(dir, []string{"127.0.0.1"}, certs.ValidFor(time.Hour))
		}},
		{"client certificate", time.Hour, 3 * time.Second, func(dir string) error {
			return certs.ReissueClient(dir, "agent1", certs.RoleAgent, certs.ValidFor(time.Hour))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := pki(t, tc.server, tc.client)
			file := func(n string) string { return filepath.Join(dir, n) }
			opts := tlsconfig.Options{ReloadPeriod: 100 * time.Millisecond}
			srv, err := tlsconfig.Load(tlsconfig.Files{Cert: file("server.crt"), Key: file("server.key"), CA: file("ca.crt")}, opts)
			if err != nil {
				t.Fatal(err)
			}
			cli, err := tlsconfig.Load(tlsconfig.Files{Cert: file("agent1.crt"), Key: file("agent1.key"), CA: file("ca.crt")}, opts)
			if err != nil {
				t.Fatal(err)
			}
			end := notAfter(t, file("server.crt"))
			if tc.client < tc.server {
				end = notAfter(t, file("agent1.crt"))
			}
			conn, err := grpc.NewClient(startServer(t, srv), grpc.WithTransportCredentials(cli.ClientCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			before, ended := watch(t, conn)
			if err := tc.rotate(dir); err != nil {
				t.Fatal(err)
			}
			select {
			case <-ended:
				if late := time.Since(end); late < 0 || late > 2*time.Second {
					t.Errorf("the stream ended %v after the certificate's end, want within 2s of it", late)
				}
			case <-time.After(time.Until(end) + 5*time.Second):
				t.Fatal("the stream outlived its certificate by 5s")
			}
			after, _ := watch(t, conn)
			if tc.server < tc.client && after == before {
				t.Errorf("the new stream is on the server certificate %s again", after)
			}
		})
	}
}

// A client takes a CA bundle grown for a CA rotation without a restart.
func TestClientTakesNewCABundle(t *testing.T) {
	oldDir, newDir := pki(t, time.Hour, time.Hour), pki(t, time.Hour, time.Hour)
	clientCA := filepath.Join(t.TempDir(), "ca.crt")
	oldCA, _ := os.ReadFile(filepath.Join(oldDir, "ca.crt"))
	newCA, _ := os.ReadFile(filepath.Join(newDir, "ca.crt"))
	os.WriteFile(clientCA, oldCA, 0o644)
	srv, err := tlsconfig.Load(tlsconfig.Files{Cert: filepath.Join(newDir, "server.crt"), Key: filepath.Join(newDir, "server.key")}, tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tlsconfig.Load(tlsconfig.Files{CA: clientCA}, tlsconfig.Options{ReloadPeriod: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	addr := startServer(t, srv)
	check := func() error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(cli.ClientCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("a server of another CA: %v, want refused", err)
	}
	os.WriteFile(clientCA, append(oldCA, newCA...), 0o644)
	time.Sleep(100 * time.Millisecond)
	if err := check(); err != nil {
		t.Errorf("after the bundle grew: %v", err)
	}
}
