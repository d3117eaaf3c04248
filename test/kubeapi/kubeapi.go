// Package kubeapi runs a real kube-apiserver, backed by a real etcd, on
// loopback for Weir's tests.
//
// The apiserver is built from the k8s.io/kubernetes module by the separate
// Go module in ./apiserver, so that heavy dependency never enters Weir's own
// go.mod; this package only builds and runs processes, using the standard
// library. etcd comes from Debian's etcd-server package.
//
// Typical use:
//
//	kubeapi.SkipUnlessAvailable(t)
//	c, err := kubeapi.Start(ctx)
//	if err != nil { t.Fatal(err) }
//	defer c.Close()
//	// point client-go at c.Kubeconfig, or use c.Host, c.Token and c.CAFile.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/test/toolbin"
)

// Version is the Kubernetes release the apiserver module is pinned to. It
// names the cached binary, so bumping it forces a rebuild.
const Version = "v1.36.3"

// Binary builds the Kubernetes binary once per machine and returns its path:
// the kube-apiserver when started with flags only, and the
// kube-controller-manager, kube-scheduler, kubelet, kube-proxy or kubectl
// when its first argument (or its own name) names one (test/kubecluster
// runs them). The binary is cached as <user cache dir>/weir/kube-<Version>-<source hash>
// ($XDG_CACHE_HOME or ~/.cache) and rebuilt only when missing: a change
// to the apiserver module's sources names a new binary. The source is
// found from the caller's module root (`go env GOMOD`), so the caller must
// run inside the Weir module, as tests do. Concurrent callers, in this or
// other processes, wait for a single build.
//
// The first build takes minutes and about 2 GB of memory: build it before
// the tests that need it (BuildBinary, `make testdeps`), not inside a test's
// clock.
func Binary(ctx context.Context) (string, error) { return BuildBinary(ctx, nil) }

// BuildBinary is Binary that, when progress is not nil, says there what it
// does while it builds: a line when it starts and one every 30 seconds with
// the packages compiled so far.
func BuildBinary(ctx context.Context, progress io.Writer) (string, error) {
	const pkg = "k8s.io/component-base/version"
	minor := strings.Split(Version, ".")[1]
	// Stamp the release like the official build does, so /version (and so
	// client-go discovery) reports v1.36.3 rather than v0.0.0-master.
	ldflags := fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean",
		pkg, Version, pkg, pkg, minor, pkg)
	return build(ctx, progress, "kube", "apiserver, controller-manager, scheduler, kubelet, kube-proxy, kubectl", "main.go",
		"build", "-ldflags", ldflags, "-o", "{out}", ".")
}

// E2E builds Kubernetes' network e2e tests (the test binary of the
// apiserver module's ./upstream package, from the same Kubernetes
// release), cached like Binary as e2e-<Version>-<source hash>.
func E2E(ctx context.Context, progress io.Writer) (string, error) {
	return build(ctx, progress, "e2e", "the network e2e tests", "upstream", "test", "-c", "-o", "{out}", "./upstream")
}

// TestImageProgram builds one of upstream's test images' programs
// (k8s.io/kubernetes/test/images/<name>: agnhost, regression-issue-74839),
// from the same Kubernetes release, into dir, and returns its path. The
// apiserver module names each as a tool.
func TestImageProgram(ctx context.Context, dir, name string) (string, error) {
	src, err := sourceDir(ctx)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-o", out, "k8s.io/kubernetes/test/images/"+name)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubeapi: go build %s: %w\n%s", name, err, b)
	}
	return out, nil
}

