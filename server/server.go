// Package server assembles the central server: the persistent registry of
// cluster state, the per-node state streams to agents, and the gRPC API.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"k8s.io/client-go/dynamic"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/weirlb/weir/internal/tlsconfig"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/api"
	"github.com/weirlb/weir/server/auth"
	"github.com/weirlb/weir/server/ipam"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/l2owner"
	"github.com/weirlb/weir/server/limits"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/replicas"
	"github.com/weirlb/weir/server/resourcefile"
	"github.com/weirlb/weir/server/store"
	"github.com/weirlb/weir/server/store/etcdstore"
)

// Config is how a server runs.
type Config struct {
	DataDir string
	// Etcd, when not nil, keeps the state in etcd instead of DataDir, for
	// several replicas of the server (see docs/ha.md).
	Etcd *etcdstore.Config
	// Replica names this replica among the others (default: the host
	// name and the process ID).
	Replica string
	// LeaseTTL is how long a dead replica keeps its leadership and its
	// agents' status (default 2 s).
	LeaseTTL time.Duration
	// TLS is nil only when the operator asked for plain text. Its files
	// are reloaded when they change, and each connection ends with its
	// certificates (see tlsconfig).
	TLS *tlsconfig.Source
	Log *slog.Logger
	// MinSyncPeriod is the least time between two rounds of deltas to
	// agents (see agentsync.Config).
	MinSyncPeriod time.Duration
	// RemovalLogLimit bounds the deleted services remembered for agents
	// that resume later (see agentsync.Config).
	RemovalLogLimit int
	// Metrics receives the server's metrics when not nil.
	Metrics prometheus.Registerer
	// Version is the server's build version, as it reports it.
	Version string
	// Kubernetes, when not nil, mirrors a cluster's services, endpoint
	// slices and nodes beside the native API.
	Kubernetes *kubernetes.Config
	// ResourcesFile, when set, declares address pools and BGP peers (a
	// mounted ConfigMap, say); it is re-read when it changes.
	ResourcesFile string
	// ResourcesFileAllowRemovingAll lets the resources file remove every
	// pool in use, or be emptied (see resourcefile.Watcher).
	ResourcesFileAllowRemovingAll bool
	// ServiceRules are the node-port range, reserved ports and allowed
	// external IPs; nil means registry.DefaultServiceRules.
	ServiceRules *registry.ServiceRules
	// Limits bound what one caller of the API can take (zero: defaults).
	Limits limits.Config
	// L2LeaseTTL is how long a node's lease on an L2 address lasts from
	// its ask, and L2LeaseMargin how much longer the server waits before
	// giving an address whose lease was not given up to another node
	// (zero: DefaultL2LeaseTTL and DefaultL2LeaseMargin).
	L2LeaseTTL, L2LeaseMargin time.Duration
	// L2Period is the least time between two computations of the L2
	// candidates, L2WarmUp how long a new leader waits at most to hear
	// from every node before it decides L2 owners (zero:
	// l2owner.DefaultPeriod and DefaultWarmUp).
	L2Period, L2WarmUp time.Duration
	// AnnouncePeriod is how often the leader looks at what the nodes do
	// with each Kubernetes service's addresses, AnnounceSettle how long a
	// change must hold before the service is told (zero:
	// kubernetes.DefaultAnnouncePeriod and DefaultAnnounceSettle).
	AnnouncePeriod, AnnounceSettle time.Duration
	// SharedAgentCertificateNeedsToken refuses agents on the agents'
	// shared certificate that present no node token; in Kubernetes mode
	// the server reviews those tokens (auth.Options).
	SharedAgentCertificateNeedsToken bool
}

// The L2 leases' defaults: an owner that fails is replaced within about
// TTL + margin.
const (
	DefaultL2LeaseTTL    = 600 * time.Millisecond
	DefaultL2LeaseMargin = 150 * time.Millisecond
)

