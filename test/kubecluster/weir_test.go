package kubecluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/kubecluster"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/toolbin"
	"github.com/weirlb/weir/test/wait"
)

const (
	routerASN = 64500
	nodeASN   = 64512
	// The pools of the resources file the chart is given: one announced by
	// BGP to the router, one answered by ARP on the rack LAN.
	bgpPool = "203.0.113.10-203.0.113.19"
	l2Pool  = "192.0.2.200-192.0.2.209"
)

// Weir installed by Helm on a real cluster as its only service proxy and
// load balancer (no kube-proxy), and the chart's whole life under traffic:
// install, Services of every kind answered by real pods, a pod's failing
// readiness probe taking its endpoint out, an upgrade to new images and a
// rollback with every connection through the load-balancer addresses
// counted, and an uninstall after which no node holds anything Weir made.
func TestWeirOnARealCluster(t *testing.T) {
	requireClusterLab(t)
	l := install(t, 2, false)
	t.Run("services", l.services)
	if t.Failed() {
		return // the rest needs the addresses
	}
	t.Run("readiness", l.readiness)
	t.Run("crashes under traffic", l.crashes)
	t.Run("upgrade and rollback under traffic", l.upgradeAndRollback)
	t.Run("uninstall", l.uninstall)
}

// life is the cluster Weir lives in, from its install on.
type life struct {
	c      *kubecluster.Cluster
	router *frr.Router
	helm   *helmRunner
	before map[string]string // what each node held before the install
	pods   []corev1.Pod
	svcs   map[string]*corev1.Service
	// The load-balancer addresses, once assigned (services).
	lbBGP, lbL2 netip.Addr
}

// install builds the images and a cluster of nodes nodes (made for
// Kubernetes' own specs, with a cluster DNS, when forUpstream), starts the
// router, installs Weir with Helm and the echo workload behind its
// Services.
func install(t *testing.T, nodes int, forUpstream bool) *life {
	ctx := t.Context()
	start := time.Now()
	images, err := kubecluster.WeirImages(ctx, t.TempDir(), "lab1", "lab2")
	if err != nil {
		t.Fatal(err)
	}
	// Kubernetes' own tests' images: the upstream specs run here too.
	upstream, err := kubecluster.UpstreamImages(ctx, filepath.Join(t.TempDir(), "e2e-images"))
	if err != nil {
		t.Fatal(err)
	}
	images = append(images, upstream...)
	t.Logf("Weir's images built in %v", time.Since(start).Round(time.Second))
	l := &life{c: kubecluster.StartForTest(t, kubecluster.Config{Nodes: nodes, Images: images, DNS: forUpstream, Upstream: forUpstream})}
	l.router, err = frr.StartTemp(ctx, l.c.Router, frr.Config{
		ASN: routerASN, RouterID: lab.RouterLANv4.String(),
		ListenRanges: []string{"192.0.2.0/24"}, PeerASN: nodeASN,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.router.Close() })
	l.before = nodeState(t, l.c)
	l.helm = newHelm(t, l.c)
	l.helm.run(t, append([]string{"install", "weir", chartDir(t), "--namespace", "weir-system", "--create-namespace",
		"--wait", "--timeout", "4m"}, weirValues(l.c, "lab1", forUpstream)...)...)
	kubecluster.ApplyEcho(t, l.c, "default", "echo", 2, nil)
	l.pods = kubecluster.WaitPodsReady(t, l.c, "default", "app=echo", 2)
	l.svcs = applyServices(t, l.c)
	return l
}

