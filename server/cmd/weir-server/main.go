// Command weir-server is Weir's central server: it keeps the cluster state
// orchestrators declare, computes what every node must forward, and streams
// it to each node's agent.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/server"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "weir-server:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		listen   = flag.String("listen", "127.0.0.1:7443", "address of the gRPC API (agents and orchestrators)")
		dataDir  = flag.String("data-dir", "/var/lib/weir", "folder of the persistent store")
		insecure = flag.Bool("insecure", false, "serve plain text instead of TLS (lab and demo only)")
		certFile = flag.String("tls-cert-file", "", "server certificate (PEM)")
		keyFile  = flag.String("tls-key-file", "", "server private key (PEM)")
		caFile   = flag.String("client-ca-file", "", "CA that signs agent and operator certificates; requires mTLS")
		logLevel = flag.String("log-level", "info", "debug, info, warn or error")
		minSync  = flag.Duration("min-sync-period", 50*time.Millisecond, "least time between two rounds of changes to agents; a lone change goes out at once")
		metrics  = flag.String("metrics-bind-address", "127.0.0.1:7444", "address of /metrics (Prometheus) and /debug/pprof/")
	)
	flag.Parse()
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	var tlsCfg *tls.Config
	if !*insecure {
		var err error
		if tlsCfg, err = tlsconfig.Server(tlsconfig.Files{Cert: *certFile, Key: *keyFile, CA: *caFile}); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(server.Config{DataDir: *dataDir, TLS: tlsCfg, Log: log, MinSyncPeriod: *minSync, Metrics: reg})
	if err != nil {
		return err
	}
	mln, err := net.Listen("tcp", *metrics)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	// Metrics and profiles share one listener, on loopback unless asked.
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go http.Serve(mln, mux)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("serving", "address", lis.Addr().String(), "data_dir", *dataDir, "tls", tlsCfg != nil)
	return srv.Serve(ctx, lis)
}
