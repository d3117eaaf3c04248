// Package tlsconfig builds the TLS 1.3 configurations Weir's server and
// clients use: the server asks for client certificates when given a CA, and
// clients verify the server against theirs.
//
// Certificates rotate without a restart: a Source reads its files again
// (at most every ReloadPeriod, when a handshake or a scrape needs them) and
// each new handshake uses what they hold then. A certificate or key that
// does not load (half written, or not a pair) leaves the last good one in
// use. On the server, each connection is closed when the first of its two
// certificates (the server's, the client's) expires, so that no stream
// lives on a certificate past its end: the client reconnects with the one
// it reads now.
package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// Files names PEM files; empty fields are not used.
type Files struct {
	Cert, Key, CA string
}

// ReloadPeriod is how often, at most, a Source reads its files again.
const ReloadPeriod = 10 * time.Second

// Options tune a Source; the zero value is usable.
type Options struct {
	// Use says what the certificate is for ("server", "agent", "etcd"...),
	// in logs and in the metrics' label.
	Use string
	// Log receives a line for each certificate taken and each file that
	// does not load (once per content); nil: none.
	Log *slog.Logger
	// ReloadPeriod replaces ReloadPeriod (tests).
	ReloadPeriod time.Duration
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Source holds a certificate, its key and a CA bundle as their files held
// them at the last read.
type Source struct {
	files Files
	opts  Options

	mu      sync.Mutex // guards the fields below
	cur     material
	checked time.Time
	failed  [3][]byte // the contents that failed last, logged once
	// reloads counts contents taken, failedReloads contents refused.
	reloads, failedReloads float64
}

// material is one read of the files.
type material struct {
	raw  [3][]byte // as read: certificate, key, CA
	cert *tls.Certificate
	pool *x509.CertPool
	// The certificate's end, and the earliest end in the CA bundle.
	certNotAfter, caNotAfter time.Time
}

// Load reads the files once, refusing what does not load: a process
// should not start on certificates it cannot use.
func Load(f Files, opts Options) (*Source, error) {
	if opts.ReloadPeriod == 0 {
		opts.ReloadPeriod = ReloadPeriod
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("a certificate needs its key, and a key its certificate")
	}
	s := &Source{files: f, opts: opts}
	raw, err := s.readFiles()
	if err != nil {
		return nil, err
	}
	m, err := s.parse(raw)
	if err != nil {
		return nil, err
	}
	s.cur, s.checked = m, opts.Now()
	return s, nil
}

// readFiles reads the files' bytes: certificate, key, CA.
func (s *Source) readFiles() ([3][]byte, error) {
	var raw [3][]byte
	names := [3]string{s.files.Cert, s.files.Key, s.files.CA}
	for _, i := range []int{2, 0, 1} { // the CA first: the file every client has
		if names[i] == "" {
			continue
		}
		b, err := os.ReadFile(names[i])
		if err != nil {
			return raw, fmt.Errorf("reading %s: %w", names[i], err)
		}
		raw[i] = b
	}
	return raw, nil
}

// parse loads what readFiles read.
func (s *Source) parse(raw [3][]byte) (material, error) {
	m := material{raw: raw}
	if s.files.Cert != "" {
		cert, err := tls.X509KeyPair(m.raw[0], m.raw[1])
		if err != nil {
			return m, fmt.Errorf("loading certificate %s with key %s: %w", s.files.Cert, s.files.Key, err)
		}
		m.cert, m.certNotAfter = &cert, cert.Leaf.NotAfter
	}
	if s.files.CA != "" {
		m.pool = x509.NewCertPool()
		rest := m.raw[2]
		for {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if b.Type != "CERTIFICATE" || err != nil {
				continue
			}
			m.pool.AddCert(c)
			if m.caNotAfter.IsZero() || c.NotAfter.Before(m.caNotAfter) {
				m.caNotAfter = c.NotAfter
			}
		}
		if m.caNotAfter.IsZero() {
			return m, fmt.Errorf("no certificate in %s", s.files.CA)
		}
	}
	return m, nil
}

// current is what handshakes use now, read again first when the last read
// is ReloadPeriod old.
func (s *Source) current() material {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	if now.Sub(s.checked) < s.opts.ReloadPeriod {
		return s.cur
	}
	s.checked = now
	raw, err := s.readFiles()
	if err == nil && sameRaw(raw, s.cur.raw) {
		return s.cur // unchanged: nothing to parse
	}
	var m material
	if err == nil {
		m, err = s.parse(raw)
	}
	if err != nil {
		// The old material stays: a rotation is often two writes (the
		// certificate, then its key), and a handshake in between must
		// not fail. Logged once per content.
		if !sameRaw(raw, s.failed) {
			s.failed = raw
			s.failedReloads++
			if s.opts.Log != nil {
				s.opts.Log.Warn("certificate files changed but do not load: still using the last good ones", "use", s.opts.Use, "err", err)
			}
		}
		return s.cur
	}
	s.cur, s.failed = m, [3][]byte{}
	s.reloads++
	if s.opts.Log != nil {
		s.opts.Log.Info("certificates reloaded", "use", s.opts.Use, "cert_not_after", m.certNotAfter, "ca_not_after", m.caNotAfter)
	}
	return s.cur
}

func sameRaw(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

// Mutual reports whether a server of this Source asks for client
// certificates (it has a CA).
func (s *Source) Mutual() bool { return s.files.CA != "" }

// ServerConfig is the server's configuration: with a CA it requires and
// verifies client certificates (mTLS). Each handshake takes the files'
// current content.
func (s *Source) ServerConfig() (*tls.Config, error) {
	return s.serverConfig(nil)
}

// serverConfig is ServerConfig; presented, when not nil, learns for each
// handshake's connection the end of the certificate it is given.
func (s *Source) serverConfig(presented func(net.Conn, time.Time)) (*tls.Config, error) {
	if s.files.Cert == "" {
		return nil, errors.New("a certificate and key are required (or run with --insecure)")
	}
	config := func(m material) *tls.Config {
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*m.cert}}
		if m.pool != nil {
			cfg.ClientCAs, cfg.ClientAuth = m.pool, tls.RequireAndVerifyClientCert
		}
		return cfg
	}
	base := config(s.current())
	base.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		m := s.current()
		if presented != nil {
			presented(h.Conn, m.certNotAfter)
		}
		return config(m), nil
	}
	return base, nil
}