// Server is a running central server.
type Server struct {
	Registry *registry.Registry
	Agents   *agentsync.Hub
	kube     *kubernetes.Source
	// kubeStatus writes to Kubernetes Services: addresses, conditions,
	// Events; stopEvents ends its Events' recording.
	kubeStatus *kubernetes.StatusWriter
	stopEvents context.CancelFunc
	ipam       *ipam.Allocator
	l2         *l2owner.Owners
	l2Leader   *l2owner.Leader
	reporter   *kubernetes.Reporter // nil without Kubernetes
	resFile    *resourcefile.Watcher
	store      store.Backend
	replica    *replicas.Config // nil without a shared store
	// election is nil unless Kubernetes replicas, each with its own
	// store, elect the one that assigns addresses with a Lease.
	election *kubernetes.LeaderElection
	running  sync.WaitGroup // the jobs started by run, while they run
	failMu   sync.Mutex     // guards fail
	fail     func(error)    // stops Serve with an error, once it runs
	runMu    sync.Mutex     // orders adding to running with waiting for it
	stopping bool           // guarded by runMu: no job starts any more
	log      *slog.Logger
	grpc     *grpc.Server
	health   *health.Server
}

// ResourcesFilePeriod is how often the resources file is checked for
// changes, and ResourcesFileSettle how long a change must stay the same
// before it is applied.
var (
	ResourcesFilePeriod = 5 * time.Second
	ResourcesFileSettle = time.Second
)

// New opens the data dir and builds the gRPC server.
func New(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	st, reg, err := openRegistry(cfg)
	if err != nil {
		return nil, err
	}
	s, err := assemble(cfg, st, reg)
	if err != nil {
		st.Close()
		return nil, err
	}
	return s, nil
}

// checkConfig refuses, before anything is opened, what the operator can
// fix at once: leader election by Lease over a shared store, a bad
// resources file.
func checkConfig(cfg Config) error {
	if k := cfg.Kubernetes; k != nil && k.LeaderElection != nil {
		if cfg.Etcd != nil {
			return errors.New("leader election by Lease is for Kubernetes replicas with stores of their own; replicas sharing etcd elect their leader there")
		}
		if err := k.LeaderElection.Check(); err != nil {
			return err
		}
	}
	if cfg.ResourcesFile != "" {
		// A bad file at start-up stops the server: the operator is there.
		data, err := os.ReadFile(cfg.ResourcesFile)
		if err == nil {
			_, err = resourcefile.Parse(cfg.ResourcesFile, data)
		}
		if err != nil {
			return fmt.Errorf("--resources-file: %w", err)
		}
	}
	return nil
}

// openRegistry opens the store and loads the registry from it.
func openRegistry(cfg Config) (store.Backend, *registry.Registry, error) {
	st, where, err := openStore(cfg)
	if err != nil {
		return nil, nil, err
	}
	reg, err := registry.Open(st)
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("loading state from %s: %w", where, err)
	}
	if cfg.ServiceRules != nil {
		reg.SetServiceRules(*cfg.ServiceRules)
	}
	return st, reg, nil
}

// assemble builds the server's parts over its registry, each from those
// before it: the Kubernetes client, the L2 owners and the hub, the gRPC
// server, the Kubernetes source, the replicas, the jobs the leader runs,
// the resources file, the health of writes, the gRPC services.
func assemble(cfg Config, st store.Backend, reg *registry.Registry) (*Server, error) {
	s := &Server{Registry: reg, store: st, log: cfg.Log, health: health.NewServer()}
	// Not serving until Serve says so (a new health server says SERVING).
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	kc, err := newKubeClient(cfg)
	if err != nil {
		return nil, err
	}
	s.newAgents(cfg)
	opts, err := grpcOptions(cfg, kc, s.Agents)
	if err != nil {
		return nil, err
	}
	s.grpc = grpc.NewServer(opts...)
	if err := s.newKubernetes(cfg, kc); err != nil {
		return nil, err
	}
	s.replica = s.newReplica(cfg)
	if s.listsItself() {
		s.Agents.SetPartial("the Kubernetes source has not listed the cluster yet")
	}
	if err := s.newLeaderJobs(cfg); err != nil {
		return nil, err
	}
	s.resFile = newResourcesFile(cfg, reg)
	s.watchWrites()
	s.registerServices(cfg)
	return s, nil
}

// kubeClient is the client of the Kubernetes API, when the server
// mirrors a cluster.
type kubeClient struct {
	rest   *rest.Config
	client clientset.Interface
}

