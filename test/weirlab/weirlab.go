// Package weirlab runs Weir itself in a lab: it builds the binaries, starts
// weir-server in the control namespace and weir-agent on every node, runs an
// echo server in every pod, and gives callers an API client. The end-to-end
// tests and the demo share it.
package weirlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/test/etcdcluster"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/toolbin"
)

// ServerPort is where the lab's weir-server listens, on lab.ControlIPv4.
const ServerPort = 7443

// PodPort is where every pod's echo server answers (TCP and UDP).
const PodPort = 8080

// LoadBalancerCIDRs are where the lab's load-balancer IPs come from when a
// test writes them into a service's status, as an outside load balancer
// would (the documentation ranges, and the benchmarks' 198.18.0.0/15):
// the server allows them (--allowed-external-ip-cidrs), as it must for a
// status address that no pool holds. A test's own ServerArgs may say
// otherwise.
const LoadBalancerCIDRs = "203.0.113.0/24,2001:db8:113::/48,198.18.0.0/15"

// Binaries are the programs the lab runs.
type Binaries struct{ Server, Agent, Speaker, Lbctl, Echo string }

// Build compiles the binaries into dir from the module at root.
func Build(ctx context.Context, root, dir string) (Binaries, error) {
	b := Binaries{Server: filepath.Join(dir, "weir-server"), Agent: filepath.Join(dir, "weir-agent"), Speaker: filepath.Join(dir, "weir-speaker"),
		Lbctl: filepath.Join(dir, "lbctl"), Echo: filepath.Join(dir, "echo")}
	for out, pkg := range map[string]string{b.Server: "./server/cmd/weir-server", b.Agent: "./agent/cmd/weir-agent", b.Speaker: "./lbtier/cmd/weir-speaker",
		b.Lbctl: "./lbctl", b.Echo: "./test/cmd/echo"} {
		args := []string{"build", "-o", out, pkg}
		if out == b.Agent {
			// The lab's agents have the tests' fault hooks (agent/faults).
			args = []string{"build", "-tags", "weirfaults", "-o", out, pkg}
		}
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
	}
	return b, nil
}

// BuildRelease compiles the server and the agent of an earlier commit of
// the repository (a release: its version is stamped in them) into the
// user's cache, once per machine; a rolling upgrade runs them beside this
// tree's. The clone must hold the commit (not a shallow one).
func BuildRelease(ctx context.Context, version, commit string) (Binaries, error) {
	root, err := ModuleRoot()
	if err != nil {
		return Binaries{}, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return Binaries{}, err
	}
	dir := filepath.Join(cache, "weir", "release-"+version+"-"+commit)
	b := Binaries{Server: filepath.Join(dir, "weir-server"), Agent: filepath.Join(dir, "weir-agent")}
	if toolbin.Executable(b.Server) && toolbin.Executable(b.Agent) {
		return b, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return b, err
	}
	unlock, err := toolbin.Lock(ctx, dir+".lock")
	if err != nil {
		return b, err
	}
	defer unlock()
	if toolbin.Executable(b.Server) && toolbin.Executable(b.Agent) {
		return b, nil // built by another process meanwhile
	}
	src, err := os.MkdirTemp("", "weir-release-")
	if err != nil {
		return b, err
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return b, fmt.Errorf("weirlab: the source of %s (%s): %w (a shallow clone lacks it)\n%s", version, commit, err, out)
	}
	for out, pkg := range map[string]string{b.Server: "./server/cmd/weir-server", b.Agent: "./agent/cmd/weir-agent"} {
		// Built to a temporary name and renamed: a binary that is there
		// is whole.
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", "weirfaults", "-ldflags", "-X main.version="+version, "-o", out+".tmp", pkg)
		cmd.Dir = src
		if o, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("weirlab: go build %s at %s: %w\n%s", pkg, version, err, o)
		}
		if err := os.Rename(out+".tmp", out); err != nil {
			return b, err
		}
	}
	return b, nil
}

