package certs

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestIssueRefusesNamesThatLeaveTheFolderOrOverwriteTheCA: a client name
// is a node-like name; "ca" and "server" would overwrite the CA's or the
// server's key, a path would write outside the folder. Nothing is written.
func TestIssueRefusesNamesThatLeaveTheFolderOrOverwriteTheCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if err := InitCA(dir); err != nil {
		t.Fatal(err)
	}
	caKey, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ca", "server", "../evil", "a/b", ".hidden", "Upper", "", "-x"} {
		if err := IssueClient(dir, name, RoleAdmin); err == nil {
			t.Errorf("IssueClient(%q): accepted", name)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.key")); !bytes.Equal(caKey, after) {
		t.Error("the CA's key changed")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "evil.key")); err == nil {
		t.Error("a key was written outside the folder")
	}
	for _, name := range []string{"admin", "node1", "rack-1.node-02", "lb1", strings.Repeat("n", 251)} {
		if err := IssueClient(dir, name, RoleAgent); err != nil {
			t.Errorf("IssueClient(%q): %v", name, err)
		}
	}
	// Longer names are refused for what they are, not with a raw error
	// of the file system.
	for _, n := range []int{252, 253, 300} {
		err := IssueClient(dir, strings.Repeat("n", n), RoleAgent)
		if err == nil || !strings.Contains(err.Error(), "at most 251") {
			t.Errorf("a name of %d characters: %v; want a refusal saying at most 251", n, err)
		}
	}
}

func TestIssueNeverReplacesAKeyUnasked(t *testing.T) {
	dir := t.TempDir()
	if err := InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := IssueClient(dir, "node1", RoleAgent); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "node1.key"))
	if err := IssueClient(dir, "node1", RoleAdmin); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("issuing over node1's key: %v; want a refusal naming --force", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "node1.key")); !bytes.Equal(before, after) {
		t.Error("node1's key changed")
	}
	if err := ReissueClient(dir, "node1", RoleAgent); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "node1.key")); bytes.Equal(before, after) {
		t.Error("a reissue kept the old key")
	}
	if err := ReissueClient(dir, "ca", RoleAdmin); err == nil {
		t.Error("a reissue may replace the CA's key")
	}
}

// Rotate reissues what is due, with the same names, addresses and role
// and a new key, and leaves alone what is not due and what another CA
// signed.
func TestRotateReissuesWhatIsDue(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if err := InitCA(d); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(IssueServer(dir, []string{"weir.example", "192.0.2.1"}, ValidFor(24*time.Hour)))
	must(IssueClient(dir, "node1", RoleAgent, ValidFor(24*time.Hour)))
	must(IssueClient(dir, "admin", RoleAdmin, ValidFor(90*24*time.Hour)))
	must(IssueClient(other, "stranger", RoleAdmin, ValidFor(time.Hour)))
	for _, ext := range []string{".crt", ".key"} {
		b, _ := os.ReadFile(filepath.Join(other, "stranger"+ext))
		must(os.WriteFile(filepath.Join(dir, "stranger"+ext), b, 0o600))
	}
	read := func(name string) (*x509.Certificate, []byte) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name+".crt"))
		must(err)
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		must(err)
		k, err := os.ReadFile(filepath.Join(dir, name+".key"))
		must(err)
		return c, k
	}
	oldServer, oldServerKey := read("server")
	oldAdmin, _ := read("admin")
	done, err := Rotate(dir, 30*24*time.Hour, ValidFor(365*24*time.Hour))
	must(err)
	if diff := cmp.Diff([]string{"node1", "server"}, done.Reissued); diff != "" {
		t.Errorf("reissued (-want +got):\n%s", diff)
	}
	server, serverKey := read("server")
	if bytes.Equal(serverKey, oldServerKey) || server.NotAfter.Before(time.Now().Add(300*24*time.Hour)) {
		t.Errorf("server: same key or still short-lived (%v)", server.NotAfter)
	}
	if !slices.Equal(server.DNSNames, oldServer.DNSNames) || len(server.IPAddresses) != 1 || !server.IPAddresses[0].Equal(oldServer.IPAddresses[0]) || server.Subject.CommonName != "weir-server" {
		t.Errorf("server names %v %v, want %v %v", server.DNSNames, server.IPAddresses, oldServer.DNSNames, oldServer.IPAddresses)
	}
	if node, _ := read("node1"); node.Subject.CommonName != "node1" || !slices.Equal(node.Subject.Organization, []string{RolePrefix + RoleAgent}) || node.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("node1: subject %v, usage %v", node.Subject, node.ExtKeyUsage)
	}
	if admin, _ := read("admin"); admin.SerialNumber.Cmp(oldAdmin.SerialNumber) != 0 {
		t.Error("admin, not due, was reissued")
	}
	if stranger, _ := read("stranger"); stranger.Issuer.CommonName != "weir CA" || stranger.NotAfter.After(time.Now().Add(2*time.Hour)) {
		t.Error("another CA's certificate was reissued")
	}
}