// services: every kind of Service, from where its users are, answered by
// both pods.
func (l *life) services(t *testing.T) {
	c, pods := l.c, names(l.pods)
	clusterIP := netip.MustParseAddr(l.svcs["echo-clusterip"].Spec.ClusterIP)
	nodePort := uint16(l.svcs["echo-nodeport"].Spec.Ports[0].NodePort)
	l.lbBGP = waitLoadBalancerIP(t, c, "echo-bgp")
	l.lbL2 = waitLoadBalancerIP(t, c, "echo-l2")
	lbLocal := waitLoadBalancerIP(t, c, "echo-local")
	// ClusterIP from both nodes.
	for _, n := range c.Nodes {
		seeAll(t, n.Netns, netip.AddrPortFrom(clusterIP, 80), pods)
	}
	// And from a pod: its packets reach the node's prerouting hook, not
	// output, and the reply must find its way back.
	seeAll(t, kubecluster.PodNetns(t, c, &l.pods[0]), netip.AddrPortFrom(clusterIP, 80), pods)
	// The kubernetes Service itself, through Weir's rules: pods reach the
	// apiserver with no kube-proxy.
	reach(t, c.Nodes[0].Netns, netip.AddrPortFrom(netip.MustParseAddr("10.96.0.1"), 443))
	// NodePort from the client, through the router.
	seeAll(t, c.Client, netip.AddrPortFrom(c.Nodes[0].IPv4, nodePort), pods)
	// The BGP address through the router's route to the nodes.
	seeAll(t, c.Client, netip.AddrPortFrom(l.lbBGP, 80), pods)
	// The L2 address from the rack LAN (the control host's side).
	seeAll(t, c.Control, netip.AddrPortFrom(l.lbL2, 80), pods)
	// Local traffic policy: the client's address reaches the pod.
	r := get(t, c.Client, netip.AddrPortFrom(lbLocal, 80))
	if !strings.HasPrefix(r.Remote, lab.ClientIPv4.String()+":") {
		t.Errorf("externalTrafficPolicy Local: the pod saw %s, want the client %s", r.Remote, lab.ClientIPv4)
	}
	checkStatus(t, c, "echo-bgp")
}

// readiness: a real readiness probe failing takes the pod out end to end,
// and passing again brings it back.
func (l *life) readiness(t *testing.T) {
	out, in := l.pods[0], l.pods[1]
	probe := netip.AddrPortFrom(netip.MustParseAddr(out.Status.PodIP), 8080)
	post(t, l.c.Nodes[0].Netns, probe, "/readyz?ready=false")
	wait.For(t, 30*time.Second, "only "+in.Name+" answers", func() error {
		return onlyAnswers(l.c.Client, netip.AddrPortFrom(l.lbBGP, 80), in.Name, 10)
	})
	post(t, l.c.Nodes[0].Netns, probe, "/readyz?ready=true")
	seeAll(t, l.c.Client, netip.AddrPortFrom(l.lbBGP, 80), names(l.pods))
}

// crashes: SIGKILL, as a crash or the kernel's OOM killer would send it,
// under the rollout's traffic, and the kubelet restarts what was killed.
// Each node's agent in turn: the node keeps forwarding and answering, the
// restarted agent takes the node's state over, and no connection fails.
// Then every server replica at once: the nodes keep forwarding, and no
// connection through BGP fails while a new leader is elected; the L2
// address is left out of that count, since its owner stops answering ARP
// once its lease ends with no server to renew it (fail-closed, see
// docs/operations.md), which a host that must confirm its neighbour entry
// then sees. A pod's readiness still reaches the nodes afterwards,
// through the new leader.
func (l *life) crashes(t *testing.T) {
	bgp, l2 := netip.AddrPortFrom(l.lbBGP, 80), netip.AddrPortFrom(l.lbL2, 80)
	// Every replica running: helm --wait counts a Deployment ready with
	// one replica short (its maxUnavailable), and a new replica waits for
	// its certificates' volumes for up to a minute.
	waitRolledOut(t, l.c)
	underLoad(t, "agents killed", l.c.Client, []netip.AddrPort{bgp, l2}, func() {
		for _, pod := range weirPods(t, l.c, "weir-agent") {
			killAndWaitRestarted(t, l.c, []corev1.Pod{pod}, "weir-agent")
		}
	})
	underLoad(t, "servers killed", l.c.Client, []netip.AddrPort{bgp}, func() {
		killAndWaitRestarted(t, l.c, weirPods(t, l.c, "weir-server"), "weir-server")
		waitRolledOut(t, l.c)
	})
	reach(t, l.c.Client, l2)
	l.readiness(t)
}

