// Package toolbin builds, once per machine, the tools some tests run that
// are Go programs outside Weir's module (helm), and holds the lock that
// lets concurrent builders, in this or other processes, wait for a single
// build. Binaries are cached under <user cache dir>/weir ($XDG_CACHE_HOME
// or ~/.cache), named after their version, so a new version is built anew.
package toolbin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// HelmVersion is the Helm release the chart is checked with.
const HelmVersion = "v3.22.0"

// Helm returns the path of a helm binary, building it (go install, about
// a minute on two cores) when the cache has none.
func Helm(ctx context.Context) (string, error) {
	return Install(ctx, "helm", "helm.sh/helm/v3/cmd/helm", HelmVersion)
}

// Install returns the path of the cached binary name-version, installing
// pkg@version there first when it is missing.
func Install(ctx context.Context, name, pkg, version string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("toolbin: %w", err)
	}
	dir := filepath.Join(cache, "weir", name+"-"+version)
	bin := filepath.Join(dir, name)
	if Executable(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("toolbin: %w", err)
	}
	unlock, err := Lock(ctx, dir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if Executable(bin) {
		return bin, nil // built by another process meanwhile
	}
	cmd := exec.CommandContext(ctx, "go", "install", pkg+"@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("toolbin: go install %s@%s: %w\n%s", pkg, version, err, out)
	}
	return bin, nil
}

// Lock takes an exclusive flock on path, polling so that ctx can cancel
// the wait, and returns the function that releases it.
func Lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("toolbin: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			// Closing the file releases the lock.
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("toolbin: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("toolbin: waiting for another build: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Executable tells whether path is a regular file someone may run.
func Executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
