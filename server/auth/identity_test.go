package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// A certificate that names several roles holds none of them: which one
// was meant is not the server's to guess (before, the last in order won).
func TestSeveralRolesHoldNone(t *testing.T) {
	for _, tc := range []struct {
		orgs []string
		role string
	}{
		{[]string{"weir:admin"}, "admin"},
		{[]string{"example"}, ""},
		{[]string{"weir:admin", "weir:admin", "example"}, "admin"},
		{[]string{"weir:viewer", "weir:admin"}, "several: viewer, admin"},
	} {
		cert := &x509.Certificate{Subject: pkix.Name{CommonName: "x", Organization: tc.orgs}}
		p := &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}}
		id, ok := certIdentity(p)
		if !ok || id.Role != tc.role {
			t.Errorf("organizations %v: role %q (%v); want %q", tc.orgs, id.Role, ok, tc.role)
		}
	}
}

// A write the server failed to make (a full disk says Internal, a store
// out of reach Unavailable) is an ERROR line, not one write among others.
func TestAuditSaysAFailedWriteLoudly(t *testing.T) {
	for code, want := range map[codes.Code]string{
		codes.OK: "level=INFO", codes.InvalidArgument: "level=INFO", codes.PermissionDenied: "level=WARN",
		codes.Internal: "level=ERROR", codes.Unavailable: "level=ERROR",
	} {
		var buf bytes.Buffer
		a := &auditor{log: slog.New(slog.NewTextHandler(&buf, nil)), denials: map[string]*denials{}}
		var err error
		if code != codes.OK {
			err = status.Error(code, "persisting services default/web: no space left on device")
		}
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}})
		a.audit(ctx, "/weir.v1.RegistryService/CreateService", nil, nil, err)
		if !strings.Contains(buf.String(), want) {
			t.Errorf("%v: %q; want %s", code, buf.String(), want)
		}
	}
}
