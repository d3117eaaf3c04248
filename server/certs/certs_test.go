package certs

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
