// Command weir-agent runs on every node: it streams the node's desired state
// from weir-server and programs it into nftables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/agent/bgp"
	"github.com/weirlb/weir/agent/conntrack"
	"github.com/weirlb/weir/agent/drain"
	"github.com/weirlb/weir/agent/faults"
	"github.com/weirlb/weir/agent/flows"
	"github.com/weirlb/weir/agent/health"
	"github.com/weirlb/weir/agent/l2"
	"github.com/weirlb/weir/agent/removal"
	"github.com/weirlb/weir/agent/syncer"
	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bgpnumbers"
	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/daemon"
	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/iprange"
	"github.com/weirlb/weir/internal/membership"
	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/internal/tlsconfig/tlsmetrics"
)

// version is set at build time.
var version = "dev"

func main() {
	if err := run(); err != nil {
		daemon.Exit("weir-agent", err)
	}
}

func run() error {
	o := newOptions(flag.CommandLine)
	flag.Parse()
	log, done, err := o.common.Start("weir-agent", version, os.Stdout, os.Stderr)
	if done || err != nil {
		return err
	}
	log = log.With("node", o.nodeName)
	set, err := o.settings(log)
	if err != nil {
		return err
	}
	a, err := newAgent(o, set, log)
	if err != nil {
		return err
	}
	if o.cleanup {
		return a.cleanup()
	}
	defer a.undo.Run()
	for _, start := range []func() error{
		a.forward,          // the datapath the states are applied to
		a.dialServer,       // the connection to the server's replicas
		a.watchRemoval,     // the agent's DaemonSet: deleted, all removed at the end
		a.catchSignals,     // the context SIGINT and SIGTERM end
		a.tuneConntrack,    // the kernel's connection-tracking table and timeouts
		a.serveHealth,      // /healthz, /livez, /metrics, health-check node ports
		a.repairTables,     // tables someone else removed put back
		a.reportMovedFlows, // moved connections passed on, and reported
		a.drain,            // a drained node's connections counted and ended
		a.announceBGP,      // load-balancer IPs announced to routers
		a.joinMembers,      // the failure-detection membership
		a.answerL2,         // ARP and NDP for the L2 addresses leased
	} {
		if err := start(); err != nil {
			return err
		}
	}
	return a.sync()
}

// options are the agent's flags.
type options struct {
	common   *daemon.Flags
	server   dial.Flags
	members  membership.Flags
	nodeName string

	clusterCIDRs, masqMode, detectLocal, podBridge, podIfPrefix string
	serviceCIDRs, nodePortAddr                                  string
	masqAll, cleanup                                            bool
	resync                                                      time.Duration
	conntrack                                                   conntrack.Config

	healthzAddr, metricsAddr                             string
	healthTO                                             time.Duration
	hcConns, healthzConns, perSource, sourceV4, sourceV6 int

	ownDaemonSet                     string
	kubeAPIServer, kubeToken, kubeCA string

	bgpASN                asn
	bgpRouterID, bgpPeers string
	bgpPeerFlags          bgpspeaker.PeerFlags
	passFlows             bool
	flowsPort             int
}

