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
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
// The CA is valid for ten years (ValidFor changes that).
func InitCA(dir string, opts ...Option) error {
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
		return fmt.Errorf("%s already holds a CA (ca.key)", dir)
	}
	o := issuing{validFor: caValidity, now: time.Now}
	o.apply(opts)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := o.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "weir CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(o.validFor),
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
type Option func(*issuing)

// issuing is what the options set.
type issuing struct {
	validFor time.Duration
	now      func() time.Time
	capped   func(Capped)
}

func (o *issuing) apply(opts []Option) {
	for _, opt := range opts {
		opt(o)
	}
}

// ValidFor issues a certificate valid for d from now, instead of a year
// (ten years for a CA); never past the end of the CA that signs it.
func ValidFor(d time.Duration) Option {
	return func(o *issuing) { o.validFor = d }
}

// Clock issues as of the time now returns instead of the system's.
func Clock(now func() time.Time) Option {
	return func(o *issuing) { o.now = now }
}

// OnCapped has fn told of every certificate issued to end with its CA,
// sooner than asked.
func OnCapped(fn func(Capped)) Option {
	return func(o *issuing) { o.capped = fn }
}

// Capped is a certificate asked to outlive its CA and issued to end with
// it instead, as kubeadm does: past its CA's end, nothing verifies it.
type Capped struct {
	File     string    // the certificate's file
	Asked    time.Time // the end asked for
	NotAfter time.Time // the end it has: the CA's
	CAFile   string
}

func (c Capped) String() string {
	return fmt.Sprintf("%s ends at %s, with its CA %s, not at %s as asked: no certificate outlives the CA that signs it; make a new CA before then (rotate cannot renew a CA)",
		c.File, stamp(c.NotAfter), c.CAFile, stamp(c.Asked))
}

// MinCappedValidity is the shortest life a certificate cut at its CA's
// end may have: a shorter one would be due for renewal at once, by a CA
// that cannot be renewed.
const MinCappedValidity = 24 * time.Hour

// Errors of a CA that cannot sign.
var (
	// ErrCANotValid: the CA has expired or is not yet valid, so that
	// nothing it signs would verify.
	ErrCANotValid = errors.New("the CA is not valid")
	// ErrCAEndsSoon: the CA ends within MinCappedValidity.
	ErrCAEndsSoon = errors.New("the CA ends too soon")
)

func issue(dir, name string, tmpl *x509.Certificate, opts []Option) error {
	o := issuing{validFor: certValidity, now: time.Now}
	o.apply(opts)
	now := o.now()
	ca, caKey, err := loadSigner(dir, now)
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(o.validFor)
	if tmpl.NotAfter.After(ca.NotAfter) {
		caFile := filepath.Join(dir, "ca.crt")
		if left := ca.NotAfter.Sub(now); left < MinCappedValidity {
			return fmt.Errorf("%s: %w: it ends at %s (NotAfter), in %v, and a certificate from it would last no longer; make a new CA",
				caFile, ErrCAEndsSoon, stamp(ca.NotAfter), left.Round(time.Minute))
		}
		if o.capped != nil {
			o.capped(Capped{File: filepath.Join(dir, name+".crt"), Asked: tmpl.NotAfter, NotAfter: ca.NotAfter, CAFile: caFile})
		}
		tmpl.NotAfter = ca.NotAfter
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(dir, name, der, key)
}

// loadSigner reads dir's CA and its key, refusing a CA that is not valid
// at now.
func loadSigner(dir string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cert, err := loadCA(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := checkCA(filepath.Join(dir, "ca.crt"), cert, now); err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CA key: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, errors.New("the CA key is not PEM")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("the CA key: %w", err)
	}
	return cert, key, nil
}

// checkCA refuses a CA outside its validity at now.
func checkCA(file string, ca *x509.Certificate, now time.Time) error {
	switch {
	case now.After(ca.NotAfter):
		return fmt.Errorf("%s: %w: it expired at %s (NotAfter), and nothing it signs verifies; make a new CA and move to it", file, ErrCANotValid, stamp(ca.NotAfter))
	case now.Before(ca.NotBefore):
		return fmt.Errorf("%s: %w: it is not valid before %s (NotBefore; it ends at %s): is this host's clock behind?", file, ErrCANotValid, stamp(ca.NotBefore), stamp(ca.NotAfter))
	}
	return nil
}

// stamp is how a certificate's time reads in messages.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// loadCA reads dir's CA certificate, the first of ca.crt (a bundle, in a
// CA rotation, lists the signing CA first).
func loadCA(dir string) (*x509.Certificate, error) {
	file := filepath.Join(dir, "ca.crt")
	c, err := readCert(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("reading the CA %s (run init first): %w", file, err)
	case err != nil:
		return nil, fmt.Errorf("the CA %s: %w", file, err)
	}
	return c, nil
}

// readCert reads the first certificate of a PEM file; its errors do not
// name the file, which callers do.
func readCert(file string) (*x509.Certificate, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate in it")
	}
	return x509.ParseCertificate(blk.Bytes)
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

// Certificate is one certificate of a folder.
type Certificate struct {
	File       string // its path
	Name       string // its file's name without .crt: a client's identity, or "server"
	CommonName string
	// Role is the role its Organization names (weir:<role>), "server"
	// for a server certificate, "" when neither.
	Role     string
	NotAfter time.Time
	// OtherCA: the folder's CA did not sign it (rotate leaves it alone).
	OtherCA bool

	cert *x509.Certificate
}

// Folder is what a folder of certificates holds.
type Folder struct {
	CA           Certificate
	Certificates []Certificate // every other .crt file, by name
	Failed       []FileError   // the files that could not be read
}

// FileError is a file of the folder that could not be handled.
type FileError struct {
	File string
	Err  error
}

func (e FileError) Error() string { return e.File + ": " + e.Err.Error() }
func (e FileError) Unwrap() error { return e.Err }

// ReadFolder reads the CA and every other certificate of dir. A file that
// cannot be read is in Failed and the others are read all the same; only
// a CA that cannot be read is an error.
func ReadFolder(dir string) (Folder, error) {
	ca, err := loadCA(dir)
	if err != nil {
		return Folder{}, err
	}
	f := Folder{CA: describe(filepath.Join(dir, "ca.crt"), ca, ca)}
	files, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return Folder{}, err
	}
	for _, file := range files {
		if filepath.Base(file) == "ca.crt" {
			continue
		}
		c, err := readCert(file)
		if err != nil {
			f.Failed = append(f.Failed, FileError{File: file, Err: err})
			continue
		}
		f.Certificates = append(f.Certificates, describe(file, c, ca))
	}
	return f, nil
}