// underLoad runs do with a new connection to each target every 20 ms, and
// fails the test if any of them failed then or in the 3 s after.
func underLoad(t *testing.T, name string, from *lab.Netns, targets []netip.AddrPort, do func()) {
	t.Helper()
	load := startLoad(from, targets)
	began := time.Now()
	do()
	// Keep going a little longer: late breakage counts.
	time.Sleep(3 * time.Second)
	ok, failed := load.stop()
	t.Logf("%s: %d connections, %d failed, in %v", name, ok+len(failed), len(failed), time.Since(began).Round(time.Millisecond))
	for _, f := range failed {
		t.Logf("%s: failed: %s", name, f)
	}
	if len(failed) > 0 {
		t.Errorf("%s: %d connections failed, want none", name, len(failed))
	}
}

// weirPods lists the running pods of one of Weir's workloads.
func weirPods(t *testing.T, c *kubecluster.Cluster, name string) []corev1.Pod {
	t.Helper()
	list, err := c.Kube.CoreV1().Pods("weir-system").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		t.Fatalf("no %s pod", name)
	}
	return list.Items
}

// killAndWaitRestarted SIGKILLs container in each pod at once, and waits
// until the kubelet has started it again and it is ready.
func killAndWaitRestarted(t *testing.T, c *kubecluster.Cluster, pods []corev1.Pod, container string) {
	t.Helper()
	restarts := map[string]int32{}
	for _, pod := range pods {
		for _, s := range pod.Status.ContainerStatuses {
			if s.Name == container {
				restarts[pod.Name] = s.RestartCount
			}
		}
		t.Logf("SIGKILL to %s of %s on %s (processes %v)", container, pod.Name, pod.Spec.NodeName,
			kubecluster.KillContainer(t, c, &pod, container))
	}
	for _, pod := range pods {
		wait.For(t, 3*time.Minute, pod.Name+" restarted and ready", func() error {
			p, err := c.Kube.CoreV1().Pods("weir-system").Get(t.Context(), pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == container && s.RestartCount > restarts[pod.Name] && s.Ready {
					return nil
				}
			}
			return fmt.Errorf("%s not restarted and ready yet: %+v", container, p.Status.ContainerStatuses)
		})
	}
}

// upgradeAndRollback: helm upgrade to other image tags, then helm
// rollback, each with a new connection to each load-balancer address
// every 20 ms from the client, counted. WEIR_CLUSTER_CYCLES=N (default
// 1) repeats both: the longer, opt-in run.
func (l *life) upgradeAndRollback(t *testing.T) {
	cycles := 1
	if v := os.Getenv("WEIR_CLUSTER_CYCLES"); v != "" {
		var err error
		if cycles, err = strconv.Atoi(v); err != nil || cycles < 1 {
			t.Fatalf("WEIR_CLUSTER_CYCLES=%q: want a count", v)
		}
	}
	steps := []struct {
		name string
		args []string
	}{
		{"upgrade to lab2", append([]string{"upgrade", "weir", chartDir(t), "--namespace", "weir-system", "--wait", "--timeout", "4m"}, weirValues(l.c, "lab2", false)...)},
		// No revision: the one before, lab1's.
		{"rollback", []string{"rollback", "weir", "--namespace", "weir-system", "--wait", "--timeout", "4m"}},
	}
	targets := []netip.AddrPort{netip.AddrPortFrom(l.lbBGP, 80), netip.AddrPortFrom(l.lbL2, 80)}
	for cycle := range cycles {
		for _, step := range steps {
			underLoad(t, fmt.Sprintf("cycle %d, %s", cycle+1, step.name), l.c.Client, targets, func() {
				l.helm.run(t, step.args...)
				waitRolledOut(t, l.c)
			})
		}
	}
}

