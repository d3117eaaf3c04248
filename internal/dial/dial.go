// Package dial connects a Weir component (agent, speaker) to weir-server:
// to one address (Server), or to one of several replicas at a time with a
// move to the next when the current one goes away or is not current
// (Servers, Reconnect).
package dial

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/weirlb/weir/internal/tlsconfig"
)

// Server makes a client of the server at addr: mTLS with tls's files
// (reloaded when they change), or plain text when tls is nil (labs and
// demos).
func Server(addr string, tls *tlsconfig.Source) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, options(tls)...)
}

// options are the transport and the connection settings of every
// connection to a server.
func options(tls *tlsconfig.Source) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if tls != nil {
		creds = tls.ClientCredentials()
	}
	return append(Windows(),
		grpc.WithTransportCredentials(creds),
		// Pings find a dead server (or path) in seconds, not at TCP's pace.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: Backoff, MinConnectTimeout: 5 * time.Second}),
	)
}

// Windows are the fixed receive windows of every connection to a server
// (benches' simulated agents use them too). gRPC's default estimates the
// bandwidth-delay product with a PING after each burst of data, so every
// change a server sent cost every agent a PING and the server its answer,
// as the server's own windows (server/limits) are fixed for the same
// reason. 4 MiB a stream holds a part of a whole state many times over.
func Windows() []grpc.DialOption {
	const stream = 4 << 20
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(stream), grpc.WithStaticConnWindowSize(4 * stream)}
}

// Backoff is how often a component tries to reach a server that is away:
// soon after it returns, at most about half a second late. gRPC's default
// grows to two minutes, which kept agents away ~15 s after a server
// restart. The jitter spreads a rack's reconnections; a closed port costs
// the server's host a reset per try.
var Backoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond}
