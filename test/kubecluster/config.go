package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/weirlb/weir/test/kubeapi"
)

func kubeBinary(ctx context.Context) (string, error) { return kubeapi.Binary(ctx) }

// writeConfigs writes the node's containerd, CNI and kubelet
// configurations.
func (n *node) writeConfigs(c *Cluster) error {
	files := map[string]string{
		"containerd.toml":          n.containerdConfig(),
		"cni/10-weir-lab.conflist": n.cniConfig(c),
		"kubelet.yaml":             n.kubeletConfig(c),
		"kube-proxy.yaml":          n.kubeProxyConfig(c),
		// The node resolves no names: pods resolve the cluster's through
		// the cluster DNS, when it runs (Config.DNS), and no others.
		"resolv.conf": "options ndots:1\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("kubecluster: %w", err)
		}
	}
	return nil
}

func (n *node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # The lab runs without CAP_SYS_RESOURCE on some machines: no container
  # may ask for a lower OOM score than containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[6]q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
`, filepath.Join(n.dir, "containerd", "root"), filepath.Join(n.dir, "containerd", "state"),
		n.socket, n.socket+".ttrpc", PauseImage, filepath.Join(n.dir, "cni"))
}

// cniConfig: the ptp plugin, one routed veth per pod with the node as the
// pods' gateway, addresses from the node's pod range. The lab routes each
// node's range to it, on the other nodes and on the router. For
// Kubernetes' own specs (Config.Upstream) the portmap plugin serves the
// pods' host ports.
func (n *node) cniConfig(c *Cluster) string {
	portmap := ""
	if c.upstream {
		portmap = `, {
    "type": "portmap",
    "capabilities": {"portMappings": true}
  }`
	}
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "weir-lab",
  "plugins": [{
    "type": "ptp",
    "ipMasq": false,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": %q
    }
  }%s]
}
`, n.PodCIDRv4.String(), filepath.Join(n.dir, "ipam"), portmap)
}

func (n *node) kubeletConfig(c *Cluster) string {
	clusterDNS := ""
	if c.dns {
		clusterDNS = "clusterDNS: [" + DNSService + "]\n"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This kind of machine has cgroup v1 and no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
podLogsDir: %[3]s
resolvConf: %[4]s
clusterDomain: cluster.local
%[5]smaxPods: 40
serializeImagePulls: false
# The lab's disk is shared with the machine: evict nothing for it, and
# never collect the images no registry could give back.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, n.cgroup, n.socket, filepath.Join(n.dir, "pod-logs"), filepath.Join(n.dir, "resolv.conf"), clusterDNS)
}

// kubeProxyConfig: kube-proxy in nftables mode, as a cluster that runs it
// would, except that it leaves conntrack's kernel-wide sizes alone and
// keeps its OOM score (the lab may lack CAP_SYS_RESOURCE).
func (n *node) kubeProxyConfig(c *Cluster) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: %[1]q}
hostnameOverride: %[2]s
clusterCIDR: %[3]s
detectLocalMode: ClusterCIDR
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack: {maxPerCore: 0, min: 0}
`, c.Kubeconfig, n.Name, ClusterCIDR)
}

// The kernel-wide tunables the kubelet sets at start.
var tunablePaths = []string{
	"/proc/sys/vm/overcommit_memory",
	"/proc/sys/vm/panic_on_oom",
	"/proc/sys/kernel/panic",
	"/proc/sys/kernel/panic_on_oops",
}

func readTunables() map[string]string {
	m := map[string]string{}
	for _, p := range tunablePaths {
		if b, err := os.ReadFile(p); err == nil {
			m[p] = strings.TrimSpace(string(b))
		}
	}
	return m
}

func restoreTunables(m map[string]string) error {
	var errs []error
	for p, v := range m {
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("kubecluster: put back %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
