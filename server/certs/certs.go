// Package certs issues the certificates Weir's mTLS uses: a CA, the
// server's certificate, and client certificates whose subject names an
// identity (CommonName) and its role (Organization "weir:<role>").
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Roles a client certificate can carry.
const (
	RoleAdmin  = "admin"  // reads and writes the registry
	RoleViewer = "viewer" // reads the registry and the status
	RoleAgent  = "agent"  // streams the state of the node its CommonName names
	// RoleSpeaker is a load-balancer-tier speaker: it watches the targets
	// and reports as the speaker its CommonName names.
	RoleSpeaker = "speaker"
)

// FleetAgentName is the CommonName of an agent certificate shared by every
// node (where per-node certificates cannot be issued, as in a DaemonSet):
// it may stream the state of any node.
const FleetAgentName = "weir-agents"

// RolePrefix marks a role in a certificate's Organization.
const RolePrefix = "weir:"

// Validity of the certificates issued.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 365 * 24 * time.Hour
)

// InitCA writes ca.crt and ca.key into dir, refusing to overwrite a CA.
func InitCA(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
		return fmt.Errorf("%s already holds a CA (ca.key)", dir)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "weir CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writePair(dir, "ca", der, key)
}

// IssueServer writes server.crt and server.key for the given host names and
// IP addresses, signed by dir's CA.
func IssueServer(dir string, hosts []string, opts ...Option) error {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "weir-server"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if len(hosts) == 0 {
		return errors.New("at least one host name or address is required")
	}
	return issue(dir, "server", tmpl, opts)
}

// IssueClient writes <name>.crt and <name>.key for a client with a role;
// it refuses to replace a key the folder holds (see ReissueClient).
func IssueClient(dir, name, role string, opts ...Option) error {
	if err := checkClientName(name); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, name+".key")); err == nil {
		return fmt.Errorf("%s already holds a key for %q (%s.key): replacing it cuts off whoever uses it; reissue it on purpose (--force)", dir, name, name)
	}
	return ReissueClient(dir, name, role, opts...)
}

// ReissueClient writes <name>.crt and <name>.key, replacing any there
// (a rotation); the CA's and the server's own files stay refused.
func ReissueClient(dir, name, role string, opts ...Option) error {
	switch role {
	case RoleAdmin, RoleViewer, RoleAgent, RoleSpeaker:
	default:
		return fmt.Errorf("unknown role %q (admin, viewer, agent or speaker)", role)
	}
	if err := checkClientName(name); err != nil {
		return err
	}
	return issue(dir, name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{RolePrefix + role}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, opts)
}

// clientName is what a client certificate's name (its common name and
// its files' names in the folder) may be: a node name's characters, so
// that it can neither leave the folder nor contain a path.
var clientName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

// maxClientName is the longest name whose files (NAME.crt, NAME.key) a
// file system takes: 255 bytes a file name.
const maxClientName = 255 - len(".key")

// checkClientName refuses names that are not clientName, and the names of
// the CA's and the server's own files, which issuing would overwrite.
func checkClientName(name string) error {
	switch {
	case name == "":
		return errors.New("a name is required")
	case name == "ca" || name == "server":
		return fmt.Errorf("name %q: taken by the %s's own certificate and key in the folder", name, name)
	case len(name) > maxClientName:
		return fmt.Errorf("name of %d characters: at most %d (its files are NAME.crt and NAME.key)", len(name), maxClientName)
	case !clientName.MatchString(name):
		return fmt.Errorf("name %q: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (a node's name)", name)
	}
	return nil
}

// Option changes how a certificate is issued.
type Option func(*x509.Certificate)

// ValidFor issues a certificate valid for d from now, instead of a year.
func ValidFor(d time.Duration) Option {
	return func(c *x509.Certificate) { c.NotAfter = time.Now().Add(d) }
}

func issue(dir, name string, tmpl *x509.Certificate, opts []Option) error {
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(certValidity)
	for _, o := range opts {
		o(tmpl)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(dir, name, der, key)
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CA (run init first): %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("the CA files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func writePair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	// Each file is replaced whole (a process reloading them never reads
	// half of one), the key first: a reader that finds a new key beside
	// the old certificate keeps its last pair and looks again later.
	if err := replaceFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return replaceFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// replaceFile writes b to path through a temporary file and a rename.
func replaceFile(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".weir-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// Rotate reissues every certificate in dir that the CA signed (the
// server's and the clients') that expires within the given time, with the
// same names, addresses and role and a new key; it returns their names.
// Processes that use them take them within tlsconfig.ReloadPeriod, and
// their connections move to them by the old ones' end.
func Rotate(dir string, within time.Duration, opts ...Option) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return nil, err
	}
	ca, _, err := loadCA(dir)
	if err != nil {
		return nil, err
	}
	var done []string
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".crt")
		if name == "ca" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return done, err
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return done, fmt.Errorf("%s is not PEM", f)
		}
		old, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return done, fmt.Errorf("%s: %w", f, err)
		}
		if old.CheckSignatureFrom(ca) != nil || time.Until(old.NotAfter) > within {
			continue // another CA's, or not yet due
		}
		tmpl := &x509.Certificate{Subject: old.Subject, DNSNames: old.DNSNames, IPAddresses: old.IPAddresses, ExtKeyUsage: old.ExtKeyUsage}
		if err := issue(dir, name, tmpl, opts); err != nil {
			return done, fmt.Errorf("reissuing %s: %w", name, err)
		}
		done = append(done, name)
	}
	return done, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