func describe(file string, c, ca *x509.Certificate) Certificate {
	var roles []string
	for _, o := range c.Subject.Organization {
		if r, ok := strings.CutPrefix(o, RolePrefix); ok {
			roles = append(roles, r)
		}
	}
	if len(roles) == 0 && slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		roles = append(roles, "server")
	}
	return Certificate{
		File: file, Name: strings.TrimSuffix(filepath.Base(file), ".crt"), CommonName: c.Subject.CommonName,
		Role: strings.Join(roles, ","), NotAfter: c.NotAfter, OtherCA: c != ca && c.CheckSignatureFrom(ca) != nil, cert: c,
	}
}

// Rotation is what Rotate did.
type Rotation struct {
	CA       Certificate
	Reissued []string // the names reissued
	// EndWithCA are the certificates due that end with the CA already:
	// no renewal would end later, so they are left as they are.
	EndWithCA []Certificate
	Failed    []FileError // the files not read, or not reissued
}

// Rotate reissues every certificate in dir that the CA signed (the
// server's and the clients') that expires within the given time, with the
// same names, addresses and role and a new key. A file it cannot read or
// reissue does not stop it: it goes on with the others and returns an
// error naming every such file. Nothing is reissued with a CA that is not
// valid, and a renewal ends no later than the CA (OnCapped tells of one
// cut short); a certificate that already ends with the CA is not
// reissued again (EndWithCA), so rotations do not renew it in a loop. Processes that use the new files take
// them within tlsconfig.ReloadPeriod, and their connections move to them
// by the old ones' end.
func Rotate(dir string, within time.Duration, opts ...Option) (Rotation, error) {
	o := issuing{validFor: certValidity, now: time.Now}
	o.apply(opts)
	now := o.now()
	f, err := ReadFolder(dir)
	if err != nil {
		return Rotation{}, err
	}
	r := Rotation{CA: f.CA, Failed: f.Failed}
	if err := checkCA(f.CA.File, f.CA.cert, now); err != nil {
		return r, err
	}
	for _, c := range f.Certificates {
		if c.OtherCA || c.NotAfter.Sub(now) > within {
			continue // another CA's, or not yet due
		}
		if now.Add(o.validFor).After(f.CA.NotAfter) && !f.CA.NotAfter.After(c.NotAfter) {
			// A renewal would end with the CA, as this one does: reissuing
			// it at every rotation would gain nothing.
			r.EndWithCA = append(r.EndWithCA, c)
			continue
		}
		old := c.cert
		tmpl := &x509.Certificate{Subject: old.Subject, DNSNames: old.DNSNames, IPAddresses: old.IPAddresses, ExtKeyUsage: old.ExtKeyUsage}
		if err := issue(dir, c.Name, tmpl, opts); err != nil {
			r.Failed = append(r.Failed, FileError{File: c.File, Err: fmt.Errorf("reissuing: %w", err)})
			continue
		}
		r.Reissued = append(r.Reissued, c.Name)
	}
	if len(r.Failed) == 0 {
		return r, nil
	}
	slices.SortFunc(r.Failed, func(a, b FileError) int { return strings.Compare(a.File, b.File) })
	errs := make([]error, len(r.Failed))
	for i, fe := range r.Failed {
		errs[i] = fe
	}
	return r, fmt.Errorf("certificate files of %s not renewed (%d):\n%w", dir, len(errs), errors.Join(errs...))
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
