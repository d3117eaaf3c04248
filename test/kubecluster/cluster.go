// Package kubecluster runs a real Kubernetes cluster inside a lab (see
// test/lab) for Weir's cluster tests: etcd, the kube-apiserver, the
// kube-controller-manager and the kube-scheduler on the lab's control host,
// and on every node a containerd (Debian's, with runc) and a kubelet whose
// pods are wired by the CNI ptp plugin, one routed veth per pod, in the
// node's pod range. No kube-proxy runs unless asked (Config.KubeProxy): the
// Services are Weir's to serve.
//
//	client ── router (FRR) ── rack LAN 192.0.2.0/24
//	                           ├── control 192.0.2.2: etcd, apiserver :6443, controller-manager, scheduler
//	                           ├── node1 192.0.2.11: containerd, kubelet, pods 10.244.1.0/24
//	                           └── node2 192.0.2.12: containerd, kubelet, pods 10.244.2.0/24
//
// Each node's containerd and kubelet share one private mount namespace, so
// the mounts they make (overlay root filesystems, volumes, the pods'
// network namespaces) vanish with them, and one cgroup per node under
// every v1 hierarchy, so Close finds and kills every process the node
// started, containers included. For Kubernetes' own specs
// (Config.Upstream) containerd has its own host name, the node's, which
// the pods on the host's network see. Every image is built here and
// imported into each node's containerd: no registry is reachable.
//
// The kubelet sets kernel-wide tunables (vm.overcommit_memory,
// kernel.panic, kernel.panic_on_oops) when it starts; Close puts back the
// values it found.
package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weirlb/weir/test/lab"
)

// The cluster's fixed settings.
const (
	// APIPort is the apiserver's port on the control host.
	APIPort = 6443
	// ServiceCIDR is the apiserver's --service-cluster-ip-range.
	ServiceCIDR = "10.96.0.0/16"
	// ClusterCIDR holds every node's pod range (lab.Node.PodCIDRv4).
	ClusterCIDR = "10.244.0.0/16"
)

// Config describes a cluster.
type Config struct {
	Nodes int // kubelet nodes, at least 1
	// Images are imported into every node besides the pause and echo
	// images (Weir's, say).
	Images []Image
	Dir    string // where configurations, data and logs go; default a new temporary folder
	// KubeProxy runs kube-proxy, of the same Kubernetes release, in
	// nftables mode on every node, as the cluster's service proxy: the
	// baseline Weir is compared with.
	KubeProxy bool
	// DNS runs a cluster DNS (test/cmd/clusterdns) behind the kube-dns
	// Service (DNSService), every pod's nameserver: Kubernetes' own tests
	// reach Services by name. It answers once a service proxy serves its
	// Service.
	DNS bool
	// Upstream makes the nodes as Kubernetes' e2e specs expect them: each
	// node's containerd (and so its host-network pods) with the node's
	// name as host name, and host ports (the CNI portmap plugin).
	Upstream bool
}

// Cluster is a running cluster. Close it when done.
type Cluster struct {
	*lab.Lab
	Dir string
	// APIServer is the apiserver's address as the lab's hosts reach it.
	APIServer netip.AddrPort
	// Kubeconfig is an administrator's kubeconfig (system:masters) for
	// programs run on the control host (Control.Start, Control.Run):
	// helm, kubectl.
	Kubeconfig string
	// Rest reaches the apiserver from the caller's process, through the
	// control host's namespace.
	Rest *rest.Config
	Kube kubernetes.Interface

	token, caFile string
	kubeProxy     bool
	dns, upstream bool
	nodes         []*node
	stopLogs      func()            // ends keepPodLogs and waits for its last copy
	tunables      map[string]string // kernel tunables as found, put back by Close
}

// Start builds the images the nodes need, builds the lab and starts the
// control plane and every node, and returns once every node is Ready. On
// error it stops whatever it started.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Nodes < 1 {
		return nil, errors.New("kubecluster: at least one node")
	}
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "weir-kubecluster-"); err != nil {
			return nil, fmt.Errorf("kubecluster: %w", err)
		}
	}
	c := &Cluster{Dir: dir, tunables: readTunables(), kubeProxy: cfg.KubeProxy, dns: cfg.DNS, upstream: cfg.Upstream}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	images, err := c.images(ctx, cfg.Images)
	if err != nil {
		return nil, err
	}
	c.Lab, err = lab.New(ctx, lab.Config{Nodes: cfg.Nodes, Dir: filepath.Join(dir, "logs")})
	if err != nil {
		return nil, err
	}
	c.APIServer = netip.AddrPortFrom(lab.ControlIPv4, APIPort)
	if err := c.startControlPlane(ctx); err != nil {
		return nil, err
	}
	for _, n := range c.Lab.Nodes {
		nd, err := c.startNode(ctx, n, images)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, nd)
	}
	logsCtx, stopLogs := context.WithCancel(context.Background())
	logsDone := make(chan struct{})
	go func() {
		defer close(logsDone)
		c.keepPodLogs(logsCtx)
	}()
	c.stopLogs = func() {
		stopLogs()
		<-logsDone
	}
	if err := c.waitNodesReady(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	if c.dns {
		if err := c.startDNS(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// images builds the pause and echo images and returns every image a node
// imports.
func (c *Cluster) images(ctx context.Context, extra []Image) ([]Image, error) {
	dir := filepath.Join(c.Dir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	pause, err := buildGoImage(ctx, dir, "github.com/weirlb/weir/test/cmd/pause", "pause", PauseImage)
	if err != nil {
		return nil, err
	}
	echo, err := buildGoImage(ctx, dir, "github.com/weirlb/weir/test/cmd/echo", "echo", EchoImage)
	if err != nil {
		return nil, err
	}
	images := []Image{pause, echo}
	if c.dns {
		dns, err := buildGoImage(ctx, dir, "github.com/weirlb/weir/test/cmd/clusterdns", "clusterdns", DNSImage)
		if err != nil {
			return nil, err
		}
		images = append(images, dns)
	}
	return append(images, extra...), nil
}

// Close stops every node (the kubelet and containerd, then whatever is
// left in the node's cgroups: containers, shims), the control plane and the
// lab, removes the cgroups and puts the kernel tunables back. Dir is kept
// (logs). Safe to call more than once.
func (c *Cluster) Close() error {
	var errs []error
	if c.stopLogs != nil {
		c.stopLogs()
		c.stopLogs = nil
	}
	for _, n := range c.nodes {
		errs = append(errs, n.stop())
	}
	c.nodes = nil
	if c.Lab != nil {
		errs = append(errs, c.Lab.Close())
	}
	errs = append(errs, restoreTunables(c.tunables))
	return errors.Join(errs...)
}
