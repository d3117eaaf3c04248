package auth

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
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