// uninstall: after helm uninstall no node holds anything Weir made, no
// router hears of Weir and the L2 address answers nothing.
func (l *life) uninstall(t *testing.T) {
	ctx, c := t.Context(), l.c
	l.helm.run(t, "uninstall", "weir", "--namespace", "weir-system", "--wait", "--timeout", "3m")
	wait.For(t, 60*time.Second, "no Weir pod left", func() error {
		list, err := c.Kube.CoreV1().Pods("weir-system").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d pods left", len(list.Items))
		}
		return nil
	})
	wait.For(t, 30*time.Second, "every node as before the install", func() error {
		after := nodeState(t, c)
		for name, b := range l.before {
			if d := diff(b, after[name]); d != "" {
				return fmt.Errorf("%s:\n%s", name, d)
			}
		}
		return nil
	})
	for name, s := range nodeState(t, c) {
		t.Logf("after uninstall, %s holds:\n%s", name, s)
	}
	wait.For(t, 30*time.Second, "no BGP session at the router", func() error {
		n, err := l.router.Established(ctx)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d sessions established", n)
		}
		return nil
	})
	if out, err := c.Router.Run(ctx, "ip", "route", "show", "203.0.113.0/24"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("the router still routes the pool: %q %v", out, err)
	}
	if _, err := c.Control.DialContext(ctxTimeout(t, 3*time.Second), "tcp", netip.AddrPortFrom(l.lbL2, 80).String()); err == nil {
		t.Errorf("%s still answers after the uninstall", l.lbL2)
	}
}