// newOptions registers the agent's flags on fs.
func newOptions(fs *flag.FlagSet) *options {
	hostname, _ := os.Hostname()
	o := &options{server: dial.Flags{Who: "agent", Moves: ", from a random start, and moves to the next when it goes away or is not current", NodeToken: true}}
	o.server.Register(fs)
	fs.StringVar(&o.nodeName, "node-name", hostname, "this node's name, as the server knows it")
	fs.StringVar(&o.clusterCIDRs, "cluster-cidr", "", "comma-separated pod CIDRs of the cluster: sources in them are local to the cluster (their connections to cluster IPs are not masqueraded)")
	fs.StringVar(&o.masqMode, "masquerade-mode", "kube-proxy", "which connections endpoints see from the node's address: kube-proxy (as kube-proxy: every connection to a node port, external or load-balancer IP of an externalTrafficPolicy Cluster service, and to a cluster IP from outside --cluster-cidr) or preserve-local (keep the client's address wherever the endpoint is on the node the connection entered; see docs/kube-proxy.md)")
	fs.BoolVar(&o.masqAll, "masquerade-all", false, "also masquerade every connection to a cluster IP, from any source (kube-proxy's --masquerade-all)")
	fs.StringVar(&o.detectLocal, "detect-local-mode", "ClusterCIDR", "how a source is told to be a pod of the cluster, as kube-proxy's: ClusterCIDR (--cluster-cidr and the node's pod CIDRs), NodeCIDR (the node's pod CIDRs), BridgeInterface (--pod-bridge-interface), InterfaceNamePrefix (--pod-interface-name-prefix) or None")
	fs.StringVar(&o.podBridge, "pod-bridge-interface", "", "with --detect-local-mode BridgeInterface: the bridge the node's pods are on")
	fs.StringVar(&o.podIfPrefix, "pod-interface-name-prefix", "", "with --detect-local-mode InterfaceNamePrefix: the name prefix of the pods' interfaces on the node")
	fs.StringVar(&o.serviceCIDRs, "service-cidr", "", "comma-separated ranges cluster IPs are allocated from: new connections to an address in them that no service holds are dropped instead of routed out (kube-proxy's unallocated ClusterIPs)")
	fs.StringVar(&o.nodePortAddr, "nodeport-addresses", "", "comma-separated CIDRs whose local addresses serve node ports (default: the node's addresses)")
	fs.DurationVar(&o.resync, "resync-period", 5*time.Minute, "how often the whole nftables table is rewritten, repairing what others changed")
	o.conntrack = conntrack.Defaults
	fs.IntVar(&o.conntrack.MaxPerCore, "conntrack-max-per-core", o.conntrack.MaxPerCore, "connection-tracking entries per CPU the table is raised to, at least --conntrack-min, as kube-proxy's (0: leave the size as it is)")
	fs.IntVar(&o.conntrack.Min, "conntrack-min", o.conntrack.Min, "the least connection-tracking entries the table is raised to, whatever the CPUs, as kube-proxy's")
	fs.DurationVar(&o.conntrack.TCPEstablished, "conntrack-tcp-timeout-established", o.conntrack.TCPEstablished, "idle timeout of established TCP connections, set on the node as kube-proxy does (0: leave as it is)")
	fs.DurationVar(&o.conntrack.TCPCloseWait, "conntrack-tcp-timeout-close-wait", o.conntrack.TCPCloseWait, "timeout of TCP connections in CLOSE_WAIT, set on the node as kube-proxy does (0: leave as it is)")
	fs.StringVar(&o.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez, for load balancers and probes")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics (Prometheus), and of /debug/pprof/ with --profiling")
	fs.DurationVar(&o.healthTO, "health-timeout", 60*time.Second, "how long an update may wait to be applied before /healthz fails")
	fs.IntVar(&o.hcConns, "health-check-max-connections", health.ServiceLimits.Connections, "connections every health-check node port together holds; when full, a new connection from a source holding fewer than another takes the place of one of that other's, and any other is closed")
	fs.IntVar(&o.healthzConns, "healthz-max-connections", health.NodeLimits.Connections, "connections /healthz and /livez hold, and /metrics its own, likewise")
	fs.IntVar(&o.perSource, "health-connections-per-source", health.ServiceLimits.PerSource, "connections one source holds at once on the health listeners (each limit above); past it, its new connection takes the place of its own oldest")
	fs.IntVar(&o.sourceV4, "health-source-ipv4-prefix", health.ServiceLimits.IPv4Prefix, "prefix length within which IPv4 addresses count as one source of health connections")
	fs.IntVar(&o.sourceV6, "health-source-ipv6-prefix", health.ServiceLimits.IPv6Prefix, "prefix length within which IPv6 addresses count as one source of health connections (64: a host's SLAAC and privacy addresses are one source)")
	fs.StringVar(&o.bgpRouterID, "bgp-router-id", "", "BGP router ID (default: the first IPv4 address of the host)")
	fs.StringVar(&o.bgpPeers, "bgp-peers", "", "comma-separated upstream routers, ADDRESS[:PORT]/ASN, besides the BgpPeer resources that select this node")
	o.bgpPeerFlags.Register(fs)
	fs.BoolVar(&o.passFlows, "pass-moved-connections", true, "pass the packets of established connections that a router moves to this node (when the nodes behind its ECMP route change) on to the node that holds them, through a VXLAN device (UDP port --moved-connections-port between the nodes), instead of refusing them here")
	fs.IntVar(&o.flowsPort, "moved-connections-port", flows.DefaultPort, "UDP port of the VXLAN device that carries moved connections between the nodes (the same on every node)")
	fs.StringVar(&o.ownDaemonSet, "own-daemonset", "", "NAMESPACE/NAME of the DaemonSet this agent runs in: the agent watches it, and when it stops after the DaemonSet was deleted (Weir uninstalled), removes what it programmed on the node, as --cleanup, and ends its BGP sessions; on any other stop (a restart, an upgrade) or when the watch could not tell, the node keeps forwarding (empty: no watch, as outside Kubernetes)")
	fs.StringVar(&o.kubeAPIServer, "kube-apiserver", "", "with --own-daemonset: the Kubernetes apiserver's URL (default: the in-cluster address)")
	fs.StringVar(&o.kubeToken, "kube-token-file", removal.DefaultTokenFile, "with --own-daemonset: the service-account token the DaemonSet is watched with")
	fs.StringVar(&o.kubeCA, "kube-ca-file", removal.DefaultCAFile, "with --own-daemonset: the CA of the apiserver's certificate")
	fs.BoolVar(&o.cleanup, "cleanup", false, "delete every nftables table the agent programs (ip and ip6 weir) and exit, as kube-proxy's --cleanup; the node then forwards no service")
	fs.Var(&o.bgpASN, "bgp-asn", "announce load-balancer IPs over BGP from this AS, 1-4294967295 (0 or empty: no BGP, and BgpPeer resources are ignored; empty lets a manifest pass an unset setting through)")
	o.members.AddFlags(fs, "comma-separated ADDRESS:PORT of members to join (the load-balancer speakers), so that they learn within a second when this node dies")
	o.common = daemon.AddFlags(fs)
	return o
}

