package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weirlb/weir/agent/flows"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/kubeapi"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// The agents' DaemonSet, as the manifests name it.
const (
	agentNamespace = "weir-system"
	agentDaemonSet = "weir-agent"
)

// An agent keeps what it programmed when it stops while its DaemonSet is in
// place (a restart, an upgrade) or when it cannot tell (the apiserver
// gone), and removes all of it when it stops after its DaemonSet was
// deleted (helm uninstall, kubectl delete -k), which deletes the agent's
// RBAC at the same time. The apiserver is real, reached from the nodes'
// namespaces through a relay; there are no kubelets, so the test sends the
// SIGTERM the garbage collector's pod deletion would.
func TestAgentsRemoveWhatTheyProgrammedOnlyWhenUninstalled(t *testing.T) {
	lab.SkipUnlessPrivileged(t)
	kube, cs, watchArgs := installedAgents(t)
	c := startClusterWith(t, func(c *weirlab.Cluster) { c.AgentArgs = watchArgs })
	createWeb(t, c)
	for i := range c.Nodes {
		waitWatching(t, c, i)
	}

	// (1) A restart: the DaemonSet stays, so do the tables, and the
	// node goes on forwarding with no agent.
	before := programmed(t, c.Nodes[0])
	if !strings.Contains(before, "table ip weir") || !strings.Contains(before, "table ip6 weir") {
		t.Fatalf("before stopping, node1 holds:\n%s", before)
	}
	if err := c.Agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	if after := programmed(t, c.Nodes[0]); after != before {
		t.Errorf("an agent stopped with its DaemonSet in place changed the node:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if err := forwards(c.Nodes[0]); err != nil {
		t.Errorf("with its agent stopped for a restart, node1 no longer forwards: %v", err)
	}
	if err := c.StopAndRestartAgent(0); err != nil {
		t.Fatal(err)
	}
	waitWatching(t, c, 0)

	// (2) An uninstall: the DaemonSet deleted, its RBAC right after,
	// then the pods' SIGTERM.
	uninstall(t, c, cs)
	for i, a := range c.Agents {
		if err := a.Stop(); err != nil {
			t.Fatal(err)
		}
		if left := programmed(t, c.Nodes[i]); left != programmed(t, nil) {
			t.Errorf("after the uninstall, %s still holds what Weir made:\n%s", c.Nodes[i].Name, left)
		}
	}

	// (3) The apiserver gone before the SIGTERM, no deletion seen: the
	// agent cannot tell, and keeps the node forwarding.
	createAgentObjects(t, cs)
	for i := range c.Nodes {
		if err := c.StopAndRestartAgent(i); err != nil {
			t.Fatal(err)
		}
		waitWatching(t, c, i)
	}
	wait.For(t, 10*time.Second, "node1 programmed again", func() error {
		if now := programmed(t, c.Nodes[0]); !strings.Contains(now, "table ip weir") {
			return fmt.Errorf("node1 holds:\n%s", now)
		}
		return nil
	})
	before = programmed(t, c.Nodes[0])
	if err := kube.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	if after := programmed(t, c.Nodes[0]); after != before {
		t.Errorf("an agent that could not reach the apiserver changed the node when it stopped:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if log := c.Agents[0].Log(); !strings.Contains(log, "the nftables tables stay") {
		t.Errorf("the agent did not say why it kept its tables:\n%s", log)
	}
	if err := forwards(c.Nodes[0]); err != nil {
		t.Errorf("with the apiserver and its agent gone, node1 no longer forwards: %v", err)
	}
}

// With graceful restart offered to its router, an agent stopped for a
// restart leaves its routes to the router (the node's rules stay), and an
// agent stopped by an uninstall ends its sessions: the router withdraws
// its routes at once, as its rules are gone.
func TestUninstallEndsBGPSessions(t *testing.T) {
	lab.SkipUnlessPrivileged(t)
	_, cs, watchArgs := installedAgents(t)
	ctx := context.Background()
	c, r := startBGPClusterWith(t, watchArgs, labRouter)
	node1 := c.Nodes[0]
	if _, err := c.Registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{
		Metadata: &weirv1.ObjectMeta{Name: "upstream"}, Address: lab.RouterLANv4.String(), Asn: routerASN, MyAsn: nodeASN, GracefulRestart: true}}); err != nil {
		t.Fatal(err)
	}
	svc := lbService("uninstalled", 30113, []string{"10.96.0.73"}, []string{"203.0.113.73"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = 32113
	createService(t, c, svc, node1.Pods)
	waitNextHops(t, r, "203.0.113.73", node1.IPv4.String())
	eventually(t, "the router sees graceful restart from node1", func() error {
		if ok, err := r.GracefulRestartFrom(ctx, node1.IPv4.String()); !ok {
			return fmt.Errorf("not yet (%v)", err)
		}
		return nil
	})
	waitWatching(t, c, 0)

	// A restart: the router keeps the route.
	if err := c.Agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if hops, err := r.NextHops(ctx, "203.0.113.73"); err != nil || !slices.Contains(hops, node1.IPv4.String()) {
		t.Fatalf("3 s after an agent stopped for a restart, the router's route goes via %v (%v); want node1 kept (graceful restart)", hops, err)
	}
	if err := c.StopAndRestartAgent(0); err != nil {
		t.Fatal(err)
	}
	waitWatching(t, c, 0)
	eventually(t, "the router holds node1's route from its new session", func() error {
		if ok, err := r.RestartDone(ctx, node1.IPv4.String(), "203.0.113.73/32"); !ok {
			return fmt.Errorf("not yet (%v)", err)
		}
		return nil
	})

	// An uninstall: the route goes at once.
	uninstall(t, c, cs)
	stopped := time.Now()
	if err := c.Agents[0].Stop(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 3*time.Second, "the router withdraws node1's route after the uninstall", func() error {
		if hops, err := r.NextHops(ctx, "203.0.113.73"); err == nil && slices.Contains(hops, node1.IPv4.String()) {
			return fmt.Errorf("the route still goes via %v", hops)
		}
		return nil
	})
	t.Logf("route withdrawn %v after the SIGTERM", time.Since(stopped).Round(time.Millisecond))
	if left := programmed(t, node1); left != programmed(t, nil) {
		t.Errorf("after the uninstall, node1 still holds what Weir made:\n%s", left)
	}
}

// installedAgents starts an apiserver holding what an install makes for
// the agents, and returns it, a client, and the flags that make an agent
// watch its DaemonSet there (the apiserver is relayed into each node).
func installedAgents(t *testing.T) (*kubeapi.Cluster, kubernetes.Interface, func(*lab.Node) []string) {
	t.Helper()
	kube := kubeapi.StartForTest(t)
	cs := kubeClient(t, kube)
	createAgentObjects(t, cs)
	token := filepath.Join(t.TempDir(), "token")
	writeAgentToken(t, cs, token)
	apiserver, err := url.Parse(kube.Host)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	relayed := map[string]bool{}
	return kube, cs, func(n *lab.Node) []string {
		// The apiserver listens on the host's loopback: the node
		// reaches it at the same address on its own.
		mu.Lock()
		defer mu.Unlock()
		if !relayed[n.Name] {
			relay(t, n.Netns, apiserver.Host)
			relayed[n.Name] = true
		}
		return []string{"--own-daemonset", agentNamespace + "/" + agentDaemonSet,
			"--kube-apiserver", kube.Host, "--kube-token-file", token, "--kube-ca-file", kube.CAFile}
	}
}

// uninstall deletes the agents' DaemonSet and right after their RBAC, as
// helm uninstall does, and waits until every running agent has seen the
// deletion: the garbage collector deletes the pods (their SIGTERM) only
// once it has seen it too.
func uninstall(t *testing.T, c *weirlab.Cluster, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	// Helm and kubectl delete in the background: the DaemonSet goes at
	// once, its pods after it.
	background := metav1.DeletePropagationBackground
	if err := cs.AppsV1().DaemonSets(agentNamespace).Delete(ctx, agentDaemonSet, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		t.Fatal(err)
	}
	deleteAgentRBAC(t, cs)
	for i, a := range c.Agents {
		if a.Exited() {
			continue
		}
		wait.For(t, 10*time.Second, fmt.Sprintf("agent %d sees its DaemonSet deleted", i+1), func() error {
			if !strings.Contains(a.Log(), "DaemonSet is deleted") {
				return errors.New("not yet")
			}
			return nil
		})
	}
}

// forwards says whether a connection from node n to the web service's
// cluster IP reaches a pod: through n's own tables.
func forwards(n *lab.Node) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := weirlab.Get(ctx, n.Netns, netip.AddrPortFrom(clusterIPv4, 80))
	return err
}

// programmed lists what Weir makes on a node and keeps when its agent
// stops: the nftables tables, the device of moved connections and the
// routing rules and routes of its table. A nil node gives what a node
// without Weir holds.
func programmed(t *testing.T, n *lab.Node) string {
	t.Helper()
	if n == nil {
		return "tables:\ndevice: none\nrules:\nroutes:\n"
	}
	run := func(args ...string) string {
		out, err := n.Run(context.Background(), args[0], args[1:]...)
		if err != nil && !strings.Contains(out, "does not exist") && !strings.Contains(out, "Cannot find device") {
			t.Fatal(err)
		}
		return out
	}
	var b strings.Builder
	b.WriteString("tables:\n")
	for _, line := range strings.Split(run("nft", "list", "tables"), "\n") {
		if strings.HasSuffix(line, " weir") {
			b.WriteString(line + "\n")
		}
	}
	device := "none"
	if out := run("ip", "-br", "link", "show", "dev", flows.DefaultInterface); strings.HasPrefix(out, flows.DefaultInterface) {
		device = flows.DefaultInterface
	}
	b.WriteString("device: " + device + "\nrules:\n")
	table := fmt.Sprint(flows.DefaultTable)
	for _, fam := range []string{"-4", "-6"} {
		for _, line := range strings.Split(run("ip", fam, "rule"), "\n") {
			if strings.Contains(line, "lookup "+table) || strings.HasPrefix(line, fmt.Sprint(flows.DefaultTable-1)+":") {
				b.WriteString(line + "\n")
			}
		}
	}
	b.WriteString("routes:\n")
	for _, fam := range []string{"-4", "-6"} {
		if out := strings.TrimSpace(run("ip", fam, "route", "show", "table", table)); out != "" {
			b.WriteString(out + "\n")
		}
	}
	return b.String()
}

// waitWatching waits until agent i has established its watch.
func waitWatching(t *testing.T, c *weirlab.Cluster, i int) {
	t.Helper()
	wait.For(t, 20*time.Second, fmt.Sprintf("agent %d watches its DaemonSet", i+1), func() error {
		if !strings.Contains(c.Agents[i].Log(), "watching the agent's DaemonSet: ") {
			return errors.New("not yet")
		}
		return nil
	})
}

func kubeClient(t *testing.T, kube *kubeapi.Cluster) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kube.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// createAgentObjects makes what an install makes for the agents: the
// namespace (once), their service account, the Role that lets them watch
// their own DaemonSet only, and the DaemonSet.
func createAgentObjects(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{"app.kubernetes.io/name": agentDaemonSet}
	ignoreExists := func(err error) error {
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	for _, err := range []error{
		ignoreExists(create(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}))),
		ignoreExists(create(cs.CoreV1().ServiceAccounts(agentNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: agentDaemonSet}}, metav1.CreateOptions{}))),
		create(cs.RbacV1().Roles(agentNamespace).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: agentDaemonSet},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"},
				ResourceNames: []string{agentDaemonSet}, Verbs: []string{"get", "list", "watch"}}},
		}, metav1.CreateOptions{})),
		create(cs.RbacV1().RoleBindings(agentNamespace).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: agentDaemonSet},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: agentDaemonSet},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: agentDaemonSet, Namespace: agentNamespace}},
		}, metav1.CreateOptions{})),
		create(cs.AppsV1().DaemonSets(agentNamespace).Create(ctx, &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: agentDaemonSet},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "weir-agent", Image: "weir/weir-agent:test"}}},
				},
			},
		}, metav1.CreateOptions{})),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// create drops what a Create returned but its error.
func create[T any](_ T, err error) error { return err }

// deleteAgentRBAC deletes the agents' Role and RoleBinding, as an uninstall
// does with the DaemonSet.
func deleteAgentRBAC(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	if err := cs.RbacV1().RoleBindings(agentNamespace).Delete(ctx, agentDaemonSet, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.RbacV1().Roles(agentNamespace).Delete(ctx, agentDaemonSet, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeAgentToken writes a token of the agents' service account, as the
// kubelet projects it, to path.
func writeAgentToken(t *testing.T, cs kubernetes.Interface, path string) {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(agentNamespace).CreateToken(context.Background(), agentDaemonSet,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
}

// relay listens on addr (HOST:PORT) inside ns and passes each connection
// on to addr on the host, until the test ends. A connection ends when
// either side closes.
func relay(t *testing.T, ns *lab.Netns, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(out, in); done <- struct{}{} }()
				go func() { io.Copy(in, out); done <- struct{}{} }()
				<-done
			})
		}
	})
}