func chartDir(t *testing.T) string {
	dir, err := filepath.Abs("../../deploy/helm/weir")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// weirValues are the chart's settings for the lab: the server on the
// nodes' own addresses (no service proxy exists before Weir's agents run),
// the apiserver's real address, BGP to the router and the two pools.
func weirValues(c *kubecluster.Cluster, tag string, upstream bool) []string {
	var servers, hosts []string
	for _, n := range c.Nodes {
		servers = append(servers, n.IPv4.String()+":7443")
		hosts = append(hosts, n.IPv4.String())
	}
	resources := fmt.Sprintf(`kind: AddressPool
metadata:
  name: public
addresses:
- %s
---
kind: AddressPool
metadata:
  name: rack-lan
addresses:
- %s
l2_advertisement: {}
`, bgpPool, l2Pool)
	values := []string{
		"--set", "image.tag=" + tag,
		"--set", "server.replicas=2",
		"--set", "server.hostNetwork=true",
		"--set", "server.address=" + strings.Join(servers, "\\,"),
		"--set", "server.hosts=" + strings.Join(hosts, "\\,"),
		"--set", "kubernetesAPI=" + c.APIServer.String(),
		"--set", "clusterCIDR=" + kubecluster.ClusterCIDR,
		"--set", "serviceCIDR=" + kubecluster.ServiceCIDR,

		"--set", fmt.Sprintf("bgp.asn=%d", nodeASN),
		"--set", fmt.Sprintf("bgp.peers=%s/%d", lab.RouterLANv4, routerASN),
		"--set-string", "resourcesFile=" + resources,
	}
	if upstream {
		// The external IP upstream's ExternalIP spec gives its Service:
		// Weir programs none outside the allowed ranges (kube-proxy every
		// one).
		values = append(values, "--set", "allowedExternalIPCIDRs="+upstreamExternalIP+"/32")
	}
	return values
}

type helmRunner struct {
	bin, kubeconfig string
	ns              *lab.Netns
}

func newHelm(t *testing.T, c *kubecluster.Cluster) *helmRunner {
	bin, err := toolbin.Helm(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return &helmRunner{bin: bin, kubeconfig: c.Kubeconfig, ns: c.Control}
}

// run runs helm on the control host, where the apiserver is.
func (h *helmRunner) run(t *testing.T, args ...string) {
	t.Helper()
	began := time.Now()
	out, err := h.ns.Run(t.Context(), h.bin, append([]string{"--kubeconfig", h.kubeconfig}, args...)...)
	if err != nil {
		t.Fatalf("helm %s: %v", args[0], err)
	}
	t.Logf("helm %s: %v", args[0], time.Since(began).Round(time.Millisecond))
	_ = out
}

func applyServices(t *testing.T, c *kubecluster.Cluster) map[string]*corev1.Service {
	t.Helper()
	class := "weir.dev/weir"
	mk := func(name string, typ corev1.ServiceType, mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{
				Type:     typ,
				Selector: map[string]string{"app": "echo"},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			},
		}
		if typ == corev1.ServiceTypeLoadBalancer {
			s.Spec.LoadBalancerClass = &class
		}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	pool := func(name string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{"weir.dev/address-pool": name} }
	}
	want := []*corev1.Service{
		mk("echo-clusterip", corev1.ServiceTypeClusterIP, nil),
		mk("echo-nodeport", corev1.ServiceTypeNodePort, nil),
		mk("echo-bgp", corev1.ServiceTypeLoadBalancer, pool("public")),
		mk("echo-l2", corev1.ServiceTypeLoadBalancer, pool("rack-lan")),
		mk("echo-local", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
			pool("public")(s)
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}),
	}
	got := map[string]*corev1.Service{}
	for _, s := range want {
		created, err := c.Kube.CoreV1().Services("default").Create(t.Context(), s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got[s.Name] = created
	}
	return got
}

func waitLoadBalancerIP(t *testing.T, c *kubecluster.Cluster, name string) netip.Addr {
	t.Helper()
	var ip netip.Addr
	wait.For(t, 60*time.Second, "an address for "+name, func() error {
		s, err := c.Kube.CoreV1().Services("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Status.LoadBalancer.Ingress) == 0 {
			return fmt.Errorf("no ingress yet")
		}
		ip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return err
	})
	return ip
}

// checkStatus: what a kubectl user sees on the Service: Weir's conditions
// and its Events.
func checkStatus(t *testing.T, c *kubecluster.Cluster, name string) {
	t.Helper()
	wait.For(t, 30*time.Second, name+"'s conditions and Events", func() error {
		s, err := c.Kube.CoreV1().Services("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var conds []string
		for _, cond := range s.Status.Conditions {
			conds = append(conds, cond.Type+"="+string(cond.Status))
		}
		if !slices.Contains(conds, "weir.dev/AddressAssigned=True") && !slices.ContainsFunc(conds, func(s string) bool { return strings.HasSuffix(s, "AddressAssigned=True") }) {
			return fmt.Errorf("conditions %v", conds)
		}
		events, err := c.Kube.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Service,involvedObject.name=" + name,
		})
		if err != nil {
			return err
		}
		if len(events.Items) == 0 {
			return fmt.Errorf("no Events on the Service")
		}
		return nil
	})
}

func names(pods []corev1.Pod) []string {
	var n []string
	for _, p := range pods {
		n = append(n, p.Name)
	}
	return n
}

// seeAll waits until every one of want has answered at to, from from.
func seeAll(t *testing.T, from *lab.Netns, to netip.AddrPort, want []string) {
	t.Helper()
	seen := map[string]bool{}
	wait.For(t, 60*time.Second, fmt.Sprintf("%v answering %s from %s", want, to, from), func() error {
		r, err := tryGet(from, to)
		if err != nil {
			return err
		}
		seen[r.Pod] = true
		for _, w := range want {
			if !seen[w] {
				return fmt.Errorf("seen %v", seen)
			}
		}
		return nil
	})
}

func reach(t *testing.T, from *lab.Netns, to netip.AddrPort) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("a TCP connection to %s from %s", to, from), func() error {
		conn, err := from.DialContext(ctxTimeout(t, 2*time.Second), "tcp", to.String())
		if err != nil {
			return err
		}
		return conn.Close()
	})
}