// ClientConfig is a client's configuration: it verifies the server against
// CA (the system roots when empty) and presents Cert when given. The
// certificate is taken at each handshake; the CA, fixed here, is reloaded
// only by ClientCredentials.
func (s *Source) ClientConfig() *tls.Config {
	m := s.current()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: m.pool}
	if s.files.Cert != "" {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.current().cert, nil
		}
	}
	return cfg
}

// Server is the server's configuration for f (see Source.ServerConfig).
func Server(f Files) (*tls.Config, error) {
	s, err := Load(f, Options{Use: "server"})
	if err != nil {
		return nil, err
	}
	return s.ServerConfig()
}

// Client is a client's configuration for f (see Source.ClientConfig).
func Client(f Files) (*tls.Config, error) {
	s, err := Load(f, Options{Use: "client"})
	if err != nil {
		return nil, err
	}
	return s.ClientConfig(), nil
}

// State is what a Source holds now, for metrics.
type State struct {
	Use string
	// The files, and the end of their certificates (the earliest in the
	// CA bundle); a file not used is empty.
	CertFile, CAFile         string
	CertNotAfter, CANotAfter time.Time
	Reloads, FailedReloads   float64
}

// State reads the files again when they are ReloadPeriod old (a scrape
// keeps the metrics current) and says what the Source holds.
func (s *Source) State() State {
	m := s.current()
	s.mu.Lock()
	defer s.mu.Unlock()
	return State{Use: s.opts.Use, CertFile: s.files.Cert, CAFile: s.files.CA, CertNotAfter: m.certNotAfter, CANotAfter: m.caNotAfter,
		Reloads: s.reloads, FailedReloads: s.failedReloads}
}
