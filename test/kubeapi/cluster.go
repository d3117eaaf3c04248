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
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/weirlb/weir/test/etcdcluster"
	"github.com/weirlb/weir/test/testproc"
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

	etcd, apiserver *testproc.Process

	closeOnce sync.Once
	closeErr  error
}

// Start starts etcd and the apiserver on free loopback ports, with all data
// under a new temporary directory, and returns once /readyz is ok. It builds
// the apiserver first if needed (see Binary) and, when running as root,
// installs Debian's etcd-server package if etcd is missing. apiserverArgs
// are added to the apiserver's flags (--admission-control-config-file,
// say). On error it stops whatever it started. The caller must call Close.
func Start(ctx context.Context, apiserverArgs ...string) (_ *Cluster, err error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	etcdBin, err := etcdcluster.Binary(ctx)
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
	ports, err := testproc.FreePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.Host = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	c.etcd, err = testproc.Start(dir, "etcd", etcdBin,
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
	if err := c.etcd.WaitFor(ctx, func() bool { return etcdcluster.Healthy(ctx, etcdURL) }); err != nil {
		return nil, err
	}

	c.Token, err = WriteCredentials(dir)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	// The apiserver generates a self-signed serving certificate (with its
	// CA appended) here, valid for --advertise-address.
	c.CAFile = filepath.Join(certDir, "apiserver.crt")
	c.apiserver, err = testproc.Start(dir, "kube-apiserver", bin, append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--cert-dir=" + certDir,
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		// RBAC rather than AlwaysAllow, so tests can check that Weir's
		// roles suffice; system:masters bypasses it.
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=" + ServiceCIDR,
		// Endpoints may not hold loopback addresses, so reconciling the
		// "kubernetes" Service to 127.0.0.1 would only log an error every
		// 10 s; that Service has no endpoints here.
		"--endpoint-reconciler-type=none",
	}, apiserverArgs...)...)
	if err != nil {
		return nil, err
	}
	if err := c.apiserver.WaitFor(ctx, func() bool { return c.ready(ctx) }); err != nil {
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
		for _, p := range []*testproc.Process{c.apiserver, c.etcd} {
			if p != nil {
				errs = append(errs, p.Stop(stopGrace))
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

// WriteCredentials writes the static token file (tokens.csv: the token of
// user "admin" in group system:masters) and the service account signing key
// (sa.key) into dir and returns the token.
func WriteCredentials(dir string) (string, error) {
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
	return WriteKubeconfig(c.Kubeconfig, c.Host, c.CAFile, c.Token)
}

// WriteKubeconfig writes to path a kubeconfig for host (https://ADDR:PORT)
// that trusts the certificates in caFile and presents token.
func WriteKubeconfig(path, host, caFile, token string) error {
	ca, err := os.ReadFile(caFile)
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
`, host, base64.StdEncoding.EncodeToString(ca), token)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("kubeapi: %w", err)
	}
	return nil
}
