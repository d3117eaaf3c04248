package tlsconfig

import (
	"context"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials are a gRPC server's: TLS with ServerConfig, and each
// connection closed when the first of the server's and the client's
// certificates expires (TLS checks them at the handshake only). Clients
// reconnect, with the certificates their files hold then.
func (s *Source) ServerCredentials() (credentials.TransportCredentials, error) {
	c := &expiringCreds{ends: map[net.Conn]time.Time{}, now: s.opts.Now}
	cfg, err := s.serverConfig(func(conn net.Conn, end time.Time) {
		c.mu.Lock()
		c.ends[conn] = end
		c.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	c.TransportCredentials = credentials.NewTLS(cfg)
	return c, nil
}

// expiringCreds closes each connection at its certificates' end.
type expiringCreds struct {
	credentials.TransportCredentials
	now func() time.Time
	mu  sync.Mutex
	// ends holds, for a handshake under way, the end of the certificate
	// the server presents on it.
	ends map[net.Conn]time.Time
}

func (c *expiringCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	c.mu.Lock()
	end := c.ends[raw]
	delete(c.ends, raw)
	c.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	if ti, ok := info.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		if peer := ti.State.PeerCertificates[0].NotAfter; end.IsZero() || peer.Before(end) {
			end = peer
		}
	}
	if end.IsZero() {
		return conn, info, nil
	}
	ec := &expiringConn{Conn: conn}
	ec.timer = time.AfterFunc(end.Sub(c.now()), func() { conn.Close() })
	return ec, info, nil
}

func (c *expiringCreds) Clone() credentials.TransportCredentials {
	return &expiringCreds{TransportCredentials: c.TransportCredentials.Clone(), now: c.now, ends: map[net.Conn]time.Time{}}
}

// expiringConn stops its timer when closed first.
type expiringConn struct {
	net.Conn
	timer *time.Timer
}

func (c *expiringConn) Close() error {
	c.timer.Stop()
	return c.Conn.Close()
}

// ClientCredentials are a gRPC client's: TLS with ClientConfig, except
// that the CA too is what its file holds at each handshake (a CA bundle
// grown for a CA rotation needs no restart).
func (s *Source) ClientCredentials() credentials.TransportCredentials {
	return &clientCreds{s: s, TransportCredentials: credentials.NewTLS(s.ClientConfig())}
}

type clientCreds struct {
	credentials.TransportCredentials // for Info
	s                                *Source
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.s.ClientConfig()).ClientHandshake(ctx, authority, raw)
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{TransportCredentials: c.TransportCredentials.Clone(), s: c.s}
}
