package kubeapi

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// startTimeout bounds Start after the binary is built, even when the
	// caller's context has no deadline.
	startTimeout = 2 * time.Minute
	// stopGrace is how long Close waits after SIGTERM before SIGKILL.
	stopGrace = 10 * time.Second
	// ServiceCIDR is the apiserver's --service-cluster-ip-range.
	ServiceCIDR = "10.96.0.0/16"
)

// Cluster is a running etcd and kube-apiserver on 127.0.0.1.
type Cluster struct {
	Host       string // https://127.0.0.1:PORT
	Token      string // static bearer token of user "admin" in group system:masters
	CAFile     string // PEM to trust for Host: the apiserver's self-signed serving certificate and its CA
	Kubeconfig string // kubeconfig with Host, CA data and Token, for client-go or kubectl
	Dir        string // temporary directory with etcd's data, certificates and both logs

	etcd, apiserver *process

	closeOnce sync.Once
	closeErr  error
}

// Start starts etcd and the apiserver on free loopback ports, with all data
// under a new temporary directory, and returns once /readyz is ok. It builds
// the apiserver first if needed (see Binary) and, when running as root,
// installs Debian's etcd-server package if etcd is missing. On error it
// stops whatever it started. The caller must call Close.
func Start(ctx context.Context) (_ *Cluster, err error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	etcdBin, err := etcdBinary(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	dir, err := os.MkdirTemp("", "weir-kubeapi-")
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %w", err)
	}
	c := &Cluster{Dir: dir}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.Host = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	c.etcd, err = startProcess(dir, "etcd", etcdBin,
		"--name=default",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		// Without these two etcd advertises localhost:2380 to itself.
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--logger=zap",
	)
	if err != nil {
		return nil, err
	}
	// Waiting for etcd first gives a clear error when etcd is the problem;
	// the apiserver would only retry and time out.
	if err := c.etcd.waitFor(ctx, func() bool { return etcdHealthy(ctx, etcdURL) }); err != nil {
		return nil, err
	}

	c.Token, err = writeCredentials(dir)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	// The apiserver generates a self-signed serving certificate (with its
	// CA appended) here, valid for --advertise-address.
	c.CAFile = filepath.Join(certDir, "apiserver.crt")
	c.apiserver, err = startProcess(dir, "kube-apiserver", bin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--cert-dir="+certDir,
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		// RBAC rather than AlwaysAllow, so tests can check that Weir's
		// roles suffice; system:masters bypasses it.
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range="+ServiceCIDR,
		// Endpoints may not hold loopback addresses, so reconciling the
		// "kubernetes" Service to 127.0.0.1 would only log an error every
		// 10 s; that Service has no endpoints here.
		"--endpoint-reconciler-type=none",
	)
	if err != nil {
		return nil, err
	}
	if err := c.apiserver.waitFor(ctx, func() bool { return c.ready(ctx) }); err != nil {
		return nil, err
	}

	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := c.writeKubeconfig(); err != nil {
		return nil, err
	}
	return c, nil
}

// Close stops the apiserver and etcd (SIGTERM to each process group, then
// SIGKILL after a grace period) and removes Dir. It is safe to call more
// than once.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		// The apiserver first, so it does not spin on a vanished etcd.
		for _, p := range []*process{c.apiserver, c.etcd} {
			if p != nil {
				errs = append(errs, p.stop())
			}
		}
		errs = append(errs, os.RemoveAll(c.Dir))
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// HTTPClient returns a client that trusts the apiserver's certificate. Add
// the header "Authorization: Bearer "+c.Token to requests.
func (c *Cluster) HTTPClient() (*http.Client, error) {
	pemData, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("kubeapi: no certificates in %s", c.CAFile)
	}
	return &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}, nil
}

// ready reports whether GET /readyz succeeds with the token.
func (c *Cluster) ready(ctx context.Context) bool {
	// The certificate appears only once the apiserver has started.
	client, err := c.HTTPClient()
	if err != nil {
		return false
	}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Host+"/readyz", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

func etcdHealthy(ctx context.Context, url string) bool {
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

// writeCredentials writes the static token file and the service account
// signing key into dir and returns the token.
func writeCredentials(dir string) (string, error) {
	b := make([]byte, 16)
	rand.Read(b)
	token := hex.EncodeToString(b)
	line := token + ",admin,admin,system:masters\n"
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(line), 0o600); err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	// The apiserver accepts the private key for verification too.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), keyPEM, 0o600); err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	return token, nil
}

func (c *Cluster) writeKubeconfig() error {
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return fmt.Errorf("kubeapi: %w", err)
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: weir-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: weir-test
  context:
    cluster: weir-test
    user: admin
current-context: weir-test
`, c.Host, base64.StdEncoding.EncodeToString(ca), c.Token)
	if err := os.WriteFile(c.Kubeconfig, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("kubeapi: %w", err)
	}
	return nil
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. Another process
// could take one before it is used; that is rare enough for tests.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		// Keep each listener open until all are chosen, so they differ.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubeapi: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// installMu keeps concurrent Starts in this process from racing apt-get.
var installMu sync.Mutex

// etcdBinary returns the path of etcd, installing Debian's etcd-server
// package first if it is missing and we are root.
func etcdBinary(ctx context.Context) (string, error) {
	installMu.Lock()
	defer installMu.Unlock()
	if path, err := exec.LookPath("etcd"); err == nil {
		return path, nil
	}
	if os.Geteuid() != 0 {
		return "", errors.New("kubeapi: etcd not found; install it with: apt-get install etcd-server")
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
			return "", fmt.Errorf("kubeapi: apt-get update: %w\n%s", err, out)
		}
		if out, err := install(); err != nil {
			return "", fmt.Errorf("kubeapi: apt-get install etcd-server: %w\n%s", err, out)
		}
	}
	return exec.LookPath("etcd")
}

// process is a child running in its own process group, logging to a file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result
}

func startProcess(dir, name, path string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %w", err)
	}
	defer f.Close() // the child keeps its own descriptor
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own group, so Close can signal everything the process started.
		Setpgid: true,
		// Die with the test binary: a `go test` timeout exits without
		// running Close.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubeapi: start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitFor polls ok until it returns true, failing early if the process
// exits or ctx ends. Errors carry the tail of the process's log.
func (p *process) waitFor(ctx context.Context, ok func() bool) error {
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("kubeapi: %s exited during startup: %v\n%s", p.name, p.err, p.tail())
		case <-ctx.Done():
			return fmt.Errorf("kubeapi: %s not ready after %v: %w\n%s", p.name, time.Since(start).Round(time.Millisecond), ctx.Err(), p.tail())
		case <-tick.C:
		}
	}
	return nil
}

// stop sends SIGTERM to the process group, waits up to stopGrace for the
// process to exit, then sends SIGKILL to the group in any case, to catch
// children that outlived it.
func (p *process) stop() error {
	pgid := p.cmd.Process.Pid // Setpgid made them equal
	if err := signalGroup(pgid, syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(stopGrace):
	}
	if err := signalGroup(pgid, syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

func signalGroup(pgid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kubeapi: signal %v to process group %d: %w", sig, pgid, err)
	}
	return nil
}

// tail returns the end of the process's log for error messages.
func (p *process) tail() string {
	const max = 4096
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(%s log unavailable: %v)", p.name, err)
	}
	if len(b) > max {
		b = b[len(b)-max:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return fmt.Sprintf("--- tail of the %s log ---\n%s", p.name, b)
}