// BuildTemp compiles the binaries into a new temporary folder; remove
// deletes it.
func BuildTemp(ctx context.Context) (bin Binaries, remove func(), err error) {
	root, err := ModuleRoot()
	if err != nil {
		return bin, nil, err
	}
	dir, err := os.MkdirTemp("", "weir-bin-")
	if err != nil {
		return bin, nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	if bin, err = Build(ctx, root, dir); err != nil {
		remove()
		return bin, nil, err
	}
	return bin, remove, nil
}

// StartBuilt builds the binaries into a temporary folder and starts a
// cluster on them that SIGINT tears down; close stops the cluster and
// removes the binaries. For programs: tests build once in TestMain.
func StartBuilt(ctx context.Context, cfg lab.Config, options ...func(*Cluster)) (c *Cluster, close func(), err error) {
	bin, removeBin, err := BuildTemp(ctx)
	if err != nil {
		return nil, nil, err
	}
	if c, err = Start(ctx, cfg, bin, options...); err != nil {
		removeBin()
		return nil, nil, err
	}
	c.CloseOnInterrupt()
	return c, func() { c.Close(); removeBin() }, nil
}

// OnePodSlice is an endpoint slice of one ready pod on the lab's pod port.
func OnePodSlice(namespace, service string, p *lab.Pod) *weirv1.EndpointSlice {
	return &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: namespace, Name: service}, ServiceName: service,
		Endpoints: []*weirv1.Endpoint{{Addresses: []string{p.IPv4.String()}, NodeName: p.Node.Name}},
		Ports:     []*weirv1.EndpointPort{{Name: "http", Port: PodPort}}}
}

// ModuleRoot finds the repository root from the working directory.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := string(out[:len(out)-1])
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the weir module")
	}
	return filepath.Dir(mod), nil
}

// Cluster is Weir running in a lab, with mTLS: the server, every agent and
// the caller each hold a certificate from the lab's CA.
type Cluster struct {
	*lab.Lab
	Bin     Binaries
	DataDir string
	// AgentBinaries, by node name, run another agent binary than
	// Bin.Agent on those nodes (another version's).
	AgentBinaries map[string]string
	// AgentArgs, when set, adds flags to each node's agent.
	AgentArgs func(*lab.Node) []string
	// ServerArgs adds flags to the server.
	ServerArgs []string
	// CertDir holds ca.crt, server.*, admin.* and <node>.* for each node.
	CertDir string
	// CertValidity, when set, is how long the server's and the agents'
	// certificates are valid instead of a year (rotation tests).
	CertValidity time.Duration
	Server       *lab.Process
	// Replicas, when above 1, runs that many replicas of the server, on
	// a three-member etcd cluster in the control namespace, instead of
	// one server on DataDir (docs/ha.md). Servers and Etcd are their
	// processes; Server is the first replica.
	Replicas int
	Servers  []*lab.Process
	Etcd     []*lab.Process
	// ReplicaArgs, when set, are the replicas' flags instead of the
	// lab's etcd endpoints and replica names; EtcdEnv, member i's
	// environment instead of the lab's.
	ReplicaArgs []string
	EtcdEnv     func(i int, state string) []string
	Agents      []*lab.Process
	Conn        *grpc.ClientConn
	Registry    weirv1.RegistryServiceClient

	etcdBin string
}

// Start builds the lab, starts the server, registers the nodes, and starts
// the agents and the pods' echo servers. On error everything is torn down.
func Start(ctx context.Context, cfg lab.Config, bin Binaries, options ...func(*Cluster)) (*Cluster, error) {
	l, err := lab.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Lab: l, Bin: bin, DataDir: filepath.Join(l.Dir, "server-data"), CertDir: filepath.Join(l.Dir, "tls")}
	for _, o := range options {
		o(c)
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	if err := certs.InitCA(c.CertDir); err != nil {
		return err
	}
	hosts := []string{lab.ControlIPv4.String(), lab.ControlIPv6.String()}
	for i := 1; i < len(c.Controls); i++ {
		hosts = append(hosts, lab.ControlAddr(i).String(), lab.ControlAddr6(i).String())
	}
	var validity []certs.Option
	if c.CertValidity > 0 {
		validity = append(validity, certs.ValidFor(c.CertValidity))
	}
	if err := certs.IssueServer(c.CertDir, hosts, validity...); err != nil {
		return err
	}
	if err := certs.IssueClient(c.CertDir, "admin", certs.RoleAdmin); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := certs.IssueClient(c.CertDir, n.Name, certs.RoleAgent, validity...); err != nil {
			return err
		}
	}
	if err := c.StartServer(ctx); err != nil {
		return err
	}
	tlsCfg, err := tlsconfig.Client(tlsconfig.Files{
		CA: c.cert("ca.crt"), Cert: c.cert("admin.crt"), Key: c.cert("admin.key"),
	})
	if err != nil {
		return err
	}
	// Every replica's address: calls go to one that answers (gRPC's
	// pick_first tries them in order).
	servers := manual.NewBuilderWithScheme("weirlab")
	var addrs []resolver.Address
	for _, a := range strings.Split(c.ServerList(), ",") {
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	servers.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient(servers.Scheme()+":///servers",
		grpc.WithResolvers(servers),
		grpc.WithAuthority(lab.ControlIPv4.String()),
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.Router.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		return err
	}
	c.Conn, c.Registry = conn, weirv1.NewRegistryServiceClient(conn)
	for _, n := range c.Nodes {
		_, err := c.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{
			Metadata:  &weirv1.ObjectMeta{Name: n.Name},
			Addresses: []string{n.IPv4.String(), n.IPv6.String()},
			PodCidrs:  []string{n.PodCIDRv4.String(), n.PodCIDRv6.String()},
		}})
		if err != nil {
			return fmt.Errorf("registering %s: %w", n.Name, err)
		}
	}
	for i := range c.Nodes {
		p, err := c.startAgent(i)
		if err != nil {
			return err
		}
		c.Agents = append(c.Agents, p)
	}
	for _, p := range c.Pods() {
		if _, err := p.Start(c.Bin.Echo, "-name", p.Name, "-listen", ":"+strconv.Itoa(PodPort)); err != nil {
			return err
		}
	}
	return nil
}

