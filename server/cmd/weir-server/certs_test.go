package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/server/certs"
)

const day = 24 * time.Hour

// certsRun runs `weir-server certs ARGS...` and returns its stdout and
// stderr.
func certsRun(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = certsCommand(args, &o, &e)
	return o.String(), e.String(), err
}

func leafEnd(t *testing.T, dir, name string) time.Time {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf.NotAfter
}

// With an expired CA, issue, server and rotate fail (a non-zero exit)
// naming the CA's file and its end, and write nothing.
func TestCertsCommandsRefuseAnExpiredCA(t *testing.T) {
	dir := t.TempDir()
	past := time.Now().Add(-400 * day)
	if err := certs.InitCA(dir, certs.Clock(func() time.Time { return past }), certs.ValidFor(365*day)); err != nil {
		t.Fatal(err)
	}
	end := past.Add(365 * day).UTC().Format(time.RFC3339)
	for _, args := range [][]string{
		{"issue", "--dir", dir, "--name", "node1", "--role", "agent"},
		{"server", "--dir", dir, "--hosts", "weir.example"},
		{"rotate", "--dir", dir},
	} {
		_, _, err := certsRun(args...)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "ca.crt")) || !strings.Contains(err.Error(), end) {
			t.Errorf("certs %s: %v; want an error naming %s and its end %s", args[0], err, filepath.Join(dir, "ca.crt"), end)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("the folder holds %d files; want the CA's 2", len(entries))
	}
}

// Under a CA ending in 10 days, issue writes a certificate that ends with
// the CA and warns with both dates; rotate says how long the CA has left
// and warns that it ends within --within.
func TestCertsCommandsEndWithTheCA(t *testing.T) {
	dir := t.TempDir()
	if err := certs.InitCA(dir, certs.ValidFor(10*day)); err != nil {
		t.Fatal(err)
	}
	f, err := certs.ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	caEnd := f.CA.NotAfter.UTC().Format(time.RFC3339)
	_, stderr, err := certsRun("issue", "--dir", dir, "--name", "node1", "--role", "agent", "--valid-for", "48h")
	if err != nil || stderr != "" {
		t.Fatalf("issue for 48h: %v, warned %q", err, stderr)
	}
	_, stderr, err = certsRun("issue", "--dir", dir, "--name", "admin", "--role", "admin")
	if err != nil {
		t.Fatal(err)
	}
	asked := time.Now().Add(365 * day).UTC().Format("2006-01-02T15")
	if !strings.HasPrefix(stderr, "warning: ") || !strings.Contains(stderr, caEnd) || !strings.Contains(stderr, asked) {
		t.Errorf("issue for a year under a CA ending at %s warned %q; want a warning with both dates", caEnd, stderr)
	}
	if got := leafEnd(t, dir, "admin"); !got.Equal(f.CA.NotAfter) {
		t.Errorf("admin.crt ends at %v, its CA at %v", got, f.CA.NotAfter)
	}

	stdout, stderr, err := certsRun("rotate", "--dir", dir, "--within", "720h")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "reissued "+dir+"/node1.crt") || !strings.Contains(stdout, "the CA "+filepath.Join(dir, "ca.crt")+" ends at "+caEnd+" (residual time 9d)") {
		t.Errorf("rotate said:\n%s", stdout)
	}
	if !strings.Contains(stderr, "warning: the CA "+filepath.Join(dir, "ca.crt")+" ends at "+caEnd+", within --within 720h0m0s") || !strings.Contains(stderr, "make a new CA") {
		t.Errorf("rotate warned:\n%s", stderr)
	}
	if !strings.Contains(stderr, "warning: "+filepath.Join(dir, "admin.crt")+" is due but not renewed: it ends with its CA") {
		t.Errorf("rotate did not say admin.crt, due, ends with the CA:\n%s", stderr)
	}
	if got := leafEnd(t, dir, "node1"); !got.Equal(f.CA.NotAfter) {
		t.Errorf("node1.crt renewed to %v, its CA ends at %v", got, f.CA.NotAfter)
	}
}

// check-expiration shows every certificate of the folder with its name,
// role, end and time left, then the CA's; a file it cannot read is named
// and fails the command, after the others are shown.
func TestCertsCheckExpiration(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, err := range []error{
		certs.InitCA(dir),
		certs.InitCA(other),
		certs.IssueServer(dir, []string{"weir.example"}),
		certs.IssueClient(dir, "node1", certs.RoleAgent, certs.ValidFor(48*time.Hour)),
		certs.IssueClient(other, "stranger", certs.RoleViewer),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(other, "stranger.crt"))
	if err := os.WriteFile(filepath.Join(dir, "stranger.crt"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken.crt"), []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := certsRun("check-expiration", "--dir", dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "broken.crt")) {
		t.Errorf("check-expiration: %v; want an error naming broken.crt", err)
	}
	f, err := certs.ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	ends := func(name string) string {
		for _, c := range f.Certificates {
			if c.Name == name {
				return c.NotAfter.UTC().Format("Jan 02, 2006 15:04 UTC")
			}
		}
		t.Fatalf("no %s.crt", name)
		return ""
	}
	for _, row := range [][]string{
		{"CERTIFICATE", "COMMON NAME", "ROLE", "EXPIRES", "RESIDUAL TIME", "CERTIFICATE AUTHORITY"},
		{"node1", "node1", "agent", ends("node1"), "1d", "ca"}, // kubeadm's short form: whole days
		{"server", "weir-server", "server", ends("server"), "364d", "ca"},
		{"stranger", "stranger", "viewer", ends("stranger"), "364d", "another CA"},
		{"CERTIFICATE AUTHORITY", "EXPIRES", "RESIDUAL TIME"},
		{"ca", f.CA.NotAfter.UTC().Format("Jan 02, 2006 15:04 UTC"), "9y"},
	} {
		re := `(?m)^` + strings.Join(quoteAll(row), ` {3,}`) + ` *$`
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("no row %q in:\n%s", row, stdout)
		}
	}
	if strings.Contains(stdout, "broken") {
		t.Errorf("broken.crt has a row:\n%s", stdout)
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = regexp.QuoteMeta(s)
	}
	return out
}

// TestWaitMountedWaitsForTheKubelet: the init container returns once the
// kubelet filled every Secret volume it waits for, and fails naming the
// folder and the file when one stays empty.
func TestWaitMountedWaitsForTheKubelet(t *testing.T) {
	filled, empty := t.TempDir(), t.TempDir()
	go func() {
		time.Sleep(50 * time.Millisecond)
		for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
			os.WriteFile(filepath.Join(filled, f), []byte("x"), 0o600)
		}
	}()
	var out bytes.Buffer
	if err := waitMounted([]string{filled}, 5*time.Second, 10*time.Millisecond, &out); err != nil {
		t.Errorf("a folder filled after 50ms: %v", err)
	}
	if !strings.Contains(out.String(), "waiting for the kubelet to fill "+filled) {
		t.Errorf("the wait is not said: %q", out.String())
	}
	err := waitMounted([]string{filled, empty}, 100*time.Millisecond, 10*time.Millisecond, io.Discard)
	if err == nil || !strings.Contains(err.Error(), empty+" has no ca.crt") {
		t.Errorf("a folder never filled: %v; want an error naming it and ca.crt", err)
	}
}
