package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/bgpspeaker"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// readShipped reads a file of the repository as it ships.
func readShipped(t *testing.T, path string) string {
	t.Helper()
	root, err := weirlab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestShippedExamples follows docs/getting-started.md in the lab: the
// router runs deploy/frr/frr.conf unchanged, `lbctl apply` loads
// deploy/examples/rack.yaml unchanged, agents run with the example's
// --bgp-asn, and deploy/examples/web.yaml's service gets a pool address
// that the client reaches through the router with its own address
// preserved.
func TestShippedExamples(t *testing.T) {
	c, r := startBGPClusterWith(t, func(*lab.Node) []string { return []string{"--bgp-asn=64512"} },
		frr.Config{Text: readShipped(t, "deploy/frr/frr.conf")})
	ctx := context.Background()
	lbctl := func(file string) string {
		t.Helper()
		root, _ := weirlab.ModuleRoot()
		out, err := c.Lbctl(ctx, "apply", "-f", filepath.Join(root, file))
		if err != nil {
			t.Fatalf("lbctl apply -f %s: %v\n%s", file, err, out)
		}
		return out
	}
	// The lab registered its nodes as the example describes them.
	want := "node/node1 unchanged\nnode/node2 unchanged\npool/public created\npeer/rack-router-v4 created\npeer/rack-router-v6 created\n"
	if out := lbctl("deploy/examples/rack.yaml"); out != want {
		t.Errorf("lbctl apply said %q, want %q", out, want)
	}
	want = "service/default/web created\nendpointslice/default/web-v4 created\nendpointslice/default/web-v6 created\n"
	if out := lbctl("deploy/examples/web.yaml"); out != want {
		t.Errorf("lbctl apply said %q, want %q", out, want)
	}
	vips := exampleAddresses(t, c, "203.0.113.10", "2001:db8:113::10")
	waitNextHops(t, r, vips[0].String(), c.Nodes[0].IPv4.String())
	waitNextHops(t, r, vips[1].String(), c.Nodes[0].IPv6.String())
	for _, v := range vips {
		reachesN1P1(t, c, v)
	}
}

// exampleAddresses waits for web.yaml's service to get its two addresses
// and checks they are want, the first of each range of the pool.
func exampleAddresses(t *testing.T, c *weirlab.Cluster, want ...string) []netip.Addr {
	t.Helper()
	var vips []string
	eventually(t, "the service gets addresses from the example pool", func() error {
		got, err := c.Registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
		if err != nil {
			return err
		}
		if vips = got.GetService().GetStatus().GetLoadBalancerIps(); len(vips) != 2 {
			return fmt.Errorf("status %v", got.GetService().GetStatus())
		}
		return nil
	})
	if !slices.Equal(vips, want) {
		t.Errorf("assigned %v, want %v: the first address of each range", vips, want)
	}
	var out []netip.Addr
	for _, v := range vips {
		out = append(out, netip.MustParseAddr(v))
	}
	return out
}

// reachesN1P1 checks that the client reaches web.yaml's pod, n1p1, on
// vip, and that the pod sees the client's own address.
func reachesN1P1(t *testing.T, c *weirlab.Cluster, vip netip.Addr) {
	t.Helper()
	dst := netip.AddrPortFrom(vip, 80)
	want := lab.ClientIPv4
	if vip.Is6() {
		want = lab.ClientIPv6
	}
	for _, rep := range sample(t, c.Client, dst, 3) {
		if rep.Pod != c.Nodes[0].Pods[0].Name || rep.RemoteAddr() != want {
			t.Errorf("via the router to %s: pod %s saw %s; want n1p1 seeing the client %s", dst, rep.Pod, rep.RemoteAddr(), want)
		}
	}
}

// TestShippedL2Example follows the L2 walk-through of
// docs/getting-started.md: no BGP anywhere, deploy/examples/rack-l2.yaml
// and web.yaml unchanged; the service gets addresses of the rack LAN,
// node1 (the only one with the pod) answers ARP and NDP for them, and a
// client behind the router (which resolves them on the LAN as any host
// would) reaches the pod with its own address.
func TestShippedL2Example(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	root, _ := weirlab.ModuleRoot()
	for _, step := range []struct{ file, want string }{
		{"deploy/examples/rack-l2.yaml", "node/node1 unchanged\nnode/node2 unchanged\npool/rack-lan created\n"},
		{"deploy/examples/web.yaml", "service/default/web created\nendpointslice/default/web-v4 created\nendpointslice/default/web-v6 created\n"},
	} {
		if out, err := c.Lbctl(ctx, "apply", "-f", filepath.Join(root, step.file)); err != nil || out != step.want {
			t.Fatalf("lbctl apply -f %s: %v\n%s; want %q", step.file, err, out, step.want)
		}
	}
	for _, v := range exampleAddresses(t, c, "192.0.2.200", "2001:db8:2::200") {
		eventually(t, "the client reaching "+v.String(), func() error {
			_, err := weirlab.Get(ctx, c.Client, netip.AddrPortFrom(v, 80))
			return err
		})
		reachesN1P1(t, c, v)
		neigh, err := c.Router.Run(ctx, "ip", "neigh", "show", v.String())
		if err != nil {
			t.Fatal(err)
		}
		if mac := macOf(t, c.Nodes[0].Netns, "eth0"); !strings.Contains(neigh, mac) {
			t.Errorf("the router resolved %s to %q; want node1's %s", v, neigh, mac)
		}
	}
}

// TestShippedEnvironmentFilesParse: every flag of the systemd example
// environment files is one the binaries accept, with a value they take.
func TestShippedEnvironmentFilesParse(t *testing.T) {
	lab.SkipUnlessPrivileged(t) // the binaries are built only as root
	for file, binary := range map[string]string{
		"deploy/systemd/weir-server.env.example":  bin.Server,
		"deploy/systemd/weir-agent.env.example":   bin.Agent,
		"deploy/systemd/weir-speaker.env.example": bin.Speaker,
	} {
		var args string
		for l := range strings.Lines(readShipped(t, file)) {
			if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && strings.HasSuffix(k, "_ARGS") {
				args = strings.Trim(v, `"`)
			}
		}
		if args == "" {
			t.Errorf("%s: no *_ARGS line", file)
			continue
		}
		// Flags parse before -help stops the program: an unknown flag or a
		// bad value exits 2, -help alone exits 0.
		cmd := exec.Command(binary, append(strings.Fields(args), "-help")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %s %s: %v\n%s", file, filepath.Base(binary), args, err, out)
		}
	}
}

// TestKubernetesSettingsReachTheFlags: every setting of the weir-config
// ConfigMap is passed to a container as a flag (none is dead), and the
// agent takes the flags the DaemonSet gives it, expanded as the kubelet
// expands $(VAR), with the shipped settings and with BGP on.
func TestKubernetesSettingsReachTheFlags(t *testing.T) {
	lab.SkipUnlessPrivileged(t) // the binaries are built only as root
	var settings map[string]string
	containers := map[string][]string{} // name: args
	for doc := range strings.SplitSeq(readShipped(t, "deploy/kubernetes/config.yaml")+"\n---\n"+readShipped(t, "deploy/kubernetes/agent.yaml")+"\n---\n"+
		readShipped(t, "deploy/kubernetes/server.yaml"), "\n---\n") {
		var obj struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
			Spec     struct {
				Template struct {
					Spec struct {
						InitContainers, Containers []struct {
							Name string
							Args []string
						}
					}
				}
			}
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "ConfigMap" && obj.Metadata.Name == "weir-config" {
			settings = obj.Data
		}
		for _, c := range append(obj.Spec.Template.Spec.InitContainers, obj.Spec.Template.Spec.Containers...) {
			containers[c.Name] = c.Args
		}
	}
	if len(settings) == 0 || containers["weir-agent"] == nil {
		t.Fatalf("no weir-config settings (%v) or no weir-agent container (%v)", settings, containers)
	}
	for key := range settings {
		used := false
		for _, args := range containers {
			used = used || slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "$("+key+")") })
		}
		if !used {
			t.Errorf("weir-config's %s reaches no container's flags", key)
		}
	}
	expand := func(args []string, env map[string]string) []string {
		out := make([]string, len(args))
		for i, a := range args {
			for k, v := range env {
				a = strings.ReplaceAll(a, "$("+k+")", v)
			}
			out[i] = a
		}
		return out
	}
	withBGP := maps.Clone(settings)
	withBGP["WEIR_BGP_ASN"], withBGP["WEIR_BGP_PEERS"] = "64512", "192.0.2.1/64500,[2001:db8:2::1]:179/64500"
	// The peers are read after the flags: check them as the agent does.
	if _, err := bgpspeaker.ParsePeers(withBGP["WEIR_BGP_PEERS"]); err != nil {
		t.Errorf("WEIR_BGP_PEERS %q: %v", withBGP["WEIR_BGP_PEERS"], err)
	}
	for name, env := range map[string]map[string]string{"as shipped": settings, "with BGP": withBGP} {
		env = maps.Clone(env)
		env["NODE_NAME"] = "node1"
		args := expand(containers["weir-agent"], env)
		// Flags parse before -help stops the program: a bad value exits 2.
		if out, err := exec.Command(bin.Agent, append(args, "-help")...).CombinedOutput(); err != nil {
			t.Errorf("%s: weir-agent %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	args := expand(containers["weir-server"], settings)
	if out, err := exec.Command(bin.Server, append(args, "-help")...).CombinedOutput(); err != nil {
		t.Errorf("weir-server %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	withHosts := maps.Clone(settings)
	withHosts["POD_NAMESPACE"], withHosts["WEIR_SERVER_HOSTS"] = "weir-system", "weir.example.internal,192.0.2.2"
	for _, env := range []map[string]string{settings, withHosts} {
		args := expand(containers["weir-certs"], env)
		if out, err := exec.Command(bin.Server, append(args, "-help")...).CombinedOutput(); err != nil {
			t.Errorf("weir-server %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestResourcesFileFeedsPoolsAndPeers: the server started with the
// example resources file for Kubernetes (deploy/examples/resources.yaml,
// the chart's resourcesFile) assigns a pool address, the nodes peer with
// the router it names, and the client reaches the service through it.
func TestResourcesFileFeedsPoolsAndPeers(t *testing.T) {
	root, err := weirlab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "deploy", "examples", "resources.yaml")
	c, r := startBGPClusterWith(t, func(*lab.Node) []string { return nil }, labRouter, func(c *weirlab.Cluster) {
		c.ServerArgs = append(c.ServerArgs, "--resources-file", path)
	})
	ctx := context.Background()
	svc := lbService("filed", 30111, []string{"10.96.0.81"}, nil)
	svc.Status = nil
	createService(t, c, svc, c.Pods())
	eventually(t, "the service gets the pool's first address", func() error {
		got, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "filed"})
		if err != nil {
			return err
		}
		if ips := got.GetService().GetStatus().GetLoadBalancerIps(); len(ips) != 1 || ips[0] != "203.0.113.10" {
			return fmt.Errorf("status %v", got.GetService().GetStatus())
		}
		return nil
	})
	waitNextHops(t, r, "203.0.113.10", c.Nodes[0].IPv4.String(), c.Nodes[1].IPv4.String())
	sample(t, c.Client, netip.MustParseAddrPort("203.0.113.10:80"), 3)
	// The API reads the file's peer but may not change it.
	got, err := c.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "rack-router-v4"})
	if err != nil || got.GetBgpPeer().GetMetadata().GetSource() != "file" {
		t.Fatalf("peer: %v, %v", got, err)
	}
	if _, err := c.Registry.DeleteBgpPeer(ctx, &weirv1.DeleteBgpPeerRequest{Name: "rack-router-v4"}); err == nil {
		t.Error("the API deleted the file's peer")
	}
}