// StartServer starts weir-server on the cluster's data dir, or every
// replica and their etcd, and waits until they answer.
func (c *Cluster) StartServer(ctx context.Context) error {
	if c.Replicas > 1 {
		if err := c.StartEtcd(ctx); err != nil {
			return err
		}
		return c.StartReplicas(ctx)
	}
	p, err := c.startServer(ctx, 0, "--data-dir", c.DataDir)
	c.Server = p
	return err
}

// StartReplicas starts a replica on each of the first Replicas control
// hosts (etcd must run: StartEtcd).
func (c *Cluster) StartReplicas(ctx context.Context) error {
	if c.Replicas > len(c.Controls) {
		return fmt.Errorf("weirlab: %d replicas need as many control hosts (lab.Config.Servers)", c.Replicas)
	}
	c.Servers = make([]*lab.Process, c.Replicas)
	for i := range c.Replicas {
		if err := c.StartReplica(ctx, i); err != nil {
			return err
		}
	}
	c.Server = c.Servers[0]
	return nil
}

// startServer starts weir-server on control host i, listening on
// ServerAddr(i) unless args say otherwise.
func (c *Cluster) startServer(ctx context.Context, i int, args ...string) (*lab.Process, error) {
	addr := ServerAddr(i).String()
	args = append(append([]string{"--listen", addr,
		"--tls-cert-file", c.cert("server.crt"), "--tls-key-file", c.cert("server.key"), "--client-ca-file", c.cert("ca.crt"),
		"--allowed-external-ip-cidrs", LoadBalancerCIDRs},
		args...), c.ServerArgs...)
	p, err := c.Controls[i].Start(c.Bin.Server, args...)
	if err != nil {
		return nil, err
	}
	return p, waitFor(ctx, 10*time.Second, func() error {
		conn, err := c.Router.DialContext(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err
	}, func() string { return p.Log() })
}

// ServerAddr is where the server on control host i listens.
func ServerAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(lab.ControlAddr(i), ServerPort)
}

// ServerList is every server address, as the clients' --server takes it.
func (c *Cluster) ServerList() string {
	var out []string
	for i := range max(1, c.Replicas) {
		out = append(out, ServerAddr(i).String())
	}
	return strings.Join(out, ",")
}

// StartReplica starts the replica on control host i (again, after a kill),
// on its own data dir (unused with etcd) and ReplicaArgs.
func (c *Cluster) StartReplica(ctx context.Context, i int) error {
	args := c.ReplicaArgs
	if args == nil {
		args = []string{"--etcd-endpoints", strings.Join(c.EtcdEndpoints(), ","), "--replica-name", fmt.Sprintf("replica%d", i)}
	}
	p, err := c.startServer(ctx, i, append([]string{"--data-dir", filepath.Join(c.Dir, fmt.Sprintf("server%d-data", i))}, args...)...)
	c.Servers[i] = p
	return err
}

// Leader is the replica that leads now, from the replicas' logs, or -1.
func (c *Cluster) Leader() int {
	for i, p := range c.Servers {
		if p == nil || p.Exited() {
			continue
		}
		log := p.Log()
		if lead := strings.LastIndex(log, `msg="leading:`); lead >= 0 && lead > strings.LastIndex(log, `msg="no longer leading"`) {
			return i
		}
	}
	return -1
}

