package webhook_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/webhook"
	"github.com/weirlb/weir/server/webhook/webhooktest"
)

// testCA signs the test's certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA's PEM
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, file: file}
}

// issue is a certificate of cn and dnsNames (a server's for 127.0.0.1
// when server), and the files holding it and its key.
func (ca *testCA) issue(t *testing.T, cn string, dnsNames []string, server bool) (tls.Certificate, tlsconfig.Files) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dnsNames,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	dir := t.TempDir()
	files := tlsconfig.Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}
	if err := os.WriteFile(files.Cert, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files.Key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair, files
}

// served is a webhook on loopback serving h.
type served struct {
	addr   string
	server *testCA // the CA of the webhook's certificate
}

// serve starts a webhook of h on 127.0.0.1, with clientCA (a file; empty:
// none) and cfg's other fields, stopped when t ends.
func serve(t *testing.T, h http.Handler, clientCA string, cfg webhook.Config) served {
	t.Helper()
	ca := newCA(t, "webhook-ca")
	_, files := ca.issue(t, "webhook", nil, true)
	files.CA = clientCA
	src, err := tlsconfig.Load(files, tlsconfig.Options{Use: "webhook"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = src
	s, err := webhook.New(h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return served{addr: lis.Addr().String(), server: ca}
}

// clientTLS trusts the webhook and presents cert when not nil.
func (s served) clientTLS(cert *tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(s.server.cert)
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// dial opens a TLS connection to the webhook from source (a loopback
// address; empty: any) and finishes the handshake.
func (s served) dial(source string, cert *tls.Certificate, timeout time.Duration) (*tls.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	raw, err := d.Dial("tcp", s.addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, s.clientTLS(cert))
	c.SetDeadline(time.Now().Add(timeout))
	if err := c.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	// A TLS 1.3 server refuses a client certificate after the client
	// thinks the handshake done: its alert is the first thing to read.
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
		c.Close()
		return nil, fmt.Errorf("after the handshake: %w", err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// review posts body on c and reads the answer's status.
func review(c *tls.Conn, body string) (int, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", kubernetes.AdmissionPath, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

const poolReview = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"weir.dev","version":"v1alpha1","kind":"AddressPool"},"operation":"CREATE","object":{}}}`

// TestOnlyTheAPIServerGetsPastTLS: with a client CA, a caller without a
// certificate of that CA (or, with client names, of one of the names)
// fails at the handshake and its request never reaches the handler; the
// apiserver's certificate is answered.
func TestOnlyTheAPIServerGetsPastTLS(t *testing.T) {
	clientCA, other := newCA(t, "apiserver-client-ca"), newCA(t, "someone-elses-ca")
	apiserver, _ := clientCA.issue(t, "kube-apiserver-webhook-client", nil, false)
	bySAN, _ := clientCA.issue(t, "node-7", []string{"apiserver.example"}, false)
	kubelet, _ := clientCA.issue(t, "system:node:node-7", nil, false)
	stranger, _ := other.issue(t, "kube-apiserver-webhook-client", nil, false)
	for _, tc := range []struct {
		name   string
		names  []string
		cert   *tls.Certificate
		answer bool
	}{
		{"no certificate", nil, nil, false},
		{"another CA's certificate", nil, &stranger, false},
		{"the client CA's certificate", nil, &apiserver, true},
		{"no certificate, names", []string{"kube-apiserver-webhook-client"}, nil, false},
		{"a certificate of the CA, not named", []string{"kube-apiserver-webhook-client", "apiserver.example"}, &kubelet, false},
		{"the named CommonName", []string{"kube-apiserver-webhook-client"}, &apiserver, true},
		{"a named DNS name", []string{"apiserver.example"}, &bySAN, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reached atomic.Int32
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				kubernetesAdmission.ServeHTTP(w, r)
			})
			s := serve(t, h, clientCA.file, webhook.Config{ClientNames: tc.names})
			code, err := func() (int, error) {
				c, err := s.dial("", tc.cert, 5*time.Second)
				if err != nil {
					return 0, err
				}
				defer c.Close()
				return review(c, poolReview)
			}()
			switch {
			case tc.answer && (err != nil || code != http.StatusOK):
				t.Errorf("answered %d, %v; want 200", code, err)
			case !tc.answer && (err == nil || !isTLSRefusal(err)):
				t.Errorf("answered %d, %v; want the handshake refused", code, err)
			case !tc.answer && reached.Load() != 0:
				t.Error("the request reached the handler")
			}
		})
	}
}

// isTLSRefusal: the server refused the handshake with an alert.
func isTLSRefusal(err error) bool {
	return err != nil && strings.Contains(err.Error(), "remote error: tls: ")
}

var kubernetesAdmission = (&kubernetes.Source{}).Admission()

// TestConnectionsPerSource: one source address holds at most its share of
// the connections; past it, its new connections are closed at once,
// while another source is answered.
func TestConnectionsPerSource(t *testing.T) {
	s := serve(t, kubernetesAdmission, "", webhook.Config{MaxConnectionsPerSource: 4})
	var held []*tls.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range 4 {
		c, err := s.dial("127.0.0.2", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", len(held)+1, err)
		}
		held = append(held, c)
	}
	start := time.Now()
	if c, err := s.dial("127.0.0.2", nil, 5*time.Second); err == nil {
		c.Close()
		t.Error("a fifth connection from one source was taken")
	} else if time.Since(start) > time.Second {
		t.Errorf("the fifth connection was closed after %v: want at once", time.Since(start))
	}
	c, err := s.dial("127.0.0.3", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("another source: %v", err)
	}
	defer c.Close()
	if code, err := review(c, poolReview); err != nil || code != http.StatusOK {
		t.Errorf("another source: %d, %v; want 200", code, err)
	}
}

// TestSlowLargeBodiesAreBounded: 150 connections from 30 addresses, each
// sending a 4 MiB review at 64 KiB/s (none ends within the apiserver's
// timeout), take from the server at most MaxConnections connections at
// once, each closed within ReadTimeout of its accept, and a bounded heap;
// a review is answered after them.
func TestSlowLargeBodiesAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of attack")
	}
	s := serve(t, kubernetesAdmission, "", webhook.Config{})
	out := webhooktest.SlowBodies{Addr: s.addr, Path: kubernetes.AdmissionPath, TLS: s.clientTLS(nil),
		Conns: 150, Sources: 30, BodyBytes: 4 << 20, Chunk: 8 << 10, Every: 125 * time.Millisecond, For: 30 * time.Second}.Run()
	t.Log(out)
	if err := out.Bounded(webhook.DefaultMaxConnections, 2*kubernetes.MaxReviewBytes, webhook.ReadTimeout+2*time.Second); err != nil {
		t.Error(err)
	}
	c, err := s.dial("127.0.0.2", nil, 15*time.Second)
	if err != nil {
		t.Fatalf("after the attack: %v", err)
	}
	defer c.Close()
	if code, err := review(c, poolReview); err != nil || code != http.StatusOK {
		t.Errorf("after the attack: %d, %v; want 200", code, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