// settings are what the flags ask of the datapath and the health
// listeners, checked.
type settings struct {
	datapath                       datapath.Config
	healthChecks, healthzListeners health.Limits
	removal                        *removal.Config // with --own-daemonset
}

// settings checks the flags and reads what they ask for.
func (o *options) settings(log *slog.Logger) (settings, error) {
	set := settings{datapath: datapath.Config{Log: log, MasqueradeAll: o.masqAll}}
	cfg := &set.datapath
	if o.nodeName == "" {
		return set, fmt.Errorf("--node-name: required")
	}
	if err := o.conntrack.Validate(); err != nil {
		return set, fmt.Errorf("--conntrack-*: %w", err)
	}
	var err error
	if cfg.Masquerade, err = masquerade(o.masqMode, o.masqAll); err != nil {
		return set, err
	}
	if cfg.LocalDetection, err = localDetection(o.detectLocal, o.podBridge, o.podIfPrefix); err != nil {
		return set, err
	}
	if cfg.ClusterCIDRs, err = parsePrefixes("--cluster-cidr", o.clusterCIDRs); err != nil {
		return set, err
	}
	if cfg.ServiceCIDRs, err = serviceRanges(o.serviceCIDRs); err != nil {
		return set, err
	}
	if cfg.NodePortAddresses, err = parsePrefixes("--nodeport-addresses", o.nodePortAddr); err != nil {
		return set, err
	}
	cfg.ProtectedPorts = protectedPorts(o.healthzAddr, o.metricsAddr)
	if set.healthChecks, set.healthzListeners, err = healthLimits(o.hcConns, o.healthzConns, o.perSource, o.sourceV4, o.sourceV6); err != nil {
		return set, err
	}
	if o.flowsPort < 1 || o.flowsPort > 65535 {
		return set, fmt.Errorf("--moved-connections-port %d: want 1-65535", o.flowsPort)
	}
	if set.removal, err = o.removalWatch(log); err != nil {
		return set, err
	}
	return set, nil
}

