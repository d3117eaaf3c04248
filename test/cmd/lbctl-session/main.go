// Command lbctl-session records the lbctl session docs/lbctl.md shows
// under "Waiting, JSON and reasons": a lab of two nodes whose agents speak
// BGP to a real FRR router, one peer misconfigured, and the lbctl commands
// an operator would run, printed as they ran (`$ lbctl ...`, the output,
// `[exit N]` for an exit code other than 0). It needs root and FRR.
//
//	go run ./test/cmd/lbctl-session > session.txt
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lbctl-session:", err)
		os.Exit(1)
	}
}

// The files the session applies; rack.yaml's IPv4 peer has a typo in
// its ASN (64501 for the router's 64500).
var files = map[string]string{
	"rack.yaml": `kind: AddressPool
metadata:
  name: public
addresses:
- 203.0.113.10-203.0.113.19
- 2001:db8:113::10-2001:db8:113::19
---
kind: BgpPeer
metadata:
  name: rack-router-v4
address: 192.0.2.1
asn: 64501
my_asn: 64512
---
kind: BgpPeer
metadata:
  name: rack-router-v6
address: 2001:db8:2::1
asn: 64500
my_asn: 64512
`,
	"peer-v4.yaml": `kind: BgpPeer
metadata:
  name: rack-router-v4
address: 192.0.2.1
asn: 64500
my_asn: 64512
`,
}

func run() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces and nftables)")
	}
	ctx := context.Background()
	bin, removeBin, err := weirlab.BuildTemp(ctx)
	if err != nil {
		return err
	}
	defer removeBin()
	c, err := weirlab.Start(ctx, lab.Config{Nodes: 2, PodsPerNode: []int{2, 1}}, bin, func(c *weirlab.Cluster) {
		c.AgentArgs = func(*lab.Node) []string { return []string{"--bgp-asn", "64512"} }
	})
	if err != nil {
		return err
	}
	c.CloseOnInterrupt()
	defer c.Close()
	// The router carries each family over sessions of its own transport,
	// as many rack routers are set up.
	r, err := frr.StartTemp(ctx, c.Router, frr.Config{ASN: 64500, RouterID: lab.RouterLANv4.String(), PeerASN: 64512,
		ListenRanges: []string{"192.0.2.0/24", "2001:db8:2::/64"}, FamilyPerTransport: true})
	if err != nil {
		return err
	}
	defer r.Close()
	dir, err := os.MkdirTemp("", "lbctl-session-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	web, err := webYAML(c)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(web), 0o644); err != nil {
		return err
	}

	s := &session{c: c, dir: dir}
	s.shell("cat rack.yaml")
	s.lbctl("apply", "-f", "rack.yaml", "--wait")
	s.lbctl("apply", "-f", "web.yaml", "--wait")
	s.lbctl("get", "services")
	// Let the routers answer (or refuse) before asking why.
	if err := s.until(func(out string) bool { return strings.Contains(out, "bad peer as") }, "describe", "node", "node1"); err != nil {
		return err
	}
	s.lbctl("describe", "service", "default/web")
	s.lbctl("describe", "node", "node1")
	s.lbctl("apply", "-f", "peer-v4.yaml", "--wait")
	if err := s.until(func(out string) bool { return strings.Contains(out, "Receiving external traffic: node1") }, "describe", "service", "default/web"); err != nil {
		return err
	}
	s.lbctl("describe", "service", "default/web")
	s.lbctl("status", "-o", "json")

	// node2's agent dies.
	if err := c.Agents[1].Kill(); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	s.comment("node2's agent is killed (SIGKILL)")
	s.lbctl("status")
	s.lbctl("node", "drain", "node1", "--wait")
	s.lbctl("describe", "service", "default/web")
	fmt.Print(s.out.String())
	return nil
}

// webYAML is a LoadBalancer service with a health check on every node
// and its endpoints: the lab's pods, two on node1, one on node2.
func webYAML(c *weirlab.Cluster) (string, error) {
	var b strings.Builder
	b.WriteString(`kind: Service
metadata:
  name: web
spec:
  type: SERVICE_TYPE_LOAD_BALANCER
  cluster_ips: [10.96.0.80, "fd00:96::80"]
  external_traffic_policy: TRAFFIC_POLICY_LOCAL
  health_check_node_port: 32110
  ports:
  - name: http
    port: 80
    target_port: 8080
    node_port: 30110
`)
	for _, fam := range []string{"v4", "v6"} {
		fmt.Fprintf(&b, "---\nkind: EndpointSlice\nmetadata:\n  name: web-%s\nservice_name: web\nports:\n- name: http\n  port: %d\nendpoints:\n", fam, weirlab.PodPort)
		for _, p := range c.Pods() {
			a := p.IPv4
			if fam == "v6" {
				a = p.IPv6
			}
			fmt.Fprintf(&b, "- addresses: [%q]\n  node_name: %s\n", a, p.Node.Name)
		}
	}
	return b.String(), nil
}

// session runs commands from the rack router's namespace, where an
// operator's lbctl would run, and keeps the transcript.
type session struct {
	c   *weirlab.Cluster
	dir string
	out bytes.Buffer
}

func (s *session) comment(text string) { fmt.Fprintf(&s.out, "# %s\n\n", text) }

// lbctl runs lbctl with the lab's admin certificate (given by flags, left
// out of the transcript: a context would hold them) and records it.
func (s *session) lbctl(args ...string) string {
	out, code := s.exec(s.lbctlArgv(args)...)
	s.record("lbctl "+strings.Join(args, " "), out, code)
	return out
}

func (s *session) lbctlArgv(args []string) []string {
	return append([]string{s.c.Bin.Lbctl, "--server", netip.AddrPortFrom(lab.ControlIPv4, weirlab.ServerPort).String(),
		"--ca-file", filepath.Join(s.c.CertDir, "ca.crt"), "--cert-file", filepath.Join(s.c.CertDir, "admin.crt"),
		"--key-file", filepath.Join(s.c.CertDir, "admin.key")}, args...)
}

func (s *session) shell(command string) {
	out, code := s.exec("sh", "-c", command)
	s.record(command, out, code)
}

func (s *session) record(command, out string, code int) {
	fmt.Fprintf(&s.out, "$ %s\n%s", command, out)
	if code != 0 {
		fmt.Fprintf(&s.out, "[exit %d]\n", code)
	}
	s.out.WriteString("\n")
}

// exec runs a command in the router's namespace, in the session's
// folder, and returns its output (stdout then stderr) and exit code.
func (s *session) exec(argv ...string) (string, int) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", s.c.Router.Name}, argv...)...)
	cmd.Dir = s.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return err.Error() + "\n", -1
	}
	return stdout.String() + stderr.String(), code
}

// until runs an lbctl command, unrecorded, until ok holds of its output
// (at most 30 s).
func (s *session) until(ok func(string) bool, args ...string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := s.exec(s.lbctlArgv(args)...)
		if ok(out) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lbctl %s: still not there after 30 s:\n%s", strings.Join(args, " "), out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
