package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// installMu keeps concurrent Starts in this process from racing apt-get.
var installMu sync.Mutex

// Binary returns the path of etcd, installing Debian's etcd-server
// package first if it is missing and we are root.
func Binary(ctx context.Context) (string, error) {
	installMu.Lock()
	defer installMu.Unlock()
	if path, err := exec.LookPath("etcd"); err == nil {
		return path, nil
	}
	if os.Geteuid() != 0 {
		return "", errors.New("etcdcluster: etcd not found; install it with: apt-get install etcd-server")
	}
	install := func() ([]byte, error) {
		cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "--no-install-recommends",
			// Wait for other apt runs, e.g. a parallel test package.
			"-o", "DPkg::Lock::Timeout=300", "etcd-server")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	if _, err := install(); err != nil {
		// The package lists may be missing or stale; refresh and retry.
		if out, err := exec.CommandContext(ctx, "apt-get", "update").CombinedOutput(); err != nil {
			return "", fmt.Errorf("etcdcluster: apt-get update: %w\n%s", err, out)
		}
		if out, err := install(); err != nil {
			return "", fmt.Errorf("etcdcluster: apt-get install etcd-server: %w\n%s", err, out)
		}
	}
	return exec.LookPath("etcd")
}

// Healthy reports whether the etcd member at url answers /health.
func Healthy(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"true"`)
}
