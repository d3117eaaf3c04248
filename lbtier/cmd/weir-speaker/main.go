// Command weir-speaker is the dedicated load-balancer tier: it runs on LB
// hosts beside the routers and announces every load-balancer IP with the
// nodes that should receive it as next hops, from the server's targets, its
// own health probes and the failure-detection membership.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
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
		fmt.Fprintln(os.Stderr, "weir-speaker:", err)
		os.Exit(1)
	}
}

func run() error {
	hostname, _ := os.Hostname()
	var (
		serverAddr  = flag.String("server", "127.0.0.1:7443", "comma-separated HOST:PORT of weir-server's replicas (a DNS name counts as all its addresses); the speaker is on one at a time and moves to the next when it goes away")
		name        = flag.String("name", hostname, "this speaker's name (its certificate's CommonName)")
		plain       = flag.Bool("insecure", false, "talk to the server in plain text (lab and demo only)")
		caFile      = flag.String("ca-file", "", "CA that signed the server's certificate")
		certFile    = flag.String("cert-file", "", "this speaker's client certificate (PEM, role speaker)")
		keyFile     = flag.String("key-file", "", "this speaker's private key (PEM)")
		asn         = flag.Uint("bgp-asn", 0, "the speaker's AS (required)")
		routerID    = flag.String("bgp-router-id", "", "BGP router ID (default: the first IPv4 address of the host)")
		peers       = flag.String("bgp-peers", "", "comma-separated routers, ADDRESS[:PORT]/ASN (required)")
		restartTime = flag.Duration("graceful-restart-time", 120*time.Second, "how long routers keep this speaker's routes while it restarts (0: no graceful restart)")
		addPath     = flag.Bool("add-path", true, "send every next hop of a load-balancer IP (ADD-PATH); routers that do not agree hear one")
		interval    = flag.Duration("probe-interval", time.Second, "how often each node's health-check port is probed")
		timeout     = flag.Duration("probe-timeout", 500*time.Millisecond, "how long a probe may take")
		rise        = flag.Int("probe-rise", 2, "successful probes in a row that bring a node back")
		fall        = flag.Int("probe-fall", 2, "failed probes in a row that take a node out")
		metricsAddr = flag.String("metrics-bind-address", "127.0.0.1:7446", "address of /metrics (Prometheus), and of /debug/pprof/ with --profiling")
		members     membership.Flags
	)
	members.AddFlags(flag.CommandLine, "comma-separated ADDRESS:PORT of members to join (agents or other speakers)")
	common := daemon.AddFlags(flag.CommandLine)
	flag.Parse()
	log, done, err := common.Start("weir-speaker", version, os.Stdout, os.Stderr)
	if done || err != nil {
		return err
	}
	log = log.With("speaker", *name)
	switch {
	case *name == "":
		return fmt.Errorf("--name: required")
	case *asn == 0 || *asn > 1<<32-1:
		return fmt.Errorf("--bgp-asn: required, 1-4294967295")
	case *interval <= 0 || *timeout <= 0 || *timeout > *interval:
		return fmt.Errorf("--probe-timeout: must be above 0 and at most --probe-interval")
	case *rise < 1 || *fall < 1:
		return fmt.Errorf("--probe-rise and --probe-fall: at least 1")
	}
	bgpCfg := bgpspeaker.Config{ASN: uint32(*asn), GracefulRestart: *restartTime, AddPath: *addPath, Log: log.With("component", "bgp")}
	if bgpCfg.RouterID, err = bgpspeaker.RouterID(*routerID); err != nil {
		return fmt.Errorf("--bgp-router-id: %w", err)
	}
	routers, err := bgpspeaker.ParsePeers(*peers)
	if err != nil {
		return fmt.Errorf("--bgp-peers: %w", err)
	}
	if len(routers) == 0 {
		return fmt.Errorf("--bgp-peers: at least one router is required")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var tlsSrc *tlsconfig.Source
	if !*plain {
		if tlsSrc, err = tlsconfig.Load(tlsconfig.Files{CA: *caFile, Cert: *certFile, Key: *keyFile}, tlsconfig.Options{Use: "speaker", Log: log}); err != nil {
			return err
		}
		reg.MustRegister(tlsmetrics.Collector{tlsSrc})
	}
	mln, err := net.Listen("tcp", *metricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	go http.Serve(mln, common.MetricsHandler(reg, *metricsAddr, log))
	conn, err := dial.NewServers(*serverAddr, tlsSrc)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := weirv1.NewLoadBalancerTierServiceClient(conn)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Peers come last (below): routers hear nothing until the speaker
	// knows what to announce.
	b, err := bgpspeaker.Start(ctx, bgpCfg)
	if err != nil {
		return err
	}
	reg.MustRegister(b.Collector())
	defer b.Close()
	sp := lbtier.New(lbtier.Config{
		Name:   *name,
		Probes: lbtier.ProbeConfig{Interval: *interval, Timeout: *timeout, Rise: *rise, Fall: *fall},
		Report: lbtier.Reporter(client, log), Log: log,
	}, b)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_lbtier_announced_paths", Help: "Paths (a load-balancer IP through one node) the speaker announces now.",
	}, func() float64 { return float64(len(sp.Announced())) }))
	member, err := members.Start("speaker:"+*name, func(n string, alive bool) {
		if !isSpeaker(n) {
			sp.MemberChanged(n, alive)
		}
	}, log.With("component", "membership"))
	if err != nil {
		return err
	}
	if member != nil {
		defer member.Leave()
	}
	go lbtier.Follow(ctx, conn, sp, log)
	log.Info("starting", "servers", *serverAddr, "server", conn.Current(), "tls", !*plain, "routers", len(routers), "version", version)
	// After a restart the routers still hold the old paths (graceful
	// restart) and replace them with what the speaker sends before its
	// End-of-RIB: wait until that is the real plan.
	if err := sp.WaitReady(ctx); err != nil {
		return nil
	}
	if err := b.SetPeers(ctx, routers); err != nil {
		return err
	}
	log.Info("targets known; peering with the routers")
	sp.Run(ctx)
	log.Info("stopped")
	return nil
}

func isSpeaker(member string) bool { return strings.HasPrefix(member, "speaker:") }
