// Package lab builds a small data-centre lab out of Linux network namespaces
// for Weir's end-to-end tests and demo, runs processes inside it, and always
// tears it down again.
//
// The topology is fixed:
//
//	client (198.51.100.2) ── router ── br0 "rack LAN" 192.0.2.0/24
//	                                    ├── control (192.0.2.2)
//	                                    ├── node1 (192.0.2.11) ── pods 10.244.1.0/24
//	                                    └── nodeN (192.0.2.10+N) ── pods 10.244.N.0/24
//
// Every address has an IPv6 twin (2001:db8:100::/64, 2001:db8:2::/64,
// fd00:244:N::/64). Pods are attached Calico-style: a routed veth per pod
// and no bridge, so every pod packet crosses its node's IP stack, where the
// Weir agent's nftables rules live.
//
// Everything the lab creates lives inside namespaces named "<prefix>-<role>";
// nothing is configured in the caller's namespace, so tests never touch the
// host network.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Fixed addresses of the non-node namespaces.
var (
	ClientIPv4       = netip.MustParseAddr("198.51.100.2")
	ClientIPv6       = netip.MustParseAddr("2001:db8:100::2")
	RouterClientIPv4 = netip.MustParseAddr("198.51.100.1")
	RouterClientIPv6 = netip.MustParseAddr("2001:db8:100::1")
	RouterLANv4      = netip.MustParseAddr("192.0.2.1")
	RouterLANv6      = netip.MustParseAddr("2001:db8:2::1")
	ControlIPv4      = netip.MustParseAddr("192.0.2.2")
	ControlIPv6      = netip.MustParseAddr("2001:db8:2::2")
)

// Limits keep generated addresses valid (10+i must fit in one byte).
const (
	maxNodes       = 200
	maxPodsPerNode = 200
)

// Config describes a lab.
type Config struct {
	Prefix string // namespace name prefix; default "weir" + 4 random hex chars
	Nodes  int    // number of nodes (>= 1)
	// Servers is the number of control hosts (default 1): the first is
	// Control, at ControlIPv4; the others follow it on the rack LAN
	// (192.0.2.3, ...), for replicas of the server.
	Servers     int
	PodsPerNode []int  // pods on each node; len == Nodes (nil means no pods)
	Dir         string // folder for process logs; default a new os.MkdirTemp (kept after Close)
}

// Lab is a running lab. Close it when done.
type Lab struct {
	Prefix                  string
	Dir                     string
	Client, Router, Control *Netns
	// Controls are the control hosts, Control first (Config.Servers).
	Controls []*Netns
	Nodes    []*Node

	mu      sync.Mutex
	closed  bool
	created []*Netns   // namespaces this lab created, so Close deletes only those
	procs   []*Process // every process started with Netns.Start
	seq     int        // log file counter

	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed when Close starts
}

// Node is a worker node: a namespace on the rack LAN with routed pods.
type Node struct {
	*Netns
	Index                int
	Name                 string // role, "node1"; the namespace is Netns.Name
	IPv4, IPv6           netip.Addr
	PodCIDRv4, PodCIDRv6 netip.Prefix
	Pods                 []*Pod
}