// removalWatch reads --own-daemonset and the apiserver it is watched on.
func (o *options) removalWatch(log *slog.Logger) (*removal.Config, error) {
	if o.ownDaemonSet == "" {
		return nil, nil
	}
	ns, name, ok := strings.Cut(o.ownDaemonSet, "/")
	if !ok || !dnsLabel.MatchString(ns) || !dnsSubdomain.MatchString(name) {
		return nil, fmt.Errorf("--own-daemonset %q: want NAMESPACE/NAME", o.ownDaemonSet)
	}
	if o.kubeAPIServer != "" && !strings.HasPrefix(o.kubeAPIServer, "https://") {
		return nil, fmt.Errorf("--kube-apiserver %q: want an https:// URL", o.kubeAPIServer)
	}
	return &removal.Config{Namespace: ns, Name: name, APIServer: o.kubeAPIServer, TokenFile: o.kubeToken, CAFile: o.kubeCA,
		Log: log.With("component", "removal")}, nil
}

// Kubernetes' names: a namespace is a DNS label, a DaemonSet's name a DNS
// subdomain.
var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
)

// masquerade reads --masquerade-mode, which --masquerade-all must agree
// with.
func masquerade(mode string, all bool) (datapath.MasqueradeMode, error) {
	switch mode {
	case "kube-proxy":
		return datapath.MasqueradeKubeProxy, nil
	case string(datapath.MasqueradePreserveLocal):
		if all {
			return "", fmt.Errorf("--masquerade-all: only with --masquerade-mode kube-proxy")
		}
		return datapath.MasqueradePreserveLocal, nil
	}
	return "", fmt.Errorf("--masquerade-mode %q: want kube-proxy or preserve-local", mode)
}

// protectedPorts are the agent's own ports, which stay the agent's
// whatever the state says.
func protectedPorts(addrs ...string) []uint16 {
	var out []uint16
	for _, addr := range addrs {
		if _, port, err := net.SplitHostPort(addr); err == nil {
			if p, err := strconv.ParseUint(port, 10, 16); err == nil && p != 0 {
				out = append(out, uint16(p))
			}
		}
	}
	return out
}

// agent is the running agent: its parts, which run starts in order, and
// what each leaves to undo when the agent stops.
type agent struct {
	o   *options
	set settings
	log *slog.Logger

	dp      *datapath.Datapath
	moved   *flows.Flows
	applier flows.Datapath // what the syncer applies to
	tls     *tlsconfig.Source
	conn    *dial.Servers
	ctx     context.Context    // ends at SIGINT or SIGTERM
	cancel  context.CancelFunc // ends ctx, and stops catching the signals
	reg     *prometheus.Registry
	removal *removal.Watch // with --own-daemonset
	health  *health.Agent
	// observers follow the states received and report to the server.
	observers syncer.Observers
	undo      daemon.Undo // what the parts started leave to do at the end
}

// newAgent makes the datapath (and the device of moved connections) the
// flags ask for.
func newAgent(o *options, set settings, log *slog.Logger) (*agent, error) {
	a := &agent{o: o, set: set, log: log}
	a.moved = flows.New(flows.Config{Port: o.flowsPort, Log: log.With("component", "flows")})
	if o.passFlows {
		a.set.datapath.Flows = a.moved.Redirect()
	}
	var err error
	a.dp, err = datapath.NewForNode(a.set.datapath)
	return a, err
}

// cleanup is --cleanup: the tables and the device removed.
func (a *agent) cleanup() error {
	if err := a.removeProgrammed("--cleanup"); err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	return nil
}