// EtcdEndpoints are the etcd members' client URLs, one on each control
// host.
func (c *Cluster) EtcdEndpoints() []string {
	var out []string
	for i := range c.Replicas {
		out = append(out, fmt.Sprintf("http://%s:2379", lab.ControlAddr(i)))
	}
	return out
}

// etcdEnv is member i's configuration, as etcd's environment variables
// (the way Debian's /etc/default/etcd gives them).
func (c *Cluster) etcdEnv(i int, state string) []string {
	if c.EtcdEnv != nil {
		return c.EtcdEnv(i, state)
	}
	var initial []string
	for j := range c.Replicas {
		initial = append(initial, fmt.Sprintf("m%d=http://%s:2380", j, lab.ControlAddr(j)))
	}
	peer := fmt.Sprintf("http://%s:2380", lab.ControlAddr(i))
	return []string{"ETCD_NAME=" + fmt.Sprintf("m%d", i),
		"ETCD_LISTEN_CLIENT_URLS=" + c.EtcdEndpoints()[i], "ETCD_ADVERTISE_CLIENT_URLS=" + c.EtcdEndpoints()[i],
		"ETCD_LISTEN_PEER_URLS=" + peer, "ETCD_INITIAL_ADVERTISE_PEER_URLS=" + peer,
		"ETCD_INITIAL_CLUSTER=" + strings.Join(initial, ","), "ETCD_INITIAL_CLUSTER_STATE=" + state, "ETCD_INITIAL_CLUSTER_TOKEN=weirlab",
		// Fast elections: a lab, not a WAN.
		"ETCD_HEARTBEAT_INTERVAL=50", "ETCD_ELECTION_TIMEOUT=500"}
}

