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
func IssueServer(dir string, hosts []string) error {
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
	return issue(dir, "server", tmpl)
}

// IssueClient writes <name>.crt and <name>.key for a client with a role;
// it refuses to replace a key the folder holds (see ReissueClient).
func IssueClient(dir, name, role string) error {
	if err := checkClientName(name); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, name+".key")); err == nil {
		return fmt.Errorf("%s already holds a key for %q (%s.key): replacing it cuts off whoever uses it; reissue it on purpose (--force)", dir, name, name)
	}
	return ReissueClient(dir, name, role)
}

// ReissueClient writes <name>.crt and <name>.key, replacing any there
// (a rotation); the CA's and the server's own files stay refused.
func ReissueClient(dir, name, role string) error {
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
	})
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

func issue(dir, name string, tmpl *x509.Certificate) error {
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
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