// removeProgrammed removes what the agent programs on the node and stays
// when it stops: the ip and ip6 weir tables, and the device of moved
// connections with its routes, rules and address. (The BGP sessions, the
// L2 answers and the health listeners end with the process.) Each is
// removed even when another cannot be.
func (a *agent) removeProgrammed(why string) error {
	err := errors.Join(a.dp.Cleanup(context.Background()), a.moved.Close(context.Background()))
	if err != nil {
		return err
	}
	a.log.Info("deleted the ip and ip6 weir tables and the device of moved connections ("+flows.DefaultInterface+"), its routes and rules", "why", why)
	return nil
}

// watchRemoval watches the agent's DaemonSet, with --own-daemonset. Its
// undo comes after every later part's: when the agent stops because Weir
// is uninstalled, the BGP sessions have ended, the L2 answers stopped and
// nothing writes the tables any more when they are removed.
func (a *agent) watchRemoval() error {
	if a.set.removal == nil {
		return nil
	}
	var err error
	if a.removal, err = removal.Start(*a.set.removal); err != nil {
		return fmt.Errorf("--own-daemonset: %w", err)
	}
	a.undo.Add(func() {
		v := a.removal.Stop()
		if !v.Removed {
			a.log.Info("stopped; the nftables tables stay: the node goes on forwarding", "why", v.Reason)
			return
		}
		if err := a.removeProgrammed(v.Reason); err != nil {
			a.log.Error("removing what the agent programmed on the node", "why", v.Reason, "error", err)
		}
	})
	return nil
}

// uninstalled says whether the agent stops because Weir is uninstalled:
// its DaemonSet was deleted. The first call decides for every part.
func (a *agent) uninstalled() bool {
	return a.removal != nil && a.removal.Stop().Removed
}

// forward chooses the datapath: with moved connections passed on, or
// without (and their device removed).
func (a *agent) forward() error {
	a.applier = a.dp
	if a.o.passFlows {
		a.applier = &flows.Applier{Flows: a.moved, Datapath: a.dp}
	} else if err := a.moved.Close(context.Background()); err != nil {
		a.log.Warn("removing the device of moved connections", "error", err)
	}
	return nil
}

// tuneConntrack sets the connection-tracking table's size and timeouts
// as kube-proxy does. Before the kernel tracks anything (nf_conntrack not
// loaded: the datapath's first rules load it) the files are missing: it
// tries again every few seconds until they are there.
func (a *agent) tuneConntrack() error {
	apply := func() error { return conntrack.Apply("/", runtime.NumCPU(), a.o.conntrack, a.log) }
	err := apply()
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	a.log.Info("connection tracking not loaded yet: its tunables are set once it is", "error", err)
	go func() {
		for {
			select {
			case <-a.ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			if err := apply(); !errors.Is(err, fs.ErrNotExist) {
				if err != nil {
					a.log.Error("connection-tracking tunables not set", "error", err)
				}
				return
			}
		}
	}()
	return nil
}

// dialServer connects to the server's replicas, marked, so that nothing
// the datapath programs can take or refuse the agent's connections.
func (a *agent) dialServer() error {
	var err error
	if a.tls, err = a.o.server.TLS(a.log); err != nil {
		return err
	}
	if a.conn, err = a.o.server.Dial(a.tls, dial.WithSocketMark(datapath.DefaultControlMark)); err != nil {
		return err
	}
	a.undo.Add(func() { a.conn.Close() })
	return nil
}

// catchSignals makes the context that SIGINT and SIGTERM end, and starts
// passing moved connections on.
func (a *agent) catchSignals() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	a.ctx, a.cancel = ctx, stop
	a.undo.Add(stop)
	if a.o.passFlows {
		probing := make(chan struct{})
		go func() { a.moved.Run(ctx); close(probing) }()
		// The probes, which may move a route, end before the device
		// can be removed.
		a.undo.Add(func() { stop(); <-probing })
	}
	return nil
}

