// Command weir-agent runs on every node: it streams the node's desired state
// from weir-server and programs it into nftables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/agent/bgp"
	"github.com/weirlb/weir/agent/drain"
	"github.com/weirlb/weir/agent/faults"
	"github.com/weirlb/weir/agent/flows"
	"github.com/weirlb/weir/agent/health"
	"github.com/weirlb/weir/agent/l2"
	"github.com/weirlb/weir/agent/syncer"
	"github.com/weirlb/weir/datapath"
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
		fmt.Fprintln(os.Stderr, "weir-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	hostname, _ := os.Hostname()
	var (
		serverAddr    = flag.String("server", "127.0.0.1:7443", "comma-separated HOST:PORT of weir-server's replicas (a DNS name counts as all its addresses); the agent is on one at a time, from a random start, and moves to the next when it goes away or is not current")
		nodeName      = flag.String("node-name", hostname, "this node's name, as the server knows it")
		plain         = flag.Bool("insecure", false, "talk to the server in plain text (lab and demo only)")
		caFile        = flag.String("ca-file", "", "CA that signed the server's certificate")
		certFile      = flag.String("cert-file", "", "this agent's client certificate (PEM)")
		keyFile       = flag.String("key-file", "", "this agent's private key (PEM)")
		nodeTokenFile = flag.String("node-token-file", "", "a service-account token naming this node (a projected token volume with the server's --agent-token-audience), sent with every call: on the agents' shared certificate, the server then lets this agent act for its own node only")
		clusterCIDRs  = flag.String("cluster-cidr", "", "comma-separated pod CIDRs of the cluster: sources in them are local to the cluster (their connections to cluster IPs are not masqueraded)")
		masqMode      = flag.String("masquerade-mode", "kube-proxy", "which connections endpoints see from the node's address: kube-proxy (as kube-proxy: every connection to a node port, external or load-balancer IP of an externalTrafficPolicy Cluster service, and to a cluster IP from outside --cluster-cidr) or preserve-local (keep the client's address wherever the endpoint is on the node the connection entered; see docs/kube-proxy.md)")
		masqAll       = flag.Bool("masquerade-all", false, "also masquerade every connection to a cluster IP, from any source (kube-proxy's --masquerade-all)")
		detectLocal   = flag.String("detect-local-mode", "ClusterCIDR", "how a source is told to be a pod of the cluster, as kube-proxy's: ClusterCIDR (--cluster-cidr and the node's pod CIDRs), NodeCIDR (the node's pod CIDRs), BridgeInterface (--pod-bridge-interface), InterfaceNamePrefix (--pod-interface-name-prefix) or None")
		podBridge     = flag.String("pod-bridge-interface", "", "with --detect-local-mode BridgeInterface: the bridge the node's pods are on")
		podIfPrefix   = flag.String("pod-interface-name-prefix", "", "with --detect-local-mode InterfaceNamePrefix: the name prefix of the pods' interfaces on the node")
		serviceCIDRs  = flag.String("service-cidr", "", "comma-separated ranges cluster IPs are allocated from: new connections to an address in them that no service holds are dropped instead of routed out (kube-proxy's unallocated ClusterIPs)")
		nodePortAddr  = flag.String("nodeport-addresses", "", "comma-separated CIDRs whose local addresses serve node ports (default: the node's addresses)")
		resync        = flag.Duration("resync-period", 5*time.Minute, "how often the whole nftables table is rewritten, repairing what others changed")
		healthzAddr   = flag.String("healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez, for load balancers and probes")
		metricsAddr   = flag.String("metrics-bind-address", "127.0.0.1:10249", "address of /metrics (Prometheus), and of /debug/pprof/ with --profiling")
		healthTO      = flag.Duration("health-timeout", 60*time.Second, "how long an update may wait to be applied before /healthz fails")
		hcConns       = flag.Int("health-check-max-connections", health.ServiceLimits.Connections, "connections every health-check node port together holds; when full, a new connection from a source holding fewer than another takes the place of one of that other's, and any other is closed")
		healthzConns  = flag.Int("healthz-max-connections", health.NodeLimits.Connections, "connections /healthz and /livez hold, and /metrics its own, likewise")
		perSource     = flag.Int("health-connections-per-source", health.ServiceLimits.PerSource, "connections one source holds at once on the health listeners (each limit above); past it, its new connection takes the place of its own oldest")
		sourceV4      = flag.Int("health-source-ipv4-prefix", health.ServiceLimits.IPv4Prefix, "prefix length within which IPv4 addresses count as one source of health connections")
		sourceV6      = flag.Int("health-source-ipv6-prefix", health.ServiceLimits.IPv6Prefix, "prefix length within which IPv6 addresses count as one source of health connections (64: a host's SLAAC and privacy addresses are one source)")
		bgpASN        = new(asn)
		bgpRouterID   = flag.String("bgp-router-id", "", "BGP router ID (default: the first IPv4 address of the host)")
		bgpPeers      = flag.String("bgp-peers", "", "comma-separated upstream routers, ADDRESS[:PORT]/ASN, besides the BgpPeer resources that select this node")
		passFlows     = flag.Bool("pass-moved-connections", true, "pass the packets of established connections that a router moves to this node (when the nodes behind its ECMP route change) on to the node that holds them, through a VXLAN device (UDP port --moved-connections-port between the nodes), instead of refusing them here")
		flowsPort     = flag.Int("moved-connections-port", flows.DefaultPort, "UDP port of the VXLAN device that carries moved connections between the nodes (the same on every node)")
		cleanup       = flag.Bool("cleanup", false, "delete every nftables table the agent programs (ip and ip6 weir) and exit, as kube-proxy's --cleanup; the node then forwards no service")
	)
	flag.Var(bgpASN, "bgp-asn", "announce load-balancer IPs over BGP from this AS, 1-4294967295 (0 or empty: no BGP, and BgpPeer resources are ignored; empty lets a manifest pass an unset setting through)")
	var members membership.Flags
	members.AddFlags(flag.CommandLine, "comma-separated ADDRESS:PORT of members to join (the load-balancer speakers), so that they learn within a second when this node dies")
	common := daemon.AddFlags(flag.CommandLine)
	flag.Parse()
	log, done, err := common.Start("weir-agent", version, os.Stdout, os.Stderr)
	if done || err != nil {
		return err
	}
	log = log.With("node", *nodeName)
	if *nodeName == "" {
		return fmt.Errorf("--node-name: required")
	}
	cfg := datapath.Config{Log: log, MasqueradeAll: *masqAll}
	switch *masqMode {
	case "kube-proxy":
		cfg.Masquerade = datapath.MasqueradeKubeProxy
	case string(datapath.MasqueradePreserveLocal):
		if *masqAll {
			return fmt.Errorf("--masquerade-all: only with --masquerade-mode kube-proxy")
		}
		cfg.Masquerade = datapath.MasqueradePreserveLocal
	default:
		return fmt.Errorf("--masquerade-mode %q: want kube-proxy or preserve-local", *masqMode)
	}
	if cfg.LocalDetection, err = localDetection(*detectLocal, *podBridge, *podIfPrefix); err != nil {
		return err
	}
	if cfg.ClusterCIDRs, err = parsePrefixes("--cluster-cidr", *clusterCIDRs); err != nil {
		return err
	}
	if cfg.ServiceCIDRs, err = serviceRanges(*serviceCIDRs); err != nil {
		return err
	}
	if cfg.NodePortAddresses, err = parsePrefixes("--nodeport-addresses", *nodePortAddr); err != nil {
		return err
	}
	// The agent's own ports stay the agent's whatever the state says.
	for _, addr := range []string{*healthzAddr, *metricsAddr} {
		if _, port, err := net.SplitHostPort(addr); err == nil {
			if p, err := strconv.ParseUint(port, 10, 16); err == nil && p != 0 {
				cfg.ProtectedPorts = append(cfg.ProtectedPorts, uint16(p))
			}
		}
	}
	hcLimits, healthzLimits, err := healthLimits(*hcConns, *healthzConns, *perSource, *sourceV4, *sourceV6)
	if err != nil {
		return err
	}
	if *flowsPort < 1 || *flowsPort > 65535 {
		return fmt.Errorf("--moved-connections-port %d: want 1-65535", *flowsPort)
	}
	moved := flows.New(flows.Config{Port: *flowsPort, Log: log.With("component", "flows")})
	if *passFlows {
		cfg.Flows = moved.Redirect()
	}
	dp, err := datapath.NewForNode(cfg)
	if err != nil {
		return err
	}
	if *cleanup {
		if err := dp.Cleanup(context.Background()); err != nil {
			return fmt.Errorf("--cleanup: %w", err)
		}
		if err := moved.Close(context.Background()); err != nil {
			return fmt.Errorf("--cleanup: %w", err)
		}
		log.Info("deleted the ip and ip6 weir tables and the device of moved connections")
		return nil
	}
	var applier flows.Datapath = dp
	if *passFlows {
		applier = &flows.Applier{Flows: moved, Datapath: dp}
	} else if err := moved.Close(context.Background()); err != nil {
		log.Warn("removing the device of moved connections", "error", err)
	}

	var tlsSrc *tlsconfig.Source
	if !*plain {
		if tlsSrc, err = tlsconfig.Load(tlsconfig.Files{CA: *caFile, Cert: *certFile, Key: *keyFile}, tlsconfig.Options{Use: "agent", Log: log}); err != nil {
			return err
		}
	}
	// Marked, so that nothing the datapath programs can take or refuse the
	// agent's connections to its server.
	dialOpts := []dial.Option{dial.WithSocketMark(datapath.DefaultControlMark)}
	if *nodeTokenFile != "" {
		dialOpts = append(dialOpts, dial.WithNodeToken(*nodeTokenFile))
	}
	conn, err := dial.NewServers(*serverAddr, tlsSrc, dialOpts...)
	if err != nil {
		return err
	}
	defer conn.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *passFlows {
		go moved.Run(ctx)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	nodeHealth := health.NewAgent(*healthTO, hcLimits, log, reg)
	defer nodeHealth.Services.Close()
	if err := serveHTTP(ctx, *healthzAddr, nodeHealth.Node.Handler(), health.NewConnLimit("healthz", healthzLimits), reg, log); err != nil {
		return fmt.Errorf("--healthz-bind-address: %w", err)
	}
	if tlsSrc != nil {
		reg.MustRegister(tlsmetrics.Collector{tlsSrc})
	}
	if err := serveHTTP(ctx, *metricsAddr, common.MetricsHandler(reg, *metricsAddr, log), health.NewConnLimit("metrics", healthzLimits), reg, log); err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}

	// Someone flushing the ruleset (an nftables service reloading) takes
	// the node's tables with it: put them back within seconds, not at
	// the next resync.
	repairs := prometheus.NewCounter(prometheus.CounterOpts{Name: "weir_datapath_table_repairs_total",
		Help: "Times the agent found its nftables tables gone (the ruleset flushed or a table deleted by someone else) and rewrote them from the last state."})
	reg.MustRegister(repairs)
	go repairTables(ctx, dp, repairs, log)

	observers := syncer.Observers{nodeHealth}
	if *passFlows {
		movedReport := flows.NewReporter(moved, dp)
		reg.MustRegister(movedReport)
		go movedReport.Run(ctx)
		observers = append(observers, movedReport)
	}
	// A drained node counts the external connections it still serves and
	// ends them at the drain's deadline.
	drainer := drain.New(drain.Netlink{}, clock.RealClock{}, log.With("component", "drain"), reg)
	go drainer.Run(ctx)
	observers = append(observers, drainer)
	if *bgpASN != 0 {
		// Rules left by the agent before this one still forward: tell
		// graceful-restart routers so, and they keep the routes they hold.
		cfg := bgpspeaker.Config{ASN: uint32(*bgpASN), Restarting: dp.Forwarding(ctx), Log: log.With("component", "bgp")}
		if cfg.RouterID, err = bgpspeaker.RouterID(*bgpRouterID); err != nil {
			return fmt.Errorf("--bgp-router-id: %w", err)
		}
		if cfg.Peers, err = bgpspeaker.ParsePeers(*bgpPeers); err != nil {
			return fmt.Errorf("--bgp-peers: %w", err)
		}
		speaker, err := bgpspeaker.Start(ctx, cfg)
		if err != nil {
			return err
		}
		reg.MustRegister(speaker.Collector())
		defer func() {
			if ctx.Err() != nil && speaker.GracefulRestart() {
				// Stopped (SIGTERM: a restart, an upgrade): the sessions
				// end with the process, without a NOTIFICATION, so that
				// graceful-restart routers keep forwarding to this node
				// on the rules left in place. Drain a node to take it out.
				log.Info("leaving BGP sessions to graceful restart: routers keep this node's routes for the restart time")
				return
			}
			speaker.Close()
		}()
		observers = append(observers, bgp.NewAnnouncer(speaker, nodeHealth.Node.Healthy, log.With("component", "bgp")))
	}
	member, err := members.Start(*nodeName, nil, log.With("component", "membership"))
	if err != nil {
		return err
	}
	if member != nil {
		// A stopping agent takes its node out of the load balancers at
		// once: its health answers stop too.
		defer member.Leave()
	}
	// L2 addresses: the node answers ARP and NDP for those it holds a
	// lease on, asked of the server that decides the owners over a
	// connection of its own (with replicas, the leader's).
	leaseConn, err := dial.NewServers(*serverAddr, tlsSrc, dialOpts...)
	if err != nil {
		return err
	}
	defer leaseConn.Close()
	responder := l2.New(log.With("component", "l2"))
	defer responder.Close()
	leases := l2.NewLeases(clock.RealClock{}, responder.Set)
	responder.Valid(leases.Valid)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_l2_answered_addresses", Help: "L2 addresses this node answers ARP and NDP for now (it holds their leases).",
	}, func() float64 { return float64(len(leases.Held())) }))
	asker := l2.NewAsker(leaseConn, *nodeName, leases, clock.RealClock{}, log.With("component", "l2"))
	observers = append(observers, asker)
	askerDone := make(chan struct{})
	go func() { asker.Run(ctx); close(askerDone) }()
	// On SIGTERM the node's L2 addresses are given up (and the server
	// told) before the agent goes.
	defer func() { stop(); <-askerDone }()

	s := syncer.New(syncer.Config{NodeName: *nodeName, AgentVersion: version, ResyncPeriod: *resync, Metrics: reg}, conn, faults.Wrap(applier, log), observers, log)
	log.Info("starting", "servers", *serverAddr, "server", conn.Current(), "tls", !*plain, "version", version)
	if err := s.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	// On exit the rules stay: forwarding must not stop because the agent
	// restarts. Removing Weir is `nft delete table ip weir; nft delete table ip6 weir`.
	log.Info("stopped; nftables rules left in place")
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
