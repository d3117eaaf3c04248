// Command weir-server is Weir's central server: it keeps the cluster state
// orchestrators declare, computes what every node must forward, and streams
// it to each node's agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
		fmt.Fprintln(os.Stderr, "weir-server:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		listen         = flag.String("listen", "127.0.0.1:7443", "address of the gRPC API (agents and orchestrators)")
		dataDir        = flag.String("data-dir", "/var/lib/weir", "folder of the persistent store")
		initStore      = flag.Bool("init", false, "start with an empty store where the database was lost (missing or empty, in a folder that had one); never over a store that holds anything")
		insecure       = flag.Bool("insecure", false, "serve plain text instead of TLS, on a loopback address only (lab and demo)")
		insecureRemote = flag.Bool("insecure-allow-remote", false, "with --insecure, serve plain text on a non-loopback address too: anyone who reaches it can read and change everything")
		certFile       = flag.String("tls-cert-file", "", "server certificate (PEM)")
		keyFile        = flag.String("tls-key-file", "", "server private key (PEM)")
		caFile         = flag.String("client-ca-file", "", "CA that signs agent and operator certificates; requires mTLS")
		minSync        = flag.Duration("min-sync-period", 50*time.Millisecond, "least time between two rounds of changes to agents; a lone change goes out at once")
		metrics        = flag.String("metrics-bind-address", "127.0.0.1:7444", "address of /metrics (Prometheus), and of /debug/pprof/ with --profiling")
		kube           = flag.Bool("kubernetes", false, "mirror a Kubernetes cluster's services, endpoint slices and nodes (in-cluster config unless --kubeconfig)")
		kubecfg        = flag.String("kubeconfig", "", "kubeconfig of the cluster to mirror; implies --kubernetes")
		resFile        = flag.String("resources-file", "", "YAML file of AddressPool and BgpPeer documents (lbctl's format) the server keeps applied, re-read when it changes (a mounted ConfigMap)")
		resAll         = flag.Bool("resources-file-allow-removing-all", false, "apply a resources file even when it is empty or removes every address pool in use (refused by default: a half-written file looks like that)")
		proxyNm        = flag.String("service-proxy-name", "", "handle only Kubernetes services labelled service.kubernetes.io/service-proxy-name=NAME (default: only unlabelled ones, as kube-proxy)")
		lbClass        = flag.String("load-balancer-class", kubernetes.DefaultLoadBalancerClass, "assign and announce the addresses of Kubernetes LoadBalancer services whose spec.loadBalancerClass is CLASS; another controller's services are forwarded, never touched")
		webhookAddr    = flag.String("webhook-bind-address", "", "with --kubernetes: serve the apiserver's admission reviews of weir.dev objects (the ValidatingWebhookConfiguration weir.dev) over HTTPS here, e.g. [$(POD_IP)]:7445; empty: not served")
		webhookCert    = flag.String("webhook-cert-file", "", "the admission webhook's certificate (PEM)")
		webhookKey     = flag.String("webhook-key-file", "", "the admission webhook's private key (PEM)")
		webhookCA      = flag.String("webhook-client-ca-file", "", "the admission webhook requires a client certificate this CA signed (PEM), the one the apiserver's AdmissionConfiguration presents; empty: any caller that reaches the address is answered")
		webhookNames   = flag.String("webhook-client-names", "", "with --webhook-client-ca-file: comma-separated names (CommonName or DNS name) of the client certificates the webhook takes; empty: any the CA signed")
		lbDefault      = flag.Bool("default-load-balancer", false, "Weir is the cluster's default load balancer: also handle LoadBalancer services with no spec.loadBalancerClass (leave false beside MetalLB or another controller that handles them)")
		apiRate        = flag.Float64("api-calls-per-second", limits.DefaultCallsPerSecond, "each caller's rate of API calls (bursts of twice as many); a caller over it waits, others do not; 0: no limit")
		apiWatch       = flag.Int("api-watches-per-caller", limits.DefaultMaxWatchesPerCaller, "most Watch streams one caller may hold open")
		apiConns       = flag.Int("api-connections-per-caller", limits.DefaultMaxConnectionsPerCaller, "most connections one client certificate may hold open; more are closed after their handshake")
		apiInFlight    = flag.Int("api-calls-in-flight-per-caller", limits.DefaultMaxCallsInFlightPerCaller, "most unary calls one client certificate may have in flight (each holds its request, up to 4 MiB); more are refused before they are read")
		npRange        = flag.String("service-node-port-range", "30000-32767", "node ports and health-check node ports of native services come from this range (as the apiserver's flag)")
		etcdFlags      = addEtcdFlags(flag.CommandLine)
		etcdEndpoints  = etcdFlags.endpoints
		replicaName    = flag.String("replica-name", "", "this replica's name among the others sharing etcd (default: host name and process ID)")
		leaderLease    = flag.Duration("leader-lease", 2*time.Second, "with etcd: how long a replica that died keeps its leadership (address assignment, the sources' writes) and its agents' status; whole seconds")
		leaderElect    = flag.Bool("leader-elect", false, "with --kubernetes: run as one of several replicas, each with its own --data-dir, that mirror the cluster; only the holder of a coordination.k8s.io Lease assigns addresses and writes them to Services")
		leLease        = flag.Duration("leader-elect-lease-duration", 15*time.Second, "with --leader-elect: how long a replica that died keeps the Lease")
		leRenew        = flag.Duration("leader-elect-renew-deadline", 10*time.Second, "with --leader-elect: how long the leader tries to renew the Lease before it stops leading")
		leRetry        = flag.Duration("leader-elect-retry-period", 2*time.Second, "with --leader-elect: how often replicas try to take or renew the Lease")
		leNamespace    = flag.String("leader-elect-namespace", "", "with --leader-elect: namespace of the Lease "+kubernetes.LeaseName+" (default: the pod's own, else "+kubernetes.DefaultNamespace+")")
		svcRanges      = flag.String("service-cluster-ip-range", "10.96.0.0/12,fd00:96::/108", "comma-separated ranges (one per family) the cluster IPs of native services come from, besides the ServiceCidr resources (as the apiserver's flag); none may hold an address of this host")
		l2TTL          = flag.Duration("l2-lease-duration", server.DefaultL2LeaseTTL, "how long a node's lease on an L2 address lasts from its ask (it asks four times as often); an owner that fails is replaced within about this plus --l2-lease-margin")
		l2Margin       = flag.Duration("l2-lease-margin", server.DefaultL2LeaseMargin, "how much longer than a lease the server waits before it gives an L2 address whose owner did not give it up to another node: room for the two clocks' rates")
		agentNeedsTok  = flag.Bool("agents-need-node-tokens", false, "refuse agents on the shared certificate (CommonName "+certs.FleetAgentName+") that present no node token: each agent then acts for its own node only (with --kubernetes; the Helm chart and manifests set it). Without it such an agent may act for any node, which is deprecated")
		agentTokAud    = flag.String("agent-token-audience", kubernetes.DefaultAgentTokenAudience, "with --kubernetes: the audience of the agents' node tokens (their projected service-account token volume's)")
		agentTokSA     = flag.String("agent-service-account", "", "with --kubernetes: namespace/name of the agents' service account, whose pod-bound tokens are node tokens (default: the server's namespace/weir-agent)")
		extCIDRs       = flag.String("allowed-external-ip-cidrs", "", "comma-separated CIDRs external IPs may come from (default none: a service's external IP takes an address's traffic on every node; Kubernetes recommends denying them)")
	)
	common := daemon.AddFlags(flag.CommandLine)
	flag.Parse()
	log, done, err := common.Start("weir-server", version, os.Stdout, os.Stderr)
	if done || err != nil {
		return err
	}

	var tlsSrc *tlsconfig.Source
	if err := checkInsecure(*insecure, *certFile, *keyFile, *caFile); err != nil {
		return err
	}
	if err := checkPlainTextListen(*insecure, *insecureRemote, *listen); err != nil {
		return err
	}
	if *insecure && !loopback(*listen) {
		log.Warn("serving the API in plain text, without authentication, on a non-loopback address: anyone who reaches it can read and change everything; use TLS outside a lab", "listen", *listen)
	}
	if !*insecure {
		if *caFile == "" {
			return fmt.Errorf("--client-ca-file is required: every caller authenticates with a certificate (or run with --insecure)")
		}
		if *certFile == "" || *keyFile == "" {
			return errors.New("--tls-cert-file and --tls-key-file are required (or run with --insecure)")
		}
		if tlsSrc, err = tlsconfig.Load(tlsconfig.Files{Cert: *certFile, Key: *keyFile, CA: *caFile}, tlsconfig.Options{Use: "server", Log: log}); err != nil {
			return err
		}
	}
	if *initStore && *etcdEndpoints == "" {
		if err := store.Init(*dataDir); err != nil {
			return fmt.Errorf("--init: %w", err)
		}
	}
	rules := registry.DefaultServiceRules()
	if rules.NodePorts, err = registry.ParsePortRange(*npRange); err != nil {
		return fmt.Errorf("--service-node-port-range: %w", err)
	}
	for _, s := range strings.FieldsFunc(*extCIDRs, func(r rune) bool { return r == ',' }) {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || p.Masked() != p {
			return fmt.Errorf("--allowed-external-ip-cidrs: %q is not a CIDR", s)
		}
		rules.ExternalIPCIDRs = append(rules.ExternalIPCIDRs, p)
	}
	if rules.ServiceRanges, rules.ServerAddrs, err = serviceRanges(*svcRanges); err != nil {
		return fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var certSources tlsmetrics.Collector
	if tlsSrc != nil {
		certSources = append(certSources, tlsSrc)
	}
	cfg := server.Config{DataDir: *dataDir, TLS: tlsSrc, Log: log, MinSyncPeriod: *minSync, Metrics: reg, Version: version, ResourcesFile: *resFile, ResourcesFileAllowRemovingAll: *resAll, ServiceRules: &rules,
		Limits: limits.Config{CallsPerSecond: *apiRate, Burst: int(2 * *apiRate), MaxWatchesPerCaller: *apiWatch, MaxConnectionsPerCaller: *apiConns, MaxCallsInFlightPerCaller: *apiInFlight}}
	if *apiRate == 0 {
		cfg.Limits.CallsPerSecond = -1
	}
	if *l2TTL < 100*time.Millisecond || *l2Margin < 0 || *l2Margin > *l2TTL {
		return fmt.Errorf("--l2-lease-duration %v, --l2-lease-margin %v: the lease at least 100ms, the margin between 0 and the lease", *l2TTL, *l2Margin)
	}
	cfg.L2LeaseTTL, cfg.L2LeaseMargin = *l2TTL, *l2Margin
	cfg.SharedAgentCertificateNeedsToken = *agentNeedsTok
	var etcdTLS *tlsconfig.Source
	if cfg.Etcd, etcdTLS, err = etcdFlags.config(log); err != nil {
		return err
	}
	if etcdTLS != nil {
		certSources = append(certSources, etcdTLS)
	}
	if cfg.Etcd != nil {
		cfg.Replica, cfg.LeaseTTL = *replicaName, *leaderLease
		if *initStore {
			return errors.New("--init is for the embedded store: an etcd cluster's state is restored from a snapshot (docs/ha.md)")
		}
	}
	if errs := validation.IsQualifiedName(*lbClass); len(errs) > 0 {
		return fmt.Errorf("--load-balancer-class %q: %s", *lbClass, strings.Join(errs, "; "))
	}
	if *kube || *kubecfg != "" {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: *kubecfg, ProxyName: *proxyNm, Resync: 10 * time.Minute,
			Classes:     kubernetes.Classes{Class: *lbClass, Default: *lbDefault},
			AgentTokens: kubernetes.AgentTokens{Audience: *agentTokAud, ServiceAccount: *agentTokSA}}
	}
	if err := checkLeaderElect(*leaderElect, cfg.Kubernetes != nil, cfg.Etcd != nil); err != nil {
		return err
	}
	if *leaderElect {
		cfg.Kubernetes.LeaderElection = &kubernetes.LeaderElection{
			Namespace: *leNamespace, Name: kubernetes.LeaseName,
			LeaseDuration: *leLease, RenewDeadline: *leRenew, RetryPeriod: *leRetry,
		}
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	mln, err := net.Listen("tcp", *metrics)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	if *webhookAddr != "" {
		if srv.Admission() == nil || *webhookCert == "" || *webhookKey == "" {
			return errors.New("--webhook-bind-address needs --kubernetes, --webhook-cert-file and --webhook-key-file")
		}
		var names []string
		for _, n := range strings.Split(*webhookNames, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		if len(names) > 0 && *webhookCA == "" {
			return errors.New("--webhook-client-names needs --webhook-client-ca-file")
		}
		src, err := tlsconfig.Load(tlsconfig.Files{Cert: *webhookCert, Key: *webhookKey, CA: *webhookCA}, tlsconfig.Options{Use: "webhook", Log: log})
		if err != nil {
			return fmt.Errorf("--webhook-cert-file, --webhook-key-file, --webhook-client-ca-file: %w", err)
		}
		certSources = append(certSources, src)
		mux := http.NewServeMux()
		mux.Handle(kubernetes.AdmissionPath, srv.Admission())
		wh, err := webhook.New(mux, webhook.Config{TLS: src, ClientNames: names, Log: log})
		if err != nil {
			return fmt.Errorf("the admission webhook: %w", err)
		}
		wln, err := net.Listen("tcp", *webhookAddr)
		if err != nil {
			return fmt.Errorf("--webhook-bind-address: %w", err)
		}
		if *webhookCA == "" && !loopback(*webhookAddr) {
			log.Warn("the admission webhook answers any caller (no --webhook-client-ca-file), and its refusals say what the registry holds: let only the apiserver reach its address", "address", wln.Addr().String())
		}
		go wh.Serve(context.Background(), wln) // until the process ends
	}
	reg.MustRegister(certSources)
	go http.Serve(mln, common.MetricsHandler(reg, *metrics, log))
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Etcd != nil {
		log.Info("serving", "address", lis.Addr().String(), "etcd", *etcdEndpoints, "replica", cfg.Replica, "tls", tlsSrc != nil, "version", version)
	} else {
		log.Info("serving", "address", lis.Addr().String(), "data_dir", *dataDir, "tls", tlsSrc != nil, "version", version)
	}
	return srv.Serve(ctx, lis)
}

// checkLeaderElect refuses --leader-elect where there is no Lease to
// elect with, or where replicas elect through etcd already.
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