// newKubeClient is the Kubernetes client cfg asks for, or nil.
func newKubeClient(cfg Config) (*kubeClient, error) {
	if cfg.Kubernetes == nil {
		return nil, nil
	}
	rc, err := kubernetes.RestConfig(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	client, err := clientset.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &kubeClient{rest: rc, client: client}, nil
}

// grpcOptions are the gRPC server's keepalive, audit, limits and
// authorization, in the order they apply to a call.
func grpcOptions(cfg Config, kc *kubeClient, hub *agentsync.Hub) ([]grpc.ServerOption, error) {
	opts := []grpc.ServerOption{
		// Agents ping every 10 s so a dead node's stream is noticed; allow it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	opts = append(opts, auth.AuditOptions(cfg.Log)...)
	var creds credentials.TransportCredentials
	if cfg.TLS != nil {
		var err error
		if creds, err = cfg.TLS.ServerCredentials(); err != nil {
			return nil, err
		}
	}
	// The limits come before authorization, so that what a denied caller
	// sends is bounded too.
	opts = append(opts, limits.ServerOptions(cfg.Limits, creds, cfg.Log)...)
	authOpts := auth.Options{SharedNeedsToken: cfg.SharedAgentCertificateNeedsToken}
	if kc != nil {
		authOpts.NodeTokens = kubernetes.NewNodeTokens(kc.client, cfg.Kubernetes.AgentTokens, cmp.Or(cfg.Kubernetes.Namespace, kubernetes.PodNamespace()))
	}
	if cfg.TLS != nil && cfg.TLS.Mutual() {
		opts = append(opts, auth.ServerOptions(authOpts)...)
	}
	return append(opts, currentOnly(hub)...), nil
}

// newAgents makes the L2 owners and the hub of the agents' streams.
func (s *Server) newAgents(cfg Config) {
	ttl, margin := cmp.Or(cfg.L2LeaseTTL, DefaultL2LeaseTTL), cmp.Or(cfg.L2LeaseMargin, DefaultL2LeaseMargin)
	s.l2 = l2owner.NewOwners(clock.RealClock{}, ttl, margin, cfg.Log.With("component", "l2"), cfg.Metrics)
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(poolCollector{s.Registry})
	}
	s.Agents = agentsync.New(s.Registry, agentsync.Config{MinSyncPeriod: cfg.MinSyncPeriod, Metrics: cfg.Metrics, Log: cfg.Log, RemovalLogLimit: cfg.RemovalLogLimit, L2: s.l2})
}

// newKubernetes makes the Kubernetes source and, where replicas elect
// their leader by Lease, the election; nothing without kc.
func (s *Server) newKubernetes(cfg Config, kc *kubeClient) error {
	if kc == nil {
		return nil
	}
	k := *cfg.Kubernetes
	k.Log = cfg.Log
	if k.Dynamic == nil {
		var err error
		if k.Dynamic, err = dynamic.NewForConfig(kc.rest); err != nil {
			return err
		}
	}
	if k.Namespace == "" {
		k.Namespace = kubernetes.PodNamespace()
	}
	var err error
	if s.kube, err = kubernetes.New(k, kc.client, s.Registry); err != nil {
		return err
	}
	if k.LeaderElection != nil {
		le := *k.LeaderElection
		if le.Log == nil {
			le.Log = cfg.Log
		}
		s.election = &le
	}
	return nil
}

// newLeaderJobs makes the jobs that run once among replicas (lead):
// address assignment, the L2 leader and, with Kubernetes, the reports to
// its services, written with Events.
func (s *Server) newLeaderJobs(cfg Config) error {
	writers := map[string]ipam.Writer{model.SourceNative: ipam.RegistryWriter{Registry: s.Registry}}
	if s.kube != nil {
		ctx, stop := context.WithCancel(context.Background())
		rec, err := kubernetes.NewRecorder(ctx, s.kube.Client())
		if err != nil {
			stop()
			return fmt.Errorf("recording Kubernetes Events: %w", err)
		}
		s.kubeStatus, s.stopEvents = &kubernetes.StatusWriter{Client: s.kube.Client(), Events: rec, Log: cfg.Log}, stop
		writers[model.SourceKubernetes] = s.kubeStatus
		s.reporter = kubernetes.NewReporter(kubernetes.ReporterConfig{Registry: s.Registry, Status: s.Agents, L2: s.l2,
			Services: s.kubeStatus, Custom: s.kube, Period: cfg.AnnouncePeriod, Settle: cfg.AnnounceSettle, Log: cfg.Log})
	}
	s.ipam = ipam.New(s.Registry, writers, cfg.Log)
	s.l2Leader = l2owner.NewLeader(l2owner.LeaderConfig{Owners: s.l2, Registry: s.Registry, Status: s.Agents,
		Period: cfg.L2Period, WarmUp: cfg.L2WarmUp, Log: cfg.Log})
	return nil
}

// newResourcesFile is the watcher of the resources file, if one is set.
func newResourcesFile(cfg Config, reg *registry.Registry) *resourcefile.Watcher {
	if cfg.ResourcesFile == "" {
		return nil
	}
	return &resourcefile.Watcher{
		Registry: reg, Path: cfg.ResourcesFile, Log: cfg.Log,
		Period: ResourcesFilePeriod, Settle: ResourcesFileSettle,
		AllowRemovingAll: cfg.ResourcesFileAllowRemovingAll,
		Rejected:         resourcefile.NewRejectedMetric(cfg.Metrics),
	}
}

// newReplica is how this server runs among replicas sharing etcd, nil
// on a store of its own.
func (s *Server) newReplica(cfg Config) *replicas.Config {
	etcd, ok := s.store.(*etcdstore.Etcd)
	if !ok {
		return nil
	}
	name := cfg.Replica
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return &replicas.Config{
		Store: etcd, Registry: s.Registry, Hub: s.Agents, Name: name, LeaseTTL: cfg.LeaseTTL, Log: cfg.Log,
		Serving: func(ok bool) {
			st := healthpb.HealthCheckResponse_SERVING
			if !ok {
				st = healthpb.HealthCheckResponse_NOT_SERVING
			}
			s.health.SetServingStatus("", st)
		},
		WentBack: s.stopWith,
	}
}

// watchWrites has the registry service's health follow the store: reads
// and the agents' streams go on while the store refuses writes (a full
// disk), so the server stays SERVING, its registry does not.
func (s *Server) watchWrites() {
	s.Registry.OnWriteFailure(func(err error) {
		st := healthpb.HealthCheckResponse_SERVING
		if err != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
			s.log.Error("the store refuses writes; weir.v1.RegistryService is NOT_SERVING until one is taken", "error", err)
		} else {
			s.log.Info("the store takes writes again; weir.v1.RegistryService is SERVING")
		}
		s.health.SetServingStatus(weirv1.RegistryService_ServiceDesc.ServiceName, st)
	})
	s.health.SetServingStatus(weirv1.RegistryService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// registerServices puts the gRPC services on the server.
func (s *Server) registerServices(cfg Config) {
	info := api.ServerInfo{Version: cfg.Version, Started: time.Now(), Sources: []string{model.SourceNative}}
	if cfg.Kubernetes != nil {
		info.Sources = append(info.Sources, model.SourceKubernetes)
	}
	if cfg.ResourcesFile != "" {
		info.Sources = append(info.Sources, model.SourceFile)
	}
	weirv1.RegisterRegistryServiceServer(s.grpc, api.NewRegistryService(s.Registry))
	weirv1.RegisterAgentServiceServer(s.grpc, s.Agents)
	lbTier := api.NewLoadBalancerTierService(s.Agents, s.Registry)
	weirv1.RegisterLoadBalancerTierServiceServer(s.grpc, lbTier)
	weirv1.RegisterStatusServiceServer(s.grpc, api.NewStatusService(s.Agents, s.Registry, info, lbTier, s.l2))
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
}

func openStore(cfg Config) (store.Backend, string, error) {
	if cfg.Etcd == nil {
		st, err := store.Open(cfg.DataDir)
		return st, cfg.DataDir, err
	}
	where := "etcd " + strings.Join(cfg.Etcd.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, *cfg.Etcd)
	return st, where, err
}

// Ready reports whether the server serves: its gRPC health says SERVING
// for the whole server (not before Serve, not after it stops, not while a
// replica is behind its store). The kubelet reads it from /readyz: its
// gRPC probe speaks no TLS.
func (s *Server) Ready() bool {
	resp, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// Serve answers on lis until ctx ends, or the server fails (its store
// went back below what it holds), then stops gracefully.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.failMu.Lock()
	s.fail = func(err error) {
		s.log.Error("stopping", "error", err)
		cancel(err)
	}
	s.failMu.Unlock()
	go s.Agents.Run(ctx)
	go s.Registry.Follow(ctx, s.log)
	switch {
	case s.replica != nil:
		go replicas.Run(ctx, *s.replica, s.lead)
	case s.election != nil:
		go s.leadByLease(ctx)
	default:
		go s.lead(ctx)
	}
	if s.listsItself() {
		go s.currentOnceListed(ctx)
	} else {
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}
	go func() {
		<-ctx.Done()
		s.health.Shutdown()
		// Agent streams never end by themselves: give unary calls a moment, then cut.
		timer := time.AfterFunc(2*time.Second, s.grpc.Stop)
		s.grpc.GracefulStop()
		timer.Stop()
	}()
	err := s.grpc.Serve(lis)
	s.stopped()
	if s.stopEvents != nil {
		s.stopEvents()
	}
	if cerr := s.store.Close(); err == nil {
		err = cerr
	}
	if cause := context.Cause(ctx); err == nil && cause != nil && cause != context.Canceled {
		err = cause
	}
	return err
}

// listsItself says whether this replica fills its registry from the
// cluster itself, rather than from a store another fills (replicas
// sharing etcd, whose leader alone runs the Kubernetes source).
func (s *Server) listsItself() bool { return s.kube != nil && s.replica == nil }

// currentOnceListed keeps the replica from serving agents (and
// NOT_SERVING) until the Kubernetes source has listed the whole cluster:
// what a store left empty (a pod's emptyDir) holds, or one with services
// not listed yet, would otherwise go to agents as the cluster's state,
// and take away the rules of every service not listed yet.
func (s *Server) currentOnceListed(ctx context.Context) {
	if s.kube.WaitSynced(ctx) {
		s.Agents.SetPartial("")
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}
}

// Admission answers the apiserver's AdmissionReviews for Weir's custom
// resources (kubernetes.Source.Admission); nil without Kubernetes.
func (s *Server) Admission() http.Handler {
	if s.kube == nil {
		return nil
	}
	return s.kube.Admission()
}

// lead runs, until ctx ends, the jobs that must run once among replicas
// sharing a store: address assignment, the resources file and the
// Kubernetes source's writes. A single server runs them from the start;
// replicas, on the leader only.
func (s *Server) lead(ctx context.Context) {
	s.run(ctx, append(s.sources(), s.leaderJobs()...)...)
}

// leadByLease runs the jobs of a Kubernetes replica with a store of its
// own: every replica reads the cluster and the resources file into its
// own registry, and only the holder of the Lease assigns addresses, as it
// writes them to the cluster.
func (s *Server) leadByLease(ctx context.Context) {
	s.run(ctx, append(s.sources(), func(ctx context.Context) {
		if err := kubernetes.RunLeased(ctx, s.kube.Client(), *s.election, func(ctx context.Context) { s.run(ctx, s.leaderJobs()...) }); err != nil {
			s.log.Error("leader election stopped: this replica assigns no addresses", "error", err)
		}
	})...)
}

// leaderJobs are the controllers that run on the leader only: address
// assignment, the L2 owners, the reports to Kubernetes.
func (s *Server) leaderJobs() []func(context.Context) {
	jobs := []func(context.Context){s.ipam.Run, s.l2Leader.Run}
	if s.reporter != nil {
		jobs = append(jobs, s.reporter.Run)
	}
	if s.kube == nil {
		return jobs
	}
	// They decide from the whole cluster, so they start once the source
	// holds it: not on the half of a first list that happened to arrive.
	for i, job := range jobs {
		jobs[i] = func(ctx context.Context) {
			if s.kube.WaitSynced(ctx) {
				job(ctx)
			}
		}
	}
	return jobs
}

// sources are the jobs that fill the registry from outside: the resources
// file and the Kubernetes source.
func (s *Server) sources() []func(context.Context) {
	var jobs []func(context.Context)
	if s.resFile != nil {
		jobs = append(jobs, s.resFile.Watch)
	}
	if s.kube != nil {
		jobs = append(jobs, func(ctx context.Context) {
			if err := s.kube.Run(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("kubernetes source stopped", "error", err)
			}
		})
	}
	return jobs
}

// run runs jobs until ctx ends and returns once every one has returned,
// so that another replica may start them, and the store close after them.
func (s *Server) run(ctx context.Context, jobs ...func(context.Context)) {
	s.runMu.Lock()
	if s.stopping {
		s.runMu.Unlock()
		return
	}
	s.running.Add(1)
	s.runMu.Unlock()
	defer s.running.Done()
	var wg sync.WaitGroup
	for _, job := range jobs {
		wg.Go(func() { job(ctx) })
	}
	wg.Wait()
}

// stopped waits for the jobs run started, so the store is closed after
// them.
func (s *Server) stopped() {
	s.runMu.Lock()
	s.stopping = true
	s.runMu.Unlock()
	s.running.Wait()
}

// stopWith stops a serving server with err, which Serve returns.
func (s *Server) stopWith(err error) {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if s.fail != nil {
		s.fail(err)
	}
}