// serveHealth starts the node's health (its node ports and /healthz) and
// the metrics listener.
func (a *agent) serveHealth() error {
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.health = health.NewAgent(a.o.healthTO, a.set.healthChecks, a.log, a.reg)
	a.undo.Add(a.health.Services.Close)
	a.observers = append(a.observers, a.health)
	if err := serveHTTP(a.ctx, a.o.healthzAddr, a.health.Node.Handler(), health.NewConnLimit("healthz", a.set.healthzListeners), a.reg, a.log); err != nil {
		return fmt.Errorf("--healthz-bind-address: %w", err)
	}
	if a.tls != nil {
		a.reg.MustRegister(tlsmetrics.Collector{a.tls})
	}
	if err := serveHTTP(a.ctx, a.o.metricsAddr, statusHandler(a.o.common.MetricsHandler(a.reg, a.o.metricsAddr, a.log)), health.NewConnLimit("metrics", a.set.healthzListeners), a.reg, a.log); err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	return nil
}

// proxyMode is what GET /proxyMode answers on the metrics port, as
// kube-proxy answers its mode there: Weir programs kube-proxy's nftables
// mode's semantics (in its own tables).
const proxyMode = "nftables"

// statusHandler is kube-proxy's status port: /metrics (and the rest of
// metrics) and /proxyMode.
func statusHandler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", metrics)
	mux.HandleFunc("GET /proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, proxyMode)
	})
	return mux
}

// repairTables: someone flushing the ruleset (an nftables service
// reloading) takes the node's tables with it; they are put back within
// seconds, not at the next resync.
func (a *agent) repairTables() error {
	repairs := prometheus.NewCounter(prometheus.CounterOpts{Name: "weir_datapath_table_repairs_total",
		Help: "Times the agent found its nftables tables gone (the ruleset flushed or a table deleted by someone else) and rewrote them from the last state."})
	a.reg.MustRegister(repairs)
	repairing := make(chan struct{})
	go func() { repairTables(a.ctx, a.dp, repairs, a.log); close(repairing) }()
	// The repairs end before the tables can be removed, or one would
	// put them back.
	a.undo.Add(func() { a.cancel(); <-repairing })
	return nil
}

// reportMovedFlows reports the moved connections passed on.
func (a *agent) reportMovedFlows() error {
	if !a.o.passFlows {
		return nil
	}
	movedReport := flows.NewReporter(a.moved, a.dp)
	a.reg.MustRegister(movedReport)
	go movedReport.Run(a.ctx)
	a.observers = append(a.observers, movedReport)
	return nil
}

// drain: a drained node counts the external connections it still serves
// and ends them at the drain's deadline.
func (a *agent) drain() error {
	drainer := drain.New(drain.Netlink{}, clock.RealClock{}, a.log.With("component", "drain"), a.reg)
	go drainer.Run(a.ctx)
	a.observers = append(a.observers, drainer)
	return nil
}

// bgpReadyWait bounds how long /readyz waits for a BGP session.
const bgpReadyWait = time.Minute

// announceBGP announces the node's load-balancer IPs, with --bgp-asn.
func (a *agent) announceBGP() error {
	if a.o.bgpASN == 0 {
		return nil
	}
	// Rules left by the agent before this one still forward: tell
	// graceful-restart routers so, and they keep the routes they hold.
	cfg := bgpspeaker.Config{ASN: uint32(a.o.bgpASN), Restarting: a.dp.Forwarding(a.ctx), NextHopSelfOnLinks: true, Log: a.log.With("component", "bgp")}
	var err error
	if cfg.RouterID, err = bgpspeaker.RouterID(a.o.bgpRouterID); err != nil {
		return fmt.Errorf("--bgp-router-id: %w", err)
	}
	if cfg.Peers, err = bgpspeaker.ParsePeers(a.o.bgpPeers); err != nil {
		return fmt.Errorf("--bgp-peers: %w", err)
	}
	if err := a.o.bgpPeerFlags.Apply(cfg.Peers); err != nil {
		return err
	}
	speaker, err := bgpspeaker.Start(a.ctx, cfg)
	if err != nil {
		return err
	}
	a.reg.MustRegister(speaker.Collector())
	a.undo.Add(func() {
		if a.ctx.Err() != nil && speaker.GracefulRestart() && !a.uninstalled() {
			// Stopped (SIGTERM: a restart, an upgrade): the sessions
			// end with the process, without a NOTIFICATION, so that
			// graceful-restart routers keep forwarding to this node
			// on the rules left in place. Drain a node to take it out.
			// Uninstalled, the rules go: the sessions are closed and
			// the routers withdraw the routes at once.
			a.log.Info("leaving BGP sessions to graceful restart: routers keep this node's routes for the restart time")
			return
		}
		speaker.Close()
	})
	announcer := bgp.NewAnnouncer(speaker, a.health.Node.Healthy, a.log.With("component", "bgp"))
	a.observers = append(a.observers, announcer)
	// Ready (/readyz) once a router hears this node, so that a rollout
	// never stops the next node's agent while this one announces nothing;
	// or after bgpReadyWait, so that a router that is down stalls no
	// rollout.
	started := time.Now()
	a.health.Node.SetReady(func() bool { return announcer.Established() || time.Since(started) > bgpReadyWait })
	return nil
}