func onlyAnswers(from *lab.Netns, to netip.AddrPort, pod string, n int) error {
	for range n {
		r, err := tryGet(from, to)
		if err != nil {
			return err
		}
		if r.Pod != pod {
			return fmt.Errorf("%s answered", r.Pod)
		}
	}
	return nil
}

func post(t *testing.T, from *lab.Netns, to netip.AddrPort, path string) {
	t.Helper()
	resp, err := from.HTTPClient(3*time.Second).Post("http://"+to.String()+path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// load opens a new connection to each target, one request each, every
// 20 ms, until stopped, and keeps what failed.
type load struct {
	stopc  chan struct{}
	wg     sync.WaitGroup
	ok     atomic.Int64
	mu     sync.Mutex
	failed []failure
}

func startLoad(from *lab.Netns, targets []netip.AddrPort) *load {
	l := &load{stopc: make(chan struct{})}
	for _, to := range targets {
		l.wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-l.stopc:
					return
				case <-tick.C:
				}
				began := time.Now()
				if err := attempt(from, to); err != nil {
					l.mu.Lock()
					l.failed = append(l.failed, failure{at: began, msg: fmt.Sprintf("%s: %v", to, err)})
					l.mu.Unlock()
					continue
				}
				l.ok.Add(1)
			}
		})
	}
	return l
}

func (l *load) stop() (int, []failure) {
	close(l.stopc)
	l.wg.Wait()
	return int(l.ok.Load()), l.failed
}

// failure is one connection that failed, and when it started.
type failure struct {
	at  time.Time
	msg string
}

func (f failure) String() string { return f.at.Format("15:04:05.000") + " " + f.msg }

// waitRolledOut waits until the server Deployment and the agent DaemonSet
// run only their newest pods, all ready.
func waitRolledOut(t *testing.T, c *kubecluster.Cluster) {
	t.Helper()
	wait.For(t, 4*time.Minute, "Weir rolled out", func() error {
		d, err := c.Kube.AppsV1().Deployments("weir-system").Get(t.Context(), "weir-server", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.UpdatedReplicas != *d.Spec.Replicas || d.Status.ReadyReplicas != *d.Spec.Replicas || d.Status.Replicas != *d.Spec.Replicas {
			return fmt.Errorf("server: %d updated, %d ready, %d in all", d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.Replicas)
		}
		ds, err := c.Kube.AppsV1().DaemonSets("weir-system").Get(t.Context(), "weir-agent", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ds.Status.UpdatedNumberScheduled != ds.Status.DesiredNumberScheduled || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
			return fmt.Errorf("agents: %d updated, %d ready of %d", ds.Status.UpdatedNumberScheduled, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
		}
		return nil
	})
}

// nodeState is what each node holds that Weir could have made: nftables
// tables, addresses, routes, links (pods' veths left out: they come and go
// with the workload).
func nodeState(t *testing.T, c *kubecluster.Cluster) map[string]string {
	t.Helper()
	state := map[string]string{}
	for _, n := range c.Nodes {
		var b strings.Builder
		for _, cmd := range [][]string{
			{"nft", "list", "tables"},
			{"ip", "-brief", "addr"},
			{"ip", "route"},
			{"ip", "-6", "route"},
			{"ip", "-brief", "link"},
		} {
			out, err := n.Run(t.Context(), cmd[0], cmd[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			for line := range strings.Lines(out) {
				if strings.HasPrefix(line, "veth") || strings.Contains(line, " dev veth") || strings.Contains(line, "10.244.") && strings.Contains(line, "veth") {
					continue
				}
				b.WriteString(strings.Join(cmd, " ") + ": " + line)
			}
		}
		state[n.Name] = b.String()
	}
	return state
}

func diff(before, after string) string {
	var d []string
	b := strings.Split(before, "\n")
	a := strings.Split(after, "\n")
	for _, l := range a {
		if !slices.Contains(b, l) {
			d = append(d, "+ "+l)
		}
	}
	for _, l := range b {
		if !slices.Contains(a, l) {
			d = append(d, "- "+l)
		}
	}
	return strings.Join(d, "\n")
}
