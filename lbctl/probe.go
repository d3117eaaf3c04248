package main

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/weirlb/weir/internal/tlsconfig"
)

// What a second look at a server that closed a connection after the TLS
// handshake found.
const (
	probeGone     = "gone"    // nothing answers at the address now
	probeAnswers  = "answers" // it accepts a connection now
	probeClosed   = "closed"  // it closed this one too, without a TLS alert
	probeTLSError = "tls"     // a TLS failure (an alert): cause says which
	probeUnknown  = ""        // the look itself was not conclusive
)

// probeTLS connects to addr once more and waits for the server's first
// bytes. A server that refuses the client certificate sends a TLS alert
// after the handshake (TLS 1.3), which a gRPC client that wrote first may
// never read; a server that stopped, restarted or is at its connection
// limit does not. cause is the alert or the failure when there is one.
func probeTLS(addr string, files tlsconfig.Files) (verdict, cause string) {
	cfg, err := tlsconfig.Client(files)
	if err != nil {
		return probeUnknown, ""
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && cfg.ServerName == "" {
		cfg.ServerName = host
	}
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		var netErr *net.OpError
		if errors.As(err, &netErr) && netErr.Op == "dial" {
			return probeGone, err.Error()
		}
		return probeTLSError, err.Error()
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	// An HTTP/2 server speaks first (its SETTINGS): any byte means it
	// took the connection.
	_, err = conn.Read(make([]byte, 1))
	switch {
	case err == nil:
		return probeAnswers, ""
	case strings.Contains(err.Error(), "remote error: tls:"):
		return probeTLSError, err.Error()
	case errors.Is(err, io.EOF):
		return probeClosed, ""
	}
	return probeUnknown, err.Error()
}