// Pod is a namespace behind a node, reachable by its own addresses.
type Pod struct {
	*Netns
	Name       string // role, "n1p2"; the namespace is Netns.Name
	Node       *Node
	IPv4, IPv6 netip.Addr
}

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$`)

// New builds the lab. On any error it tears down whatever it had built.
func New(ctx context.Context, cfg Config) (*Lab, error) {
	if cfg.Nodes < 1 || cfg.Nodes > maxNodes {
		return nil, fmt.Errorf("lab: Nodes = %d, want 1..%d", cfg.Nodes, maxNodes)
	}
	if cfg.Servers > maxServers {
		return nil, fmt.Errorf("lab: Servers = %d, want at most %d", cfg.Servers, maxServers)
	}
	if cfg.PodsPerNode == nil {
		cfg.PodsPerNode = make([]int, cfg.Nodes)
	}
	if len(cfg.PodsPerNode) != cfg.Nodes {
		return nil, fmt.Errorf("lab: len(PodsPerNode) = %d, want Nodes = %d", len(cfg.PodsPerNode), cfg.Nodes)
	}
	for i, n := range cfg.PodsPerNode {
		if n < 0 || n > maxPodsPerNode {
			return nil, fmt.Errorf("lab: PodsPerNode[%d] = %d, want 0..%d", i, n, maxPodsPerNode)
		}
	}
	if cfg.Prefix == "" {
		b := make([]byte, 2)
		rand.Read(b)
		cfg.Prefix = "weir" + hex.EncodeToString(b)
	}
	if !validPrefix.MatchString(cfg.Prefix) {
		return nil, fmt.Errorf("lab: invalid Prefix %q", cfg.Prefix)
	}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", cfg.Prefix+"-")
		if err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		cfg.Dir = d
	} else if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}

	l := &Lab{Prefix: cfg.Prefix, Dir: cfg.Dir, done: make(chan struct{})}
	l.Client, l.Router, l.Control = l.netns("client"), l.netns("router"), l.netns("control")
	l.Controls = []*Netns{l.Control}
	for i := 2; i <= cfg.Servers; i++ {
		l.Controls = append(l.Controls, l.netns(fmt.Sprintf("control%d", i)))
	}
	for i := 1; i <= cfg.Nodes; i++ {
		n := &Node{
			Netns:     l.netns(fmt.Sprintf("node%d", i)),
			Index:     i,
			Name:      fmt.Sprintf("node%d", i),
			IPv4:      netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}),
			IPv6:      netip.MustParseAddr(fmt.Sprintf("2001:db8:2::%d", 10+i)),
			PodCIDRv4: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
			PodCIDRv6: netip.MustParsePrefix(fmt.Sprintf("fd00:244:%d::/64", i)),
		}
		for j := 1; j <= cfg.PodsPerNode[i-1]; j++ {
			name := fmt.Sprintf("n%dp%d", i, j)
			n.Pods = append(n.Pods, &Pod{
				Netns: l.netns(name),
				Name:  name,
				Node:  n,
				IPv4:  netip.AddrFrom4([4]byte{10, 244, byte(i), byte(10 + j)}),
				IPv6:  netip.MustParseAddr(fmt.Sprintf("fd00:244:%d::%d", i, 10+j)),
			})
		}
		l.Nodes = append(l.Nodes, n)
	}

	if err := l.build(ctx); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// maxServers bounds Config.Servers: the control hosts' addresses stay
// below the nodes' (192.0.2.11 on).
const maxServers = 8

// ControlAddr is control host i's address on the rack LAN (ControlIPv4
// for the first).
func ControlAddr(i int) netip.Addr {
	a := ControlIPv4.As4()
	a[3] += byte(i)
	return netip.AddrFrom4(a)
}

// ControlAddr6 is control host i's IPv6 address.
func ControlAddr6(i int) netip.Addr {
	a := ControlIPv6.As16()
	a[15] += byte(i)
	return netip.AddrFrom16(a)
}

func (l *Lab) netns(role string) *Netns {
	return &Netns{Name: l.Prefix + "-" + role, lab: l}
}

// Attach names the network namespace process pid is in (one a container
// runtime made for a pod, say) as the lab's namespace "<prefix>-<role>",
// so tests can run and dial from it. Close removes the name (and kills
// what still runs in the namespace).
func (l *Lab) Attach(ctx context.Context, role string, pid int) (*Netns, error) {
	ns := l.netns(role)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("lab: Attach %s: lab is closed", role)
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "attach", ns.Name, fmt.Sprint(pid)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lab: ip netns attach %s %d: %w: %s", ns.Name, pid, err, out)
	}
	l.created = append(l.created, ns)
	return ns, nil
}

// Namespaces returns every namespace of the lab: client, router, control,
// nodes, then pods.
func (l *Lab) Namespaces() []*Netns {
	all := append([]*Netns{l.Client, l.Router}, l.Controls...)
	for _, n := range l.Nodes {
		all = append(all, n.Netns)
	}
	for _, p := range l.Pods() {
		all = append(all, p.Netns)
	}
	return all
}

// Pods returns every pod of every node.
func (l *Lab) Pods() []*Pod {
	var pods []*Pod
	for _, n := range l.Nodes {
		pods = append(pods, n.Pods...)
	}
	return pods
}

func (l *Lab) build(ctx context.Context) error {
	all := l.Namespaces()
	// Refuse to reuse names: Close deletes what New created, and must never
	// delete a namespace that belongs to someone else.
	for _, ns := range all {
		if _, err := os.Stat(ns.path()); err == nil {
			return fmt.Errorf("lab: namespace %s already exists", ns.Name)
		}
	}
	for _, ns := range all {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns.Name).CombinedOutput(); err != nil {
			return fmt.Errorf("lab: ip netns add %s: %w: %s", ns.Name, err, out)
		}
		l.mu.Lock()
		l.created = append(l.created, ns)
		l.mu.Unlock()
	}

	// Sysctls go first: accept_dad=0 must be the default before interfaces
	// exist, so IPv6 addresses are usable at once.
	for _, ns := range all {
		s := map[string]string{
			"net/ipv6/conf/all/accept_dad":     "0",
			"net/ipv6/conf/default/accept_dad": "0",
			// IPv4 conf is inherited from the host namespace; pin it.
			"net/ipv4/conf/all/rp_filter":     "0",
			"net/ipv4/conf/default/rp_filter": "0",
		}
		if ns == l.Router || l.isNode(ns) {
			s["net/ipv4/ip_forward"] = "1"
			s["net/ipv6/conf/all/forwarding"] = "1"
			s["net/ipv6/conf/default/forwarding"] = "1"
		}
		if l.isNode(ns) {
			// Lets DNAT rewrite to 127.0.0.0/8 and accept such packets.
			s["net/ipv4/conf/all/route_localnet"] = "1"
		}
		if err := ns.sysctls(s, false); err != nil {
			return err
		}
		if ns == l.Router {
			// With br_netfilter loaded, bridged LAN frames would also run
			// through the router's IP hooks; the LAN is meant to be a switch.
			if err := ns.sysctls(map[string]string{
				"net/bridge/bridge-nf-call-iptables":  "0",
				"net/bridge/bridge-nf-call-ip6tables": "0",
				"net/bridge/bridge-nf-call-arptables": "0",
			}, true); err != nil {
				return err
			}
		}
	}

	// Phase 1: create links. Each veth is created in the namespace of one
	// end with its peer placed straight into the other, so interface names
	// never exist in (or collide within) the host namespace. Router first:
	// it creates the nodes' eth0, and nodes then create their pods' eth0.
	rt := []string{"link add br0 type bridge forward_delay 0 mcast_snooping 0"}
	rt = append(rt, veth("eth-client", l.Client)...)
	for i, ns := range l.Controls {
		port := "lan-control"
		if i > 0 {
			port = fmt.Sprintf("lan-control%d", i+1)
		}
		rt = append(rt, veth(port, ns)...)
		rt = append(rt, "link set "+port+" master br0")
	}
	for _, n := range l.Nodes {
		port := "lan-" + n.Name
		rt = append(rt, veth(port, n.Netns)...)
		rt = append(rt, "link set "+port+" master br0")
	}
	if err := l.Router.ipBatch(ctx, rt); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		var cmds []string
		for j, p := range n.Pods {
			cmds = append(cmds, veth(fmt.Sprintf("p%d", j+1), p.Netns)...)
		}
		if err := n.ipBatch(ctx, cmds); err != nil {
			return err
		}
	}

	// Phase 2: bring links up, then addresses, then routes.
	if err := l.Router.ipBatch(ctx, l.routerConfig()); err != nil {
		return err
	}
	if err := l.Client.ipBatch(ctx, hostConfig(ClientIPv4, ClientIPv6, 24, RouterClientIPv4, RouterClientIPv6)); err != nil {
		return err
	}
	for i, ns := range l.Controls {
		if err := ns.ipBatch(ctx, hostConfig(ControlAddr(i), ControlAddr6(i), 24, RouterLANv4, RouterLANv6)); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := n.ipBatch(ctx, l.nodeConfig(n)); err != nil {
			return err
		}
		for _, p := range n.Pods {
			if err := p.ipBatch(ctx, podConfig(p)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *Lab) isNode(ns *Netns) bool {
	for _, n := range l.Nodes {
		if n.Netns == ns {
			return true
		}
	}
	return false
}

// veth creates local<->eth0 with eth0 in peer.
func veth(local string, peer *Netns) []string {
	return []string{"link add " + local + " type veth peer name eth0 netns " + peer.Name}
}

func (l *Lab) routerConfig() []string {
	c := []string{"link set lo up", "link set br0 up", "link set eth-client up", "link set lan-control up"}
	for i := 2; i <= len(l.Controls); i++ {
		c = append(c, fmt.Sprintf("link set lan-control%d up", i))
	}
	for _, n := range l.Nodes {
		c = append(c, "link set lan-"+n.Name+" up")
	}
	c = append(c,
		"addr add "+RouterClientIPv4.String()+"/24 dev eth-client",
		"addr add "+RouterClientIPv6.String()+"/64 dev eth-client nodad",
		"addr add "+RouterLANv4.String()+"/24 dev br0",
		"addr add "+RouterLANv6.String()+"/64 dev br0 nodad",
	)
	for _, n := range l.Nodes {
		c = append(c,
			"route add "+n.PodCIDRv4.String()+" via "+n.IPv4.String(),
			"route add "+n.PodCIDRv6.String()+" via "+n.IPv6.String(),
		)
	}
	return c
}

// hostConfig configures a single-homed namespace with eth0 (client, control).
func hostConfig(v4, v6 netip.Addr, bits int, gw4, gw6 netip.Addr) []string {
	return []string{
		"link set lo up",
		"link set eth0 up",
		fmt.Sprintf("addr add %s/%d dev eth0", v4, bits),
		fmt.Sprintf("addr add %s/64 dev eth0 nodad", v6),
		"route add 0.0.0.0/0 via " + gw4.String(),
		"route add ::/0 via " + gw6.String(),
	}
}

func (l *Lab) nodeConfig(n *Node) []string {
	c := hostConfig(n.IPv4, n.IPv6, 24, RouterLANv4, RouterLANv6)
	for j, p := range n.Pods {
		dev := fmt.Sprintf("p%d", j+1)
		c = append(c,
			"link set "+dev+" up",
			// The pods' gateway: the same link-local address on every pod
			// veth, answered by the node itself.
			"addr add 169.254.1.1/32 dev "+dev,
			"addr add fe80::1/64 dev "+dev+" nodad",
			"route add "+p.IPv4.String()+"/32 dev "+dev,
			"route add "+p.IPv6.String()+"/128 dev "+dev,
		)
	}
	// Direct routes across the LAN, so node-to-node pod traffic does not
	// hairpin through the router.
	for _, o := range l.Nodes {
		if o != n {
			c = append(c,
				"route add "+o.PodCIDRv4.String()+" via "+o.IPv4.String(),
				"route add "+o.PodCIDRv6.String()+" via "+o.IPv6.String(),
			)
		}
	}
	return c
}

func podConfig(p *Pod) []string {
	return []string{
		"link set lo up",
		"link set eth0 up",
		"addr add " + p.IPv4.String() + "/32 dev eth0",
		"addr add " + p.IPv6.String() + "/128 dev eth0 nodad",
		"route add 169.254.1.1/32 dev eth0 scope link",
		"route add 0.0.0.0/0 via 169.254.1.1 dev eth0",
		"route add ::/0 via fe80::1 dev eth0",
	}
}

// Close kills every started process (SIGTERM, then SIGKILL after 3 s), kills
// anything else still running in the lab's namespaces, and deletes the
// namespaces New created. Logs in Dir are kept. Close is idempotent and safe
// to call concurrently.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.teardown() })
	return l.closeErr
}

func (l *Lab) teardown() error {
	l.mu.Lock()
	l.closed = true
	procs, created := l.procs, l.created
	l.mu.Unlock()
	close(l.done)

	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { errs[i] = p.Stop() })
	}
	wg.Wait()

	// Fresh context: teardown must run even if the caller's is cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range created {
		// Stragglers (children that left the process group, processes started
		// with Run whose context outlived us) would keep the namespace alive.
		if out, err := exec.CommandContext(ctx, "ip", "netns", "pids", ns.Name).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				var pid int
				// Never the test itself: one of its threads may be in the
				// namespace (Netns.Do, Thread).
				if _, err := fmt.Sscan(f, &pid); err == nil && pid > 0 && pid != os.Getpid() {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if out, err := exec.CommandContext(ctx, "ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
			if _, statErr := os.Stat(ns.path()); !os.IsNotExist(statErr) {
				errs = append(errs, fmt.Errorf("lab: ip netns del %s: %w: %s", ns.Name, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// CloseOnInterrupt closes the lab and exits with status 130 on SIGINT or
// SIGTERM, so an interrupted demo does not leave namespaces behind. The
// handler is removed when the lab is closed.
func (l *Lab) CloseOnInterrupt() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-c:
			l.Close()
			os.Exit(130)
		case <-l.done:
			signal.Stop(c)
		}
	}()
}