const day = 24 * time.Hour

// at is a clock stopped at t.
func at(t time.Time) Option { return Clock(func() time.Time { return t }) }

// verify runs openssl verify on dir's NAME.crt against its ca.crt, now:
// the check of a client that meets the certificate.
func verify(t *testing.T, dir, name string) error {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Log("no openssl: certificates not verified by it")
		return nil
	}
	out, err := exec.Command("openssl", "verify", "-CAfile", filepath.Join(dir, "ca.crt"), filepath.Join(dir, name+".crt")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("openssl verify %s: %v: %s", name, err, out)
	}
	return nil
}

func readCertFile(t *testing.T, dir, name string) *x509.Certificate {
	t.Helper()
	c, err := readCert(filepath.Join(dir, name+".crt"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A CA that has expired, or is not yet valid, signs nothing: issue, server,
// reissue and rotate refuse it naming its file and its dates, and no file
// of the folder changes (a certificate it signed would not verify).
func TestIssuingRefusesACAOutsideItsValidity(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		ca   []Option
		want string // in the error, beside the CA's file
	}{
		{"expired", []Option{at(now.Add(-400 * day)), ValidFor(365 * day)}, "expired at " + stamp(now.Add(-35*day))},
		{"not yet valid", []Option{at(now.Add(2 * day)), ValidFor(365 * day)}, "not valid before " + stamp(now.Add(2*day-time.Hour))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := InitCA(dir, tc.ca...); err != nil {
				t.Fatal(err)
			}
			// A certificate issued while the CA was valid, due now.
			if tc.name == "expired" {
				if err := IssueClient(dir, "node1", RoleAgent, at(now.Add(-300*day)), ValidFor(30*day)); err != nil {
					t.Fatal(err)
				}
			}
			before := folderFiles(t, dir)
			_, rotateErr := Rotate(dir, 30*day)
			for what, err := range map[string]error{
				"IssueServer":   IssueServer(dir, []string{"weir.example"}),
				"IssueClient":   IssueClient(dir, "admin", RoleAdmin),
				"ReissueClient": ReissueClient(dir, "node1", RoleAgent),
				"Rotate":        rotateErr,
			} {
				if !errors.Is(err, ErrCANotValid) || !strings.Contains(err.Error(), filepath.Join(dir, "ca.crt")) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %v; want ErrCANotValid naming %s and %q", what, err, filepath.Join(dir, "ca.crt"), tc.want)
				}
			}
			if diff := cmp.Diff(before, folderFiles(t, dir)); diff != "" {
				t.Errorf("the folder changed (-before +after):\n%s", diff)
			}
		})
	}
}

// folderFiles is every file of dir and its content.
func folderFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		files[e.Name()] = string(b)
	}
	return files
}

