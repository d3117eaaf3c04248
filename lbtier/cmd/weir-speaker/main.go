// Command weir-speaker is the dedicated load-balancer tier: it runs on LB
// hosts beside the routers and announces every load-balancer IP with the
// nodes that should receive it as next hops, from the server's targets, its
// own health probes and the failure-detection membership.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/weirlb/weir/internal/bgpnumbers"
	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/daemon"
	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/membership"
	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/internal/tlsconfig/tlsmetrics"
	"github.com/weirlb/weir/lbtier"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// version is set at build time.
var version = "dev"

func main() {
	if err := run(); err != nil {
		daemon.Exit("weir-speaker", err)
	}
}

func run() error {
	o := newOptions(flag.CommandLine)
	flag.Parse()
	log, done, err := o.common.Start("weir-speaker", version, os.Stdout, os.Stderr)
	if done || err != nil {
		return err
	}
	log = log.With("speaker", o.name)
	s := &speaker{o: o, log: log}
	if s.bgpCfg, s.routers, err = o.settings(log); err != nil {
		return err
	}
	defer s.undo.Run()
	for _, start := range []func() error{
		s.loadTLS,       // the certificate, reloaded when it changes
		s.serveMetrics,  // /metrics
		s.dialServer,    // the connection to the server's replicas
		s.catchSignals,  // the context SIGINT and SIGTERM end
		s.startBGP,      // the BGP speaker, with no router yet
		s.plan,          // what to announce, from targets and probes
		s.joinMembers,   // the failure-detection membership
		s.followTargets, // the server's targets
	} {
		if err := start(); err != nil {
			return err
		}
	}
	return s.announce()
}

// options are the speaker's flags.
type options struct {
	common  *daemon.Flags
	server  dial.Flags
	members membership.Flags
	name    string

	asn               uint
	routerID, peers   string
	restartTime       time.Duration
	addPath           bool
	interval, timeout time.Duration
	rise, fall        int
	metricsAddr       string
	peerFlags         bgpspeaker.PeerFlags
}

// newOptions registers the speaker's flags on fs.
func newOptions(fs *flag.FlagSet) *options {
	hostname, _ := os.Hostname()
	o := &options{server: dial.Flags{Who: "speaker", Moves: " and moves to the next when it goes away", CertRole: "speaker"}}
	o.server.Register(fs)
	fs.StringVar(&o.name, "name", hostname, "this speaker's name (its certificate's CommonName)")
	fs.UintVar(&o.asn, "bgp-asn", 0, "the speaker's AS (required)")
	fs.StringVar(&o.routerID, "bgp-router-id", "", "BGP router ID (default: the first IPv4 address of the host)")
	fs.StringVar(&o.peers, "bgp-peers", "", "comma-separated routers, ADDRESS[:PORT]/ASN (required)")
	o.peerFlags.Register(fs)
	fs.DurationVar(&o.restartTime, "graceful-restart-time", 120*time.Second, "how long routers keep this speaker's routes while it restarts (0: no graceful restart)")
	fs.BoolVar(&o.addPath, "add-path", true, "send every next hop of a load-balancer IP (ADD-PATH); routers that do not agree hear one")
	fs.DurationVar(&o.interval, "probe-interval", time.Second, "how often each node's health-check port is probed")
	fs.DurationVar(&o.timeout, "probe-timeout", 500*time.Millisecond, "how long a probe may take")
	fs.IntVar(&o.rise, "probe-rise", 2, "successful probes in a row that bring a node back")
	fs.IntVar(&o.fall, "probe-fall", 2, "failed probes in a row that take a node out")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:7446", "address of /metrics (Prometheus), and of /debug/pprof/ with --profiling")
	o.members.AddFlags(fs, "comma-separated ADDRESS:PORT of members to join (agents or other speakers)")
	o.common = daemon.AddFlags(fs)
	return o
}

// settings checks the flags and reads the BGP speaker's settings and
// the routers.
func (o *options) settings(log *slog.Logger) (bgpspeaker.Config, []bgpspeaker.Peer, error) {
	cfg := bgpspeaker.Config{ASN: uint32(o.asn), GracefulRestart: o.restartTime, AddPath: o.addPath, Log: log.With("component", "bgp")}
	switch {
	case o.name == "":
		return cfg, nil, fmt.Errorf("--name: required")
	case o.asn == 0 || o.asn > 1<<32-1:
		return cfg, nil, fmt.Errorf("--bgp-asn: required, 1-4294967295")
	case bgpnumbers.ValidateASN(uint32(o.asn)) != nil:
		return cfg, nil, fmt.Errorf("--bgp-asn: %w", bgpnumbers.ValidateASN(uint32(o.asn)))
	case o.interval <= 0 || o.timeout <= 0 || o.timeout > o.interval:
		return cfg, nil, fmt.Errorf("--probe-timeout: must be above 0 and at most --probe-interval")
	case o.rise < 1 || o.fall < 1:
		return cfg, nil, fmt.Errorf("--probe-rise and --probe-fall: at least 1")
	}
	var err error
	if cfg.RouterID, err = bgpspeaker.RouterID(o.routerID); err != nil {
		return cfg, nil, fmt.Errorf("--bgp-router-id: %w", err)
	}
	routers, err := bgpspeaker.ParsePeers(o.peers)
	if err != nil {
		return cfg, nil, fmt.Errorf("--bgp-peers: %w", err)
	}
	if len(routers) == 0 {
		return cfg, nil, fmt.Errorf("--bgp-peers: at least one router is required")
	}
	if err := o.peerFlags.Apply(routers); err != nil {
		return cfg, nil, err
	}
	return cfg, routers, nil
}

