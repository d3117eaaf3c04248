// Package webhook serves the apiserver's admission reviews over HTTPS as
// an address on a pod network should be served: the apiserver
// authenticated by its client certificate when a CA is given (no other
// caller gets past the TLS handshake), every request read whole under a
// deadline, and connections bounded in all and per source address. What
// any caller can hold of the server's memory is then at most
// MaxConnections requests of the handler's body bound, for ReadTimeout.
package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/weirlb/weir/internal/tlsconfig"
)

// Serving bounds. kube-apiserver waits 10 s for an admission webhook by
// default (timeoutSeconds, 30 at most) and gives up after that; a review
// that takes longer to arrive is one nobody waits for.
const (
	// ReadHeaderTimeout bounds the TLS handshake and a request's headers.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds a whole request, body included, from its first
	// byte (the first request of a connection: from its accept), so a
	// slow body cannot hold its buffer longer.
	ReadTimeout = 10 * time.Second
	// WriteTimeout bounds the answer, from the end of the request's headers.
	WriteTimeout = 10 * time.Second
	// IdleTimeout closes a connection kept between reviews: it holds a
	// slot of MaxConnections.
	IdleTimeout = 30 * time.Second
	// MaxHeaderBytes: the apiserver sends a dozen short headers.
	MaxHeaderBytes = 16 << 10

	// DefaultMaxConnections is how many connections the webhook holds at
	// once; more wait in the kernel's backlog until one closes.
	DefaultMaxConnections = 32
	// DefaultMaxConnectionsPerSource is how many of those one source
	// address may hold; past it, its new connections are closed as they
	// come. The apiserver sends one review per connection (HTTP/1.1), so
	// this is also how many reviews one apiserver may have in flight.
	DefaultMaxConnectionsPerSource = 8
)

// Config is how the webhook is served.
type Config struct {
	// TLS holds the webhook's certificate and key and, when it has a CA,
	// the CA that signs the apiserver's client certificate: a handshake
	// without a certificate that CA signed then fails.
	TLS *tlsconfig.Source
	// ClientNames, when not empty, are the only client certificates
	// taken: the CommonName or a DNS name of the certificate must be one
	// of them (as kube-apiserver's --requestheader-allowed-names). They
	// need a CA in TLS.
	ClientNames []string
	// MaxConnections and MaxConnectionsPerSource replace the defaults
	// when not zero.
	MaxConnections, MaxConnectionsPerSource int
	// Log receives what net/http says of failed connections (handshakes
	// refused, timeouts), at debug level: a caller can make many of those.
	// nil: none.
	Log *slog.Logger
}

// Server is the webhook's HTTPS server.
type Server struct {
	hs    *http.Server
	limit *connLimit
}

// New is a server of h with cfg's bounds; nothing is listened on yet.
func New(h http.Handler, cfg Config) (*Server, error) {
	if cfg.TLS == nil {
		return nil, errors.New("the webhook needs a certificate and key")
	}
	if len(cfg.ClientNames) > 0 && !cfg.TLS.Mutual() {
		return nil, errors.New("client names are checked only with a client CA: without one no client certificate is asked for")
	}
	tlsCfg, err := cfg.TLS.ServerConfig()
	if err != nil {
		return nil, err
	}
	// The source gives each handshake a configuration of the files'
	// current content; each gets the name check and HTTP/1.1 only.
	perHandshake := tlsCfg.GetConfigForClient
	tlsCfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := perHandshake(h)
		if err != nil {
			return nil, err
		}
		c.NextProtos = []string{"http/1.1"}
		if len(cfg.ClientNames) > 0 {
			c.VerifyConnection = allowNames(cfg.ClientNames)
		}
		return c, nil
	}
	tlsCfg.NextProtos = []string{"http/1.1"}
	// HTTP/1.1 only: kube-apiserver speaks it to webhooks (so reviews
	// spread over replicas), and one request per connection is what makes
	// the connection bounds bound the requests read at once. Over HTTP/2
	// one connection would carry hundreds.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	hs := &http.Server{
		Handler:           h,
		TLSConfig:         tlsCfg,
		Protocols:         &protocols,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hs.ErrorLog = slog.NewLogLogger(log.With("listener", "webhook").Handler(), slog.LevelDebug)
	total, perSource := cfg.MaxConnections, cfg.MaxConnectionsPerSource
	if total == 0 {
		total = DefaultMaxConnections
	}
	if perSource == 0 {
		perSource = DefaultMaxConnectionsPerSource
	}
	if total < 1 || perSource < 1 {
		return nil, fmt.Errorf("connection bounds %d in all, %d per source: at least 1", total, perSource)
	}
	return &Server{hs: hs, limit: newConnLimit(total, perSource)}, nil
}

// Serve answers on lis until ctx ends, then closes every connection.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	stop := context.AfterFunc(ctx, func() { s.hs.Close() })
	defer stop()
	err := s.hs.ServeTLS(s.limit.listen(lis), "", "")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// allowNames refuses, at the handshake, a client certificate none of whose
// names (CommonName, DNS names) is in names.
func allowNames(names []string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		leaf := cs.PeerCertificates[0]
		if slices.Contains(names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(names, n) }) {
			return nil
		}
		return fmt.Errorf("client certificate %q is not one the webhook takes", leaf.Subject.CommonName)
	}
}