// build runs go (args, with {out} replaced by the output path) in the
// apiserver module unless its output is cached, and returns the cached
// path: <cache>/weir/<name>-<Version>-<hash>, the hash of the module's
// go.mod and go.sum and of the sources at from (a file or a folder). Older
// builds of the same name are removed once the new one is in place.
func build(ctx context.Context, progress io.Writer, name, what, from string, args ...string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	dir := filepath.Join(cache, "weir")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	src, err := sourceDir(ctx)
	if err != nil {
		return "", err
	}
	sum, err := sourceHash(src, from)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name+"-"+Version+"-"+sum)
	if isExecutable(bin) {
		return bin, nil
	}

	unlock, err := toolbin.Lock(ctx, bin+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have finished the build while we waited.
	if isExecutable(bin) {
		return bin, nil
	}
	// Build next to the final path and rename, so no caller ever sees a
	// half-written binary, even one that skipped the lock.
	tmpDir, err := os.MkdirTemp(dir, "build-*")
	if err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, name)
	// -buildvcs=false: stamping needs git and would describe Weir's
	// checkout, not Kubernetes.
	// -v names each package as it is compiled: the progress count.
	goArgs := []string{args[0], "-v", "-buildvcs=false"}
	for _, a := range args[1:] {
		goArgs = append(goArgs, strings.ReplaceAll(a, "{out}", tmp))
	}
	cmd := exec.CommandContext(ctx, "go", goArgs...)
	cmd.Dir = src
	// A go.work elsewhere must not pull the apiserver module into Weir's
	// workspace (or the other way round).
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out := &buildLog{}
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	if progress != nil {
		fmt.Fprintf(progress, "kubeapi: building Kubernetes %s (%s) into %s (minutes on a new machine)\n", Version, what, bin)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(30 * time.Second):
					fmt.Fprintf(progress, "kubeapi: %d packages compiled, %v\n", out.lines(), time.Since(start).Round(time.Second))
				}
			}
		}()
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("kubeapi: go %s in %s after %v: %w\n%s", args[0], src, time.Since(start).Round(time.Second), err, out.tail())
	}
	if progress != nil {
		fmt.Fprintf(progress, "kubeapi: built in %v\n", time.Since(start).Round(time.Second))
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	removeOlder(dir, name, filepath.Base(bin))
	return bin, nil
}

// sourceHash is a short hash of the apiserver module's go.mod and go.sum
// and of the Go files at from: what a binary is built from.
func sourceHash(src, from string) (string, error) {
	h := sha256.New()
	var paths []string
	for _, root := range []string{"go.mod", "go.sum", from} {
		err := filepath.WalkDir(filepath.Join(src, root), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && (path == filepath.Join(src, root) || strings.HasSuffix(path, ".go")) {
				paths = append(paths, path)
			}
			return err
		})
		if err != nil {
			return "", fmt.Errorf("kubeapi: hash the sources: %w", err)
		}
	}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("kubeapi: hash the sources: %w", err)
		}
		rel, _ := filepath.Rel(src, path)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// removeOlder removes the cached builds of name other than keep (and their
// lock files): a few hundred MB each.
func removeOlder(dir, name, keep string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n := strings.TrimSuffix(e.Name(), ".lock")
		if strings.HasPrefix(n, name+"-") && n != keep && !e.IsDir() {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// buildLog collects go build's output: it counts lines for the progress
// report and keeps the end for an error.
type buildLog struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func (b *buildLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += bytes.Count(p, []byte("\n"))
	b.buf = append(b.buf, p...)
	if len(b.buf) > 64<<10 {
		b.buf = b.buf[len(b.buf)-32<<10:]
	}
	return len(p), nil
}

func (b *buildLog) lines() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *buildLog) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// sourceDir returns the apiserver module's folder in the caller's checkout.
func sourceDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("kubeapi: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("kubeapi: not inside a Go module; run from the Weir checkout")
	}
	src := filepath.Join(filepath.Dir(gomod), "test", "kubeapi", "apiserver")
	if _, err := os.Stat(filepath.Join(src, "go.mod")); err != nil {
		return "", fmt.Errorf("kubeapi: apiserver module not found: %w", err)
	}
	return src, nil
}

func isExecutable(path string) bool { return toolbin.Executable(path) }