// joinMembers joins the failure-detection membership, with
// --memberlist-bind-address.
func (a *agent) joinMembers() error {
	member, err := a.o.members.Start(a.o.nodeName, nil, a.log.With("component", "membership"))
	if err != nil {
		return err
	}
	if member != nil {
		// A stopping agent takes its node out of the load balancers at
		// once: its health answers stop too.
		a.undo.Add(member.Leave)
	}
	return nil
}

// answerL2: the node answers ARP and NDP for the L2 addresses it holds a
// lease on, asked of the server that decides the owners over a
// connection of its own (with replicas, the leader's).
func (a *agent) answerL2() error {
	leaseConn, err := a.o.server.Dial(a.tls, dial.WithSocketMark(datapath.DefaultControlMark))
	if err != nil {
		return err
	}
	a.undo.Add(func() { leaseConn.Close() })
	responder := l2.New(a.log.With("component", "l2"))
	a.undo.Add(responder.Close)
	leases := l2.NewLeases(clock.RealClock{}, responder.Set)
	responder.Valid(leases.Valid)
	a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_l2_answered_addresses", Help: "L2 addresses this node answers ARP and NDP for now (it holds their leases).",
	}, func() float64 { return float64(len(leases.Held())) }))
	asker := l2.NewAsker(leaseConn, a.o.nodeName, leases, clock.RealClock{}, a.log.With("component", "l2"))
	a.observers = append(a.observers, asker)
	askerDone := make(chan struct{})
	go func() { asker.Run(a.ctx); close(askerDone) }()
	// On SIGTERM the node's L2 addresses are given up (and the server
	// told) before the agent goes.
	a.undo.Add(func() { a.cancel(); <-askerDone })
	return nil
}

// sync streams the node's state from the server and applies it until
// SIGTERM. On exit the rules stay: forwarding must not stop because the
// agent restarts. They go when the agent's DaemonSet was deleted
// (--own-daemonset), or with --cleanup.
func (a *agent) sync() error {
	s := syncer.New(syncer.Config{NodeName: a.o.nodeName, AgentVersion: version, ResyncPeriod: a.o.resync, Metrics: a.reg},
		a.conn, faults.Wrap(a.applier, a.log), a.observers, a.log)
	a.log.Info("starting", "servers", a.o.server.Servers, "server", a.conn.Current(), "tls", !a.o.server.Insecure, "version", version)
	if err := s.Run(a.ctx); err != nil && a.ctx.Err() == nil {
		return err
	}
	if a.removal == nil {
		a.log.Info("stopped; nftables rules left in place")
	}
	return nil
}

// tableCheckPeriod is how often the agent checks that its tables are
// still there.
const tableCheckPeriod = 2 * time.Second

