package kubecluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weirlb/weir/test/etcdcluster"
	"github.com/weirlb/weir/test/kubeapi"
)

// startControlPlane starts etcd, the apiserver, the controller-manager and
// the scheduler on the control host, and returns once the apiserver is
// ready.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	kube, err := kubeapi.Binary(ctx)
	if err != nil {
		return err
	}
	etcd, err := etcdcluster.Binary(ctx)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Dir, "control")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	if c.token, err = kubeapi.WriteCredentials(dir); err != nil {
		return err
	}
	ctl := c.Control
	// The control host's own loopback: nothing else reaches etcd.
	const etcdURL, peerURL = "http://127.0.0.1:2379", "http://127.0.0.1:2380"
	if _, err := ctl.Start(etcd,
		"--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--logger=zap",
	); err != nil {
		return err
	}
	certDir := filepath.Join(dir, "certs")
	// The apiserver makes a self-signed serving certificate for its
	// advertise address and the kubernetes Service's names and address.
	c.caFile = filepath.Join(certDir, "apiserver.crt")
	addr := c.APIServer.Addr().String()
	if _, err := ctl.Start(kube, "kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=0.0.0.0", "--advertise-address="+addr,
		"--secure-port="+strconv.Itoa(APIPort), "--cert-dir="+certDir,
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range="+ServiceCIDR,
		// Weir's agents run privileged.
		"--allow-privileged=true",
		// Webhooks are called at their endpoints' addresses: the control
		// host is no node and has no service proxy.
		"--enable-aggregator-routing=true",
		// No cluster DNS resolves the nodes' names (logs, exec).
		"--kubelet-preferred-address-types=InternalIP",
	); err != nil {
		return err
	}
	if err := waitFile(ctx, c.caFile, time.Minute); err != nil {
		return fmt.Errorf("kubecluster: the apiserver wrote no certificate: %w", err)
	}
	host := "https://" + c.APIServer.String()
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := kubeapi.WriteKubeconfig(c.Kubeconfig, host, c.caFile, c.token); err != nil {
		return err
	}
	ca, err := os.ReadFile(c.caFile)
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	c.Rest = &rest.Config{
		Host:            host,
		BearerToken:     c.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		Dial:            ctl.DialContext,
		QPS:             50, Burst: 100,
	}
	if c.Kube, err = kubernetes.NewForConfig(c.Rest); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	if err := poll(ctx, time.Minute, func() bool {
		_, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil
	}); err != nil {
		return fmt.Errorf("kubecluster: the apiserver is not ready: %w", err)
	}
	if _, err := ctl.Start(kube, "kube-controller-manager",
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false",
		"--root-ca-file="+c.caFile,
		"--service-account-private-key-file="+filepath.Join(dir, "sa.key"),
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
	); err != nil {
		return err
	}
	if _, err := ctl.Start(kube, "kube-scheduler",
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1",
	); err != nil {
		return err
	}
	return nil
}

// waitNodesReady waits until every node has registered and is Ready.
func (c *Cluster) waitNodesReady(ctx context.Context, timeout time.Duration) error {
	var last string
	err := poll(ctx, timeout, func() bool {
		list, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		ready := 0
		for _, n := range list.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		last = fmt.Sprintf("%d of %d nodes registered, %d ready", len(list.Items), len(c.nodes), ready)
		return ready == len(c.nodes)
	})
	if err != nil {
		return fmt.Errorf("kubecluster: nodes not ready (%s): %w; logs in %s", last, err, c.Lab.Dir)
	}
	return nil
}

func waitFile(ctx context.Context, path string, timeout time.Duration) error {
	return poll(ctx, timeout, func() bool {
		st, err := os.Stat(path)
		return err == nil && st.Size() > 0
	})
}

// poll calls ok every 200 ms until it returns true, ctx ends or timeout
// passes.
func poll(ctx context.Context, timeout time.Duration, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
