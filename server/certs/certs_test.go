package certs

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
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
	if diff := cmp.Diff([]string{"node1", "server"}, done); diff != "" {
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