// StartEtcd starts an etcd member on each of the first Replicas control
// hosts.
func (c *Cluster) StartEtcd(ctx context.Context) error {
	if c.Replicas > len(c.Controls) {
		return fmt.Errorf("weirlab: %d etcd members need as many control hosts (lab.Config.Servers)", c.Replicas)
	}
	bin, err := etcdcluster.Binary(ctx)
	if err != nil {
		return err
	}
	c.etcdBin = bin
	c.Etcd = make([]*lab.Process, c.Replicas)
	for i := range c.Replicas {
		if err := c.runEtcd(i, "new"); err != nil {
			return err
		}
	}
	for i := range c.Replicas {
		if err := c.waitEtcd(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// runEtcd starts member i with its environment, its data in the lab's
// folder whatever ETCD_DATA_DIR the environment says (etcd refuses a flag
// and a variable for the same setting).
func (c *Cluster) runEtcd(i int, state string) error {
	var args []string
	for _, kv := range c.etcdEnv(i, state) {
		if !strings.HasPrefix(kv, "ETCD_DATA_DIR=") {
			args = append(args, kv)
		}
	}
	args = append(args, "ETCD_DATA_DIR="+c.EtcdDataDir(i), c.etcdBin)
	var err error
	c.Etcd[i], err = c.Controls[i].Start("env", args...)
	return err
}

func (c *Cluster) waitEtcd(ctx context.Context, i int) error {
	client := c.Controls[i].HTTPClient(time.Second)
	return waitFor(ctx, 30*time.Second, func() error {
		resp, err := client.Get(c.EtcdEndpoints()[i] + "/health")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `"true"`) {
			return fmt.Errorf("etcd member %d: %s", i, body)
		}
		return nil
	}, func() string { return c.Etcd[i].Log() })
}

// EtcdDataDir is where etcd member i keeps its data.
func (c *Cluster) EtcdDataDir(i int) string { return filepath.Join(c.Dir, fmt.Sprintf("etcd%d", i)) }

// RestartEtcd starts etcd member i again on its data, after a kill; with
// an empty data dir and state "existing" it joins as a new member.
func (c *Cluster) RestartEtcd(ctx context.Context, i int) error {
	if err := c.runEtcd(i, "existing"); err != nil {
		return err
	}
	return c.waitEtcd(ctx, i)
}

// ClusterCIDRs are the lab's pod networks.
const ClusterCIDRs = "10.244.0.0/16,fd00:244::/32"

func (c *Cluster) startAgent(i int) (*lab.Process, error) {
	n := c.Nodes[i]
	args := []string{"--node-name", n.Name,
		"--ca-file", c.cert("ca.crt"), "--cert-file", c.cert(n.Name + ".crt"), "--key-file", c.cert(n.Name + ".key"),
		"--server", c.ServerList(),
		"--cluster-cidr", ClusterCIDRs}
	if c.AgentArgs != nil {
		args = append(args, c.AgentArgs(n)...)
	}
	agent := c.Bin.Agent
	if other := c.AgentBinaries[n.Name]; other != "" {
		agent = other
	}
	return n.Start(agent, args...)
}

func (c *Cluster) cert(name string) string { return filepath.Join(c.CertDir, name) }

// StartSpeaker starts a load-balancer speaker named name in the control
// namespace (the lab's LB host), with its own certificate; args add flags.
func (c *Cluster) StartSpeaker(name string, args ...string) (*lab.Process, error) {
	// A speaker restarted under its name gets a fresh certificate.
	if err := certs.ReissueClient(c.CertDir, name, certs.RoleSpeaker); err != nil {
		return nil, err
	}
	return c.Control.Start(c.Bin.Speaker, append([]string{"--name", name,
		"--ca-file", c.cert("ca.crt"), "--cert-file", c.cert(name + ".crt"), "--key-file", c.cert(name + ".key"),
		"--server", c.ServerList()}, args...)...)
}

// Lbctl runs lbctl as an operator would, from the rack router's
// namespace with the admin certificate, and returns its output.
func (c *Cluster) Lbctl(ctx context.Context, args ...string) (string, error) {
	return c.Router.Run(ctx, c.Bin.Lbctl, append([]string{"--server", c.ServerList(),
		"--ca-file", c.cert("ca.crt"), "--cert-file", c.cert("admin.crt"), "--key-file", c.cert("admin.key")}, args...)...)
}

// RestartAgent kills node i's agent (as a crash would) and starts a new one.
func (c *Cluster) RestartAgent(i int) error {
	return c.restartAgent(i, (*lab.Process).Kill)
}

// StopAndRestartAgent stops agent i as systemctl restart or a DaemonSet
// rollout does (SIGTERM, SIGKILL after a grace period) and starts it again.
func (c *Cluster) StopAndRestartAgent(i int) error {
	return c.restartAgent(i, (*lab.Process).Stop)
}

func (c *Cluster) restartAgent(i int, stop func(*lab.Process) error) error {
	if err := stop(c.Agents[i]); err != nil {
		return err
	}
	p, err := c.startAgent(i)
	if err != nil {
		return err
	}
	c.Agents[i] = p
	return nil
}

// Close tears everything down.
func (c *Cluster) Close() error {
	if c.Conn != nil {
		c.Conn.Close()
	}
	return c.Lab.Close()
}

// Reply is what a pod's echo server answers.
type Reply struct {
	Pod    string `json:"pod"`
	Remote string `json:"remote"`
}

// RemoteAddr is the source address the pod saw.
func (r Reply) RemoteAddr() netip.Addr {
	ap, err := netip.ParseAddrPort(r.Remote)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// Get makes one HTTP request from ns to dst on a new connection.
func Get(ctx context.Context, ns *lab.Netns, dst netip.AddrPort) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := ns.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return Reply{}, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: weir\r\n\r\n"); err != nil {
		return Reply{}, err
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		return Reply{}, err
	}
	_, body, ok := cutHeader(raw)
	if !ok {
		return Reply{}, fmt.Errorf("malformed HTTP answer %q", raw)
	}
	var r Reply
	if err := json.Unmarshal(body, &r); err != nil {
		return Reply{}, fmt.Errorf("answer %q: %w", body, err)
	}
	return r, nil
}

func cutHeader(raw []byte) (head, body []byte, ok bool) {
	for i := 0; i+3 < len(raw); i++ {
		if raw[i] == '\r' && raw[i+1] == '\n' && raw[i+2] == '\r' && raw[i+3] == '\n' {
			return raw[:i], raw[i+4:], true
		}
	}
	return nil, nil, false
}

// waitFor polls check until it succeeds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, check func() error, logs func() string) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not ready after %s: %w\n%s", timeout, err, logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitServiceProgrammed waits until every node's agent has the service
// and has applied all it was sent: a frontend answering through one node
// says nothing of the others.
func (c *Cluster) WaitServiceProgrammed(ctx context.Context, namespace, name string) error {
	status := weirv1.NewStatusServiceClient(c.Conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := status.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: namespace, Name: name})
		if err != nil {
			return err
		}
		behind := ""
		for _, n := range resp.GetStatus().GetNodes() {
			if !n.GetProgrammed() || n.GetHealth() == nil {
				behind = fmt.Sprintf("%s (programmed %v, has the service %v)", n.GetNode(), n.GetProgrammed(), n.GetHealth() != nil)
				break
			}
		}
		if behind == "" && len(resp.GetStatus().GetNodes()) == len(c.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s/%s not programmed on every node after 10 s: %s", namespace, name, behind)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