// Under a CA ending in 10 days, a certificate asked for a year ends with
// the CA, verifies, and the cut is told with both dates; one asked for less
// is issued as asked. A CA ending within a day signs nothing that would
// outlive it.
func TestLeavesEndNoLaterThanTheirCA(t *testing.T) {
	dir := t.TempDir()
	if err := InitCA(dir, ValidFor(10*day)); err != nil {
		t.Fatal(err)
	}
	caEnd := readCertFile(t, dir, "ca").NotAfter
	var capped []Capped
	tell := OnCapped(func(c Capped) { capped = append(capped, c) })
	if err := IssueServer(dir, []string{"weir.example"}, tell); err != nil {
		t.Fatal(err)
	}
	if err := IssueClient(dir, "node1", RoleAgent, ValidFor(5*day), tell); err != nil {
		t.Fatal(err)
	}
	if end := readCertFile(t, dir, "server").NotAfter; !end.Equal(caEnd) {
		t.Errorf("server.crt ends at %v, its CA at %v", end, caEnd)
	}
	if end := readCertFile(t, dir, "node1").NotAfter; end.After(caEnd.Add(-4 * day)) {
		t.Errorf("node1.crt, asked for 5 days, ends at %v", end)
	}
	for _, name := range []string{"server", "node1"} {
		if err := verify(t, dir, name); err != nil {
			t.Error(err)
		}
	}
	if len(capped) != 1 || capped[0].File != filepath.Join(dir, "server.crt") || !capped[0].NotAfter.Equal(caEnd) || capped[0].Asked.Before(time.Now().Add(364*day)) {
		t.Fatalf("told of cuts %+v; want server.crt's alone, to %v", capped, caEnd)
	}
	if msg := capped[0].String(); !strings.Contains(msg, stamp(caEnd)) || !strings.Contains(msg, stamp(capped[0].Asked)) {
		t.Errorf("the warning %q does not give both dates", msg)
	}

	// 20 hours left: a year's certificate would last less than a day.
	soon := t.TempDir()
	if err := InitCA(soon, ValidFor(21*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := IssueClient(soon, "admin", RoleAdmin); !errors.Is(err, ErrCAEndsSoon) || !strings.Contains(err.Error(), filepath.Join(soon, "ca.crt")) {
		t.Errorf("a year's certificate from a CA with 20h left: %v; want ErrCAEndsSoon naming the CA", err)
	}
	if _, err := os.Stat(filepath.Join(soon, "admin.crt")); err == nil {
		t.Error("admin.crt was written")
	}
	if err := IssueClient(soon, "admin", RoleAdmin, ValidFor(time.Hour)); err != nil {
		t.Errorf("an hour's certificate from a CA with 20h left: %v", err)
	}
}

// Rotation under a CA ending in 10 days renews what is due to the CA's
// end, once: the next rotation does not reissue it again (it would gain
// nothing) but says it ends with the CA.
func TestRotateRenewsUpToTheCAOnce(t *testing.T) {
	dir := t.TempDir()
	if err := InitCA(dir, ValidFor(10*day)); err != nil {
		t.Fatal(err)
	}
	caEnd := readCertFile(t, dir, "ca").NotAfter
	if err := IssueClient(dir, "node1", RoleAgent, ValidFor(2*day)); err != nil {
		t.Fatal(err)
	}
	r, err := Rotate(dir, 30*day)
	if err != nil || !slices.Equal(r.Reissued, []string{"node1"}) {
		t.Fatalf("first rotation: reissued %v, %v", r.Reissued, err)
	}
	if end := readCertFile(t, dir, "node1").NotAfter; !end.Equal(caEnd) {
		t.Errorf("node1.crt renewed to %v, its CA ends at %v", end, caEnd)
	}
	if err := verify(t, dir, "node1"); err != nil {
		t.Error(err)
	}
	before := folderFiles(t, dir)
	r, err = Rotate(dir, 30*day)
	if err != nil || len(r.Reissued) != 0 || len(r.EndWithCA) != 1 || r.EndWithCA[0].Name != "node1" {
		t.Errorf("second rotation: reissued %v, ending with the CA %+v, %v; want nothing reissued, node1 ending with the CA", r.Reissued, r.EndWithCA, err)
	}
	if diff := cmp.Diff(before, folderFiles(t, dir)); diff != "" {
		t.Errorf("the second rotation changed the folder (-before +after):\n%s", diff)
	}
}

// A certificate file that cannot be read (not a certificate, a link to
// nothing) does not stop a rotation: every other due certificate is
// renewed, then the rotation fails naming each file it could not handle.
func TestRotateGoesOnPastFilesItCannotRead(t *testing.T) {
	dir := t.TempDir()
	if err := InitCA(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"admin", "node1", "zeta"} {
		if err := IssueClient(dir, name, RoleAgent, ValidFor(day)); err != nil {
			t.Fatal(err)
		}
	}
	if err := IssueServer(dir, []string{"weir.example"}, ValidFor(day)); err != nil {
		t.Fatal(err)
	}
	// Between them by name: a half-copied file and a link to nothing.
	if err := os.WriteFile(filepath.Join(dir, "broken.crt"), []byte("-----BEGIN CERTIFICATE-----\nMIIB"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "gone"), filepath.Join(dir, "lost.crt")); err != nil {
		t.Fatal(err)
	}
	r, err := Rotate(dir, 30*day)
	if diff := cmp.Diff([]string{"admin", "node1", "server", "zeta"}, r.Reissued); diff != "" {
		t.Errorf("reissued (-want +got):\n%s", diff)
	}
	var failed []string
	for _, f := range r.Failed {
		failed = append(failed, filepath.Base(f.File))
	}
	if diff := cmp.Diff([]string{"broken.crt", "lost.crt"}, failed); diff != "" {
		t.Errorf("files not handled (-want +got):\n%s", diff)
	}
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "broken.crt")) || !strings.Contains(err.Error(), filepath.Join(dir, "lost.crt")) {
		t.Errorf("rotation's error %v; want one naming broken.crt and lost.crt", err)
	}
	for _, name := range r.Reissued {
		if end := readCertFile(t, dir, name).NotAfter; end.Before(time.Now().Add(300 * day)) {
			t.Errorf("%s.crt still ends at %v", name, end)
		}
		if err := verify(t, dir, name); err != nil {
			t.Error(err)
		}
	}
}
