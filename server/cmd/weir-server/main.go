// Command weir-server is Weir's central server: it keeps the cluster state
// orchestrators declare, computes what every node must forward, and streams
// it to each node's agent.
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/weirlb/weir/internal/daemon"
	"github.com/weirlb/weir/internal/iprange"
	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/internal/tlsconfig/tlsmetrics"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/limits"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
	"github.com/weirlb/weir/server/webhook"
)

// version is set at build time.
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "store" {
		if err := storeCommand(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "weir-server store:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "certs" {
		if err := certsCommand(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "weir-server certs:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		daemon.Exit("weir-server", err)
	}
}

// run starts the server's parts in order: the flags, the configuration
// they give (the API's TLS, the store, the service rules, etcd,
// Kubernetes), the server, its listeners (metrics, the admission webhook,
// the API), then serves until a signal ends it.
func run() error {
	f := addServerFlags(flag.CommandLine)
	common := daemon.AddFlags(flag.CommandLine)
	flag.Parse()
	log, done, err := common.Start("weir-server", version, os.Stdout, os.Stderr)
	if done || err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg, certSources, err := f.config(log, reg)
	if err != nil {
		return err
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	mln, err := net.Listen("tcp", *f.metrics)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	webhookTLS, err := f.startWebhook(srv, log)
	if err != nil {
		return err
	}
	if webhookTLS != nil {
		certSources = append(certSources, webhookTLS)
	}
	reg.MustRegister(certSources)
	go http.Serve(mln, withProbes(common.MetricsHandler(reg, *f.metrics, log), srv.Ready))
	lis, err := net.Listen("tcp", *f.listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Etcd != nil {
		log.Info("serving", "address", lis.Addr().String(), "etcd", *f.etcd.endpoints, "replica", cfg.Replica, "tls", cfg.TLS != nil, "version", version)
	} else {
		log.Info("serving", "address", lis.Addr().String(), "data_dir", *f.dataDir, "tls", cfg.TLS != nil, "version", version)
	}
	err = srv.Serve(ctx, lis)
	if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		// SIGTERM is how the kubelet and systemd stop the server: the
		// signal ends Serve, and is no failure.
		log.Info("stopped", "reason", err)
		return nil
	}
	return err
}

// serverFlags are the server's flags (daemon.AddFlags adds the common
// ones).
type serverFlags struct {
	listen         *string
	dataDir        *string
	initStore      *bool
	insecure       *bool
	insecureRemote *bool
	certFile       *string
	keyFile        *string
	caFile         *string
	minSync        *time.Duration
	metrics        *string
	kube           *bool
	kubecfg        *string
	resFile        *string
	resAll         *bool
	proxyNm        *string
	lbClass        *string
	webhookAddr    *string
	webhookCert    *string
	webhookKey     *string
	webhookCA      *string
	webhookNames   *string
	lbDefault      *bool
	apiRate        *float64
	apiWatch       *int
	apiConns       *int
	apiInFlight    *int
	npRange        *string
	etcd           etcdFlags
	replicaName    *string
	leaderLease    *time.Duration
	leaderElect    *bool
	leLease        *time.Duration
	leRenew        *time.Duration
	leRetry        *time.Duration
	leNamespace    *string
	svcRanges      *string
	l2TTL          *time.Duration
	l2Margin       *time.Duration
	agentNeedsTok  *bool
	agentTokAud    *string
	agentTokSA     *string
	extCIDRs       *string
}

func addServerFlags(fs *flag.FlagSet) *serverFlags {
	return &serverFlags{
		listen:         fs.String("listen", "127.0.0.1:7443", "address of the gRPC API (agents and orchestrators)"),
		dataDir:        fs.String("data-dir", "/var/lib/weir", "folder of the persistent store"),
		initStore:      fs.Bool("init", false, "start with an empty store where the database was lost (missing or empty, in a folder that had one); never over a store that holds anything"),
		insecure:       fs.Bool("insecure", false, "serve plain text instead of TLS, on a loopback address only (lab and demo)"),
		insecureRemote: fs.Bool("insecure-allow-remote", false, "with --insecure, serve plain text on a non-loopback address too: anyone who reaches it can read and change everything"),
		certFile:       fs.String("tls-cert-file", "", "server certificate (PEM)"),
		keyFile:        fs.String("tls-key-file", "", "server private key (PEM)"),
		caFile:         fs.String("client-ca-file", "", "CA that signs agent and operator certificates; requires mTLS"),
		minSync:        fs.Duration("min-sync-period", 50*time.Millisecond, "least time between two rounds of changes to agents; a lone change goes out at once"),
		metrics:        fs.String("metrics-bind-address", "127.0.0.1:7444", "address of /metrics (Prometheus), and of /debug/pprof/ with --profiling"),
		kube:           fs.Bool("kubernetes", false, "mirror a Kubernetes cluster's services, endpoint slices and nodes (in-cluster config unless --kubeconfig)"),
		kubecfg:        fs.String("kubeconfig", "", "kubeconfig of the cluster to mirror; implies --kubernetes"),
		resFile:        fs.String("resources-file", "", "YAML file of AddressPool and BgpPeer documents (lbctl's format) the server keeps applied, re-read when it changes (a mounted ConfigMap)"),
		resAll:         fs.Bool("resources-file-allow-removing-all", false, "apply a resources file even when it is empty or removes every address pool in use (refused by default: a half-written file looks like that)"),
		proxyNm:        fs.String("service-proxy-name", "", "handle only Kubernetes services labelled service.kubernetes.io/service-proxy-name=NAME (default: only unlabelled ones, as kube-proxy)"),
		lbClass:        fs.String("load-balancer-class", kubernetes.DefaultLoadBalancerClass, "assign and announce the addresses of Kubernetes LoadBalancer services whose spec.loadBalancerClass is CLASS; another controller's services are forwarded, never touched"),
		webhookAddr:    fs.String("webhook-bind-address", "", "with --kubernetes: serve the apiserver's admission reviews of weir.dev objects (the ValidatingWebhookConfiguration weir.dev) over HTTPS here, e.g. [$(POD_IP)]:7445; empty: not served"),
		webhookCert:    fs.String("webhook-cert-file", "", "the admission webhook's certificate (PEM)"),
		webhookKey:     fs.String("webhook-key-file", "", "the admission webhook's private key (PEM)"),
		webhookCA:      fs.String("webhook-client-ca-file", "", "the admission webhook requires a client certificate this CA signed (PEM), the one the apiserver's AdmissionConfiguration presents; empty: any caller that reaches the address is answered"),
		webhookNames:   fs.String("webhook-client-names", "", "with --webhook-client-ca-file: comma-separated names (CommonName or DNS name) of the client certificates the webhook takes; empty: any the CA signed"),
		lbDefault:      fs.Bool("default-load-balancer", false, "Weir is the cluster's default load balancer: also handle LoadBalancer services with no spec.loadBalancerClass (leave false beside MetalLB or another controller that handles them)"),
		apiRate:        fs.Float64("api-calls-per-second", limits.DefaultCallsPerSecond, "each caller's rate of API calls (bursts of twice as many); a caller over it waits, others do not; 0: no limit"),
		apiWatch:       fs.Int("api-watches-per-caller", limits.DefaultMaxWatchesPerCaller, "most Watch streams one caller may hold open"),
		apiConns:       fs.Int("api-connections-per-caller", limits.DefaultMaxConnectionsPerCaller, "most connections one client certificate may hold open; more are closed after their handshake"),
		apiInFlight:    fs.Int("api-calls-in-flight-per-caller", limits.DefaultMaxCallsInFlightPerCaller, "most unary calls one client certificate may have in flight (each holds its request, up to 4 MiB); more are refused before they are read"),
		npRange:        fs.String("service-node-port-range", "30000-32767", "node ports and health-check node ports of native services come from this range (as the apiserver's flag)"),
		etcd:           addEtcdFlags(fs),
		replicaName:    fs.String("replica-name", "", "this replica's name among the others sharing etcd (default: host name and process ID)"),
		leaderLease:    fs.Duration("leader-lease", 2*time.Second, "with etcd: how long a replica that died keeps its leadership (address assignment, the sources' writes) and its agents' status; whole seconds"),
		leaderElect:    fs.Bool("leader-elect", false, "with --kubernetes: run as one of several replicas, each with its own --data-dir, that mirror the cluster; only the holder of a coordination.k8s.io Lease assigns addresses and writes them to Services"),
		leLease:        fs.Duration("leader-elect-lease-duration", 15*time.Second, "with --leader-elect: how long a replica that died keeps the Lease"),
		leRenew:        fs.Duration("leader-elect-renew-deadline", 10*time.Second, "with --leader-elect: how long the leader tries to renew the Lease before it stops leading"),
		leRetry:        fs.Duration("leader-elect-retry-period", 2*time.Second, "with --leader-elect: how often replicas try to take or renew the Lease"),
		leNamespace:    fs.String("leader-elect-namespace", "", "with --leader-elect: namespace of the Lease "+kubernetes.LeaseName+" (default: the pod's own, else "+kubernetes.DefaultNamespace+")"),
		svcRanges:      fs.String("service-cluster-ip-range", "10.96.0.0/12,fd00:96::/108", "comma-separated ranges (one per family) the cluster IPs of native services come from, besides the ServiceCidr resources (as the apiserver's flag); none may hold an address of this host"),
		l2TTL:          fs.Duration("l2-lease-duration", server.DefaultL2LeaseTTL, "how long a node's lease on an L2 address lasts from its ask (it asks four times as often); an owner that fails is replaced within about this plus --l2-lease-margin"),
		l2Margin:       fs.Duration("l2-lease-margin", server.DefaultL2LeaseMargin, "how much longer than a lease the server waits before it gives an L2 address whose owner did not give it up to another node: room for the two clocks' rates"),
		agentNeedsTok:  fs.Bool("agents-need-node-tokens", false, "refuse agents on the shared certificate (CommonName "+certs.FleetAgentName+") that present no node token: each agent then acts for its own node only (with --kubernetes; the Helm chart and manifests set it). Without it such an agent may act for any node, which is deprecated"),
		agentTokAud:    fs.String("agent-token-audience", kubernetes.DefaultAgentTokenAudience, "with --kubernetes: the audience of the agents' node tokens (their projected service-account token volume's)"),
		agentTokSA:     fs.String("agent-service-account", "", "with --kubernetes: namespace/name of the agents' service account, whose pod-bound tokens are node tokens (default: the server's namespace/weir-agent)"),
		extCIDRs:       fs.String("allowed-external-ip-cidrs", "", "comma-separated CIDRs external IPs may come from (default none: a service's external IP takes an address's traffic on every node; Kubernetes recommends denying them)"),
	}
}

// config is the server's configuration, checked in the order its parts
// start, and the certificate sources whose expiry /metrics shows.
func (f *serverFlags) config(log *slog.Logger, metrics prometheus.Registerer) (server.Config, tlsmetrics.Collector, error) {
	var certSources tlsmetrics.Collector
	tlsSrc, err := f.apiTLS(log)
	if err != nil {
		return server.Config{}, nil, err
	}
	if tlsSrc != nil {
		certSources = append(certSources, tlsSrc)
	}
	if *f.initStore && *f.etcd.endpoints == "" {
		if err := store.Init(*f.dataDir); err != nil {
			return server.Config{}, nil, fmt.Errorf("--init: %w", err)
		}
	}
	rules, err := f.serviceRules()
	if err != nil {
		return server.Config{}, nil, err
	}
	cfg := server.Config{DataDir: *f.dataDir, TLS: tlsSrc, Log: log, MinSyncPeriod: *f.minSync, Metrics: metrics, Version: version,
		ResourcesFile: *f.resFile, ResourcesFileAllowRemovingAll: *f.resAll, ServiceRules: &rules, Limits: f.limits(),
		L2LeaseTTL: *f.l2TTL, L2LeaseMargin: *f.l2Margin, SharedAgentCertificateNeedsToken: *f.agentNeedsTok}
	if *f.l2TTL < 100*time.Millisecond || *f.l2Margin < 0 || *f.l2Margin > *f.l2TTL {
		return server.Config{}, nil, fmt.Errorf("--l2-lease-duration %v, --l2-lease-margin %v: the lease at least 100ms, the margin between 0 and the lease", *f.l2TTL, *f.l2Margin)
	}
	var etcdTLS *tlsconfig.Source
	if cfg.Etcd, etcdTLS, err = f.etcd.config(log); err != nil {
		return server.Config{}, nil, err
	}
	if etcdTLS != nil {
		certSources = append(certSources, etcdTLS)
	}
	if cfg.Etcd != nil {
		cfg.Replica, cfg.LeaseTTL = *f.replicaName, *f.leaderLease
		if *f.initStore {
			return server.Config{}, nil, errors.New("--init is for the embedded store: an etcd cluster's state is restored from a snapshot (docs/ha.md)")
		}
	}
	if cfg.Kubernetes, err = f.kubernetes(cfg.Etcd != nil); err != nil {
		return server.Config{}, nil, err
	}
	return cfg, certSources, nil
}

// apiTLS is the API's TLS, nil with --insecure, which serves plain text on
// loopback unless the operator named the risk.
func (f *serverFlags) apiTLS(log *slog.Logger) (*tlsconfig.Source, error) {
	if err := checkInsecure(*f.insecure, *f.certFile, *f.keyFile, *f.caFile); err != nil {
		return nil, err
	}
	if err := checkPlainTextListen(*f.insecure, *f.insecureRemote, *f.listen); err != nil {
		return nil, err
	}
	if *f.insecure {
		if !loopback(*f.listen) {
			log.Warn("serving the API in plain text, without authentication, on a non-loopback address: anyone who reaches it can read and change everything; use TLS outside a lab", "listen", *f.listen)
		}
		return nil, nil
	}
	if *f.caFile == "" {
		return nil, fmt.Errorf("--client-ca-file is required: every caller authenticates with a certificate (or run with --insecure)")
	}
	if *f.certFile == "" || *f.keyFile == "" {
		return nil, errors.New("--tls-cert-file and --tls-key-file are required (or run with --insecure)")
	}
	return tlsconfig.Load(tlsconfig.Files{Cert: *f.certFile, Key: *f.keyFile, CA: *f.caFile}, tlsconfig.Options{Use: "server", Log: log})
}

// serviceRules are the native services' node-port range, allowed external
// IPs and service ranges.
func (f *serverFlags) serviceRules() (registry.ServiceRules, error) {
	rules := registry.DefaultServiceRules()
	var err error
	if rules.NodePorts, err = registry.ParsePortRange(*f.npRange); err != nil {
		return rules, fmt.Errorf("--service-node-port-range: %w", err)
	}
	for _, s := range strings.FieldsFunc(*f.extCIDRs, func(r rune) bool { return r == ',' }) {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || p.Masked() != p {
			return rules, fmt.Errorf("--allowed-external-ip-cidrs: %q is not a CIDR", s)
		}
		rules.ExternalIPCIDRs = append(rules.ExternalIPCIDRs, p)
	}
	if rules.ServiceRanges, rules.ServerAddrs, err = serviceRanges(*f.svcRanges); err != nil {
		return rules, fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	return rules, nil
}

// limits are each caller's bounds on the API; a rate of 0 is no limit.
func (f *serverFlags) limits() limits.Config {
	l := limits.Config{CallsPerSecond: *f.apiRate, Burst: int(2 * *f.apiRate), MaxWatchesPerCaller: *f.apiWatch,
		MaxConnectionsPerCaller: *f.apiConns, MaxCallsInFlightPerCaller: *f.apiInFlight}
	if *f.apiRate == 0 {
		l.CallsPerSecond = -1
	}
	return l
}

// kubernetes is the configuration of the cluster to mirror, nil without
// --kubernetes or --kubeconfig; etcd tells whether replicas share etcd.
func (f *serverFlags) kubernetes(etcd bool) (*kubernetes.Config, error) {
	if errs := validation.IsQualifiedName(*f.lbClass); len(errs) > 0 {
		return nil, fmt.Errorf("--load-balancer-class %q: %s", *f.lbClass, strings.Join(errs, "; "))
	}
	var kc *kubernetes.Config
	if *f.kube || *f.kubecfg != "" {
		kc = &kubernetes.Config{Kubeconfig: *f.kubecfg, ProxyName: *f.proxyNm, Resync: 10 * time.Minute,
			Classes:     kubernetes.Classes{Class: *f.lbClass, Default: *f.lbDefault},
			AgentTokens: kubernetes.AgentTokens{Audience: *f.agentTokAud, ServiceAccount: *f.agentTokSA}}
	}
	if err := checkLeaderElect(*f.leaderElect, kc != nil, etcd); err != nil {
		return nil, err
	}
	if *f.leaderElect {
		kc.LeaderElection = &kubernetes.LeaderElection{
			Namespace: *f.leNamespace, Name: kubernetes.LeaseName,
			LeaseDuration: *f.leLease, RenewDeadline: *f.leRenew, RetryPeriod: *f.leRetry,
		}
	}
	return kc, nil
}

// startWebhook serves the admission webhook when --webhook-bind-address
// asks for it, until the process ends, and returns its certificate
// source (nil when not served).
func (f *serverFlags) startWebhook(srv *server.Server, log *slog.Logger) (*tlsconfig.Source, error) {
	if *f.webhookAddr == "" {
		return nil, nil
	}
	if srv.Admission() == nil || *f.webhookCert == "" || *f.webhookKey == "" {
		return nil, errors.New("--webhook-bind-address needs --kubernetes, --webhook-cert-file and --webhook-key-file")
	}
	var names []string
	for _, n := range strings.Split(*f.webhookNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) > 0 && *f.webhookCA == "" {
		return nil, errors.New("--webhook-client-names needs --webhook-client-ca-file")
	}
	src, err := tlsconfig.Load(tlsconfig.Files{Cert: *f.webhookCert, Key: *f.webhookKey, CA: *f.webhookCA}, tlsconfig.Options{Use: "webhook", Log: log})
	if err != nil {
		return nil, fmt.Errorf("--webhook-cert-file, --webhook-key-file, --webhook-client-ca-file: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(kubernetes.AdmissionPath, srv.Admission())
	wh, err := webhook.New(mux, webhook.Config{TLS: src, ClientNames: names, Log: log})
	if err != nil {
		return nil, fmt.Errorf("the admission webhook: %w", err)
	}
	wln, err := net.Listen("tcp", *f.webhookAddr)
	if err != nil {
		return nil, fmt.Errorf("--webhook-bind-address: %w", err)
	}
	if *f.webhookCA == "" && !loopback(*f.webhookAddr) {
		log.Warn("the admission webhook answers any caller (no --webhook-client-ca-file), and its refusals say what the registry holds: let only the apiserver reach its address", "address", wln.Addr().String())
	}
	go wh.Serve(context.Background(), wln) // until the process ends
	return src, nil
}

// serviceRanges reads --service-cluster-ip-range, and finds this host's
// addresses, which no service range may hold (every node drops new
// connections to a range's free addresses).
func serviceRanges(list string) ([]netip.Prefix, []netip.Addr, error) {
	var own []netip.Addr
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, nil, fmt.Errorf("this host's addresses: %w", err)
	}
	for _, ia := range ifAddrs {
		if p, err := netip.ParsePrefix(ia.String()); err == nil && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			own = append(own, p.Addr().Unmap())
		}
	}
	var ranges []netip.Prefix
	for _, s := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' }) {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, nil, fmt.Errorf("%q is not a CIDR", s)
		}
		if err := iprange.ValidateServiceRange(p); err != nil {
			return nil, nil, err
		}
		for _, a := range own {
			if p.Contains(a) {
				return nil, nil, fmt.Errorf("%s holds %s, an address of this host", p, a)
			}
		}
		if slices.ContainsFunc(ranges, func(q netip.Prefix) bool { return q.Addr().Is4() == p.Addr().Is4() }) {
			return nil, nil, fmt.Errorf("%s: one range per family", p)
		}
		ranges = append(ranges, p)
	}
	return ranges, own, nil
}

// checkLeaderElect refuses --leader-elect where there is no Lease to
// elect with, or where replicas elect through etcd already.
func checkLeaderElect(leaderElect, kube, etcd bool) error {
	switch {
	case leaderElect && !kube:
		return errors.New("--leader-elect elects with a Kubernetes Lease: it needs --kubernetes")
	case leaderElect && etcd:
		return errors.New("--leader-elect is for replicas with stores of their own; replicas sharing --etcd-endpoints elect their leader in etcd")
	}
	return nil
}

// checkInsecure refuses --insecure given with TLS flags: which one was
// meant is not for the server to guess.
func checkInsecure(insecure bool, certFile, keyFile, caFile string) error {
	if insecure && (certFile != "" || keyFile != "" || caFile != "") {
		return fmt.Errorf("--insecure serves plain text: it contradicts --tls-cert-file, --tls-key-file and --client-ca-file; give one or the other")
	}
	return nil
}

// checkPlainTextListen refuses plain text off loopback unless the operator
// said so with a flag that names the risk.
func checkPlainTextListen(insecure, allowRemote bool, listen string) error {
	switch {
	case allowRemote && !insecure:
		return fmt.Errorf("--insecure-allow-remote means nothing without --insecure")
	case insecure && !allowRemote && !loopback(listen):
		return fmt.Errorf("--insecure serves plain text, without authentication, on loopback only: --listen %s is not a loopback address; add --insecure-allow-remote if anyone who reaches it may read and change everything (a lab), or use TLS", listen)
	}
	return nil
}

// loopback: the listen address is on a loopback interface only.
func loopback(listen string) bool { return daemon.Loopback(listen) }

// withProbes adds to the metrics listener what a kubelet probes: /readyz
// (200 while ready says so, else 503) and /livez (200 while the process
// answers), as Kubernetes' own components serve them.
func withProbes(metrics http.Handler, ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", metrics)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	return mux
}
