package etcdcluster

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// StartForTest starts n members for t (clients on TLS when tls is not
// nil), closed when t ends. Without etcd, and not root to install it, it
// skips t; with CI=true it fails instead: CI must never skip silently.
func StartForTest(t testing.TB, n int, tls *TLS) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil && os.Geteuid() != 0 {
		msg := "etcdcluster: needs etcd (apt-get install etcd-server) or root to install it"
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatal(msg + "; failing because CI=true")
		}
		t.Skip(msg)
	}
	c, err := StartTLS(context.Background(), n, tls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