// speaker is the running speaker: its parts, which run starts in order,
// and what each leaves to undo when the speaker stops.
type speaker struct {
	o       *options
	log     *slog.Logger
	bgpCfg  bgpspeaker.Config
	routers []bgpspeaker.Peer

	reg  *prometheus.Registry
	tls  *tlsconfig.Source
	conn *dial.Servers
	ctx  context.Context // ends at SIGINT or SIGTERM
	bgp  *bgpspeaker.GoBGP
	lb   *lbtier.Speaker // the plan: which paths to announce
	undo daemon.Undo
}

// loadTLS loads the speaker's certificate, unless --insecure.
func (s *speaker) loadTLS() error {
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var err error
	if s.tls, err = s.o.server.TLS(s.log); err != nil {
		return err
	}
	if s.tls != nil {
		s.reg.MustRegister(tlsmetrics.Collector{s.tls})
	}
	return nil
}

// serveMetrics serves /metrics on --metrics-bind-address.
func (s *speaker) serveMetrics() error {
	mln, err := net.Listen("tcp", s.o.metricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	go http.Serve(mln, s.o.common.MetricsHandler(s.reg, s.o.metricsAddr, s.log))
	return nil
}

// dialServer connects to the server's replicas.
func (s *speaker) dialServer() error {
	var err error
	if s.conn, err = s.o.server.Dial(s.tls); err != nil {
		return err
	}
	s.undo.Add(func() { s.conn.Close() })
	return nil
}

// catchSignals makes the context that SIGINT and SIGTERM end.
func (s *speaker) catchSignals() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	s.ctx = ctx
	s.undo.Add(stop)
	return nil
}

// startBGP starts the BGP speaker. Peers come last (announce): routers
// hear nothing until the speaker knows what to announce.
func (s *speaker) startBGP() error {
	b, err := bgpspeaker.Start(s.ctx, s.bgpCfg)
	if err != nil {
		return err
	}
	s.reg.MustRegister(b.Collector())
	s.undo.Add(b.Close)
	s.bgp = b
	return nil
}

// plan makes what decides the paths announced.
func (s *speaker) plan() error {
	client := weirv1.NewLoadBalancerTierServiceClient(s.conn)
	sp := lbtier.New(lbtier.Config{
		Name:   s.o.name,
		Probes: lbtier.ProbeConfig{Interval: s.o.interval, Timeout: s.o.timeout, Rise: s.o.rise, Fall: s.o.fall},
		Report: lbtier.Reporter(client, s.log), Log: s.log,
	}, s.bgp)
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_lbtier_announced_paths", Help: "Paths (a load-balancer IP through one node) the speaker announces now.",
	}, func() float64 { return float64(len(sp.Announced())) }))
	s.lb = sp
	return nil
}

// joinMembers joins the failure-detection membership, whose news of the
// nodes (not of other speakers) the plan takes.
func (s *speaker) joinMembers() error {
	member, err := s.o.members.Start("speaker:"+s.o.name, func(n string, alive bool) {
		if !isSpeaker(n) {
			s.lb.MemberChanged(n, alive)
		}
	}, s.log.With("component", "membership"))
	if err != nil {
		return err
	}
	if member != nil {
		s.undo.Add(member.Leave)
	}
	return nil
}

// followTargets follows the server's targets.
func (s *speaker) followTargets() error {
	go lbtier.Follow(s.ctx, s.conn, s.lb, s.log)
	return nil
}

// announce peers with the routers once the targets are known, and
// announces until SIGTERM.
func (s *speaker) announce() error {
	s.log.Info("starting", "servers", s.o.server.Servers, "server", s.conn.Current(), "tls", !s.o.server.Insecure, "routers", len(s.routers), "version", version)
	// After a restart the routers still hold the old paths (graceful
	// restart) and replace them with what the speaker sends before its
	// End-of-RIB: wait until that is the real plan.
	if err := s.lb.WaitReady(s.ctx); err != nil {
		return nil
	}
	if err := s.bgp.SetPeers(s.ctx, s.routers); err != nil {
		return err
	}
	s.log.Info("targets known; peering with the routers")
	s.lb.Run(s.ctx)
	s.log.Info("stopped")
	return nil
}

func isSpeaker(member string) bool { return strings.HasPrefix(member, "speaker:") }
