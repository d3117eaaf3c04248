package kubeapi

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartForTest starts a cluster for t (the apiserver with apiserverArgs
// added), closed when t ends, or skips t as SkipUnlessAvailable does.
func StartForTest(t testing.TB, apiserverArgs ...string) *Cluster {
	t.Helper()
	SkipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := Start(ctx, apiserverArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// SkipUnlessAvailable skips the test unless Start can work here: etcd is
// installed or we are root (to apt-get it), and the go tool is in PATH to
// build the apiserver. With CI=true it fails instead: CI must never skip
// silently.
func SkipUnlessAvailable(t testing.TB) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("etcd"); err != nil && os.Geteuid() != 0 {
		missing = append(missing, "etcd (apt-get install etcd-server) or root to install it")
	}
	if _, err := exec.LookPath("go"); err != nil {
		missing = append(missing, "the go tool in PATH")
	}
	if len(missing) == 0 {
		return
	}
	msg := "kubeapi: running a real kube-apiserver needs " + strings.Join(missing, "; ")
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatal(msg + "; failing because CI=true")
	}
	t.Skip(msg)
}