// repairTables rewrites the tables whenever someone removed them, until
// ctx ends.
func repairTables(ctx context.Context, dp *datapath.Datapath, repairs prometheus.Counter, log *slog.Logger) {
	tick := time.NewTicker(tableCheckPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		repaired, err := dp.RepairIfGone(ctx)
		if repaired {
			repairs.Inc()
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("checking that the tables are in place", "error", err)
		}
	}
}

// serveHTTP serves h on addr until ctx ends, within limit (registered
// with reg).
func serveHTTP(ctx context.Context, addr string, h http.Handler, limit *health.ConnLimit, reg prometheus.Registerer, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	reg.MustRegister(limit)
	srv := limit.Server(h)
	ln = limit.Listen(ln)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server stopped", "address", addr, "error", err)
		}
	}()
	return nil
}

// healthLimits are the connection limits of the health-check node ports
// and of /healthz (and /metrics), from their flags.
func healthLimits(hcConns, healthzConns, perSource, sourceV4, sourceV6 int) (hc, healthz health.Limits, err error) {
	for _, f := range []struct {
		name        string
		value       int
		least, most int
	}{
		{"--health-check-max-connections", hcConns, 1, 1 << 20},
		{"--healthz-max-connections", healthzConns, 1, 1 << 20},
		{"--health-connections-per-source", perSource, 1, 1 << 20},
		{"--health-source-ipv4-prefix", sourceV4, 0, 32},
		{"--health-source-ipv6-prefix", sourceV6, 0, 128},
	} {
		if f.value < f.least || f.value > f.most {
			return hc, healthz, fmt.Errorf("%s %d: want %d-%d", f.name, f.value, f.least, f.most)
		}
	}
	hc = health.Limits{Connections: hcConns, PerSource: perSource, IPv4Prefix: sourceV4, IPv6Prefix: sourceV6}
	healthz = hc
	healthz.Connections = healthzConns
	return hc, healthz, nil
}

func parsePrefixes(flagName, list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a CIDR", flagName, s)
		}
		out = append(out, p)
	}
	return out, nil
}

// asn is --bgp-asn: an AS number, 0 or empty for none.
type asn uint32

func (a *asn) String() string { return strconv.FormatUint(uint64(*a), 10) }

func (a *asn) Set(s string) error {
	if s == "" {
		*a = 0
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("%q is not an AS number (0-4294967295)", s)
	}
	if v != 0 {
		if err := bgpnumbers.ValidateASN(uint32(v)); err != nil {
			return err
		}
	}
	*a = asn(v)
	return nil
}

// serviceRanges reads --service-cidr: every node drops new connections to
// a range's free addresses, so each is held to what the server holds its
// service ranges to.
func serviceRanges(list string) ([]netip.Prefix, error) {
	out, err := parsePrefixes("--service-cidr", list)
	if err != nil {
		return nil, err
	}
	for _, p := range out {
		if err := iprange.ValidateServiceRange(p); err != nil {
			return nil, fmt.Errorf("--service-cidr: %w", err)
		}
	}
	return out, nil
}

// localDetection reads --detect-local-mode and the interface it needs.
func localDetection(mode, bridge, prefix string) (datapath.LocalDetection, error) {
	d := datapath.LocalDetection{Mode: datapath.LocalDetectionMode(mode)}
	need := ""
	switch d.Mode {
	case datapath.DetectClusterCIDR, datapath.DetectNodeCIDR, datapath.DetectNone:
	case datapath.DetectBridgeInterface:
		d.Interface, need = bridge, "--pod-bridge-interface"
	case datapath.DetectInterfaceNamePrefix:
		d.Interface, need = prefix, "--pod-interface-name-prefix"
	default:
		return d, fmt.Errorf("--detect-local-mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix or None", mode)
	}
	if need != "" && !interfaceName.MatchString(d.Interface) {
		return d, fmt.Errorf("%s %q: with --detect-local-mode %s, an interface name (letters, digits, '.', '-', '_'; at most 15)", need, d.Interface, mode)
	}
	return d, nil
}

// interfaceName is what Linux accepts as an interface name, and nft
// reads inside quotes unchanged.
var interfaceName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,15}$`)
