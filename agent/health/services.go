package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Service is what one service's health check answers from.
type Service struct {
	Namespace, Name string
	Port            uint16
	// LocalReady counts the node's ready endpoints; terminating ones are
	// not counted, so that a balancer drains a node whose pods are going.
	LocalReady int
}

// Services runs one HTTP listener per health-check node port, on the
// node's addresses, opening and closing them as services come and go.
type Services struct {
	proxyHealthy func() bool
	log          *slog.Logger
	bindErrors   prometheus.Gauge

	mu      sync.Mutex // guards servers and addrs
	addrs   []netip.Addr
	servers map[uint16]*portServer
	// drained makes every port answer 503.
	drained atomic.Bool
	// conns bounds the connections every port together holds.
	conns *ConnLimit
}

// SetDrained makes every health-check port answer 503 (or not).
func (s *Services) SetDrained(drained bool) { s.drained.Store(drained) }

type portServer struct {
	svc     atomic.Pointer[Service] // swapped on every sync; read per request
	http    *http.Server
	bindErr error
}

// NewServices returns listeners that answer 503 whenever proxyHealthy says
// the agent is not keeping up.
func NewServices(proxyHealthy func() bool, log *slog.Logger, reg prometheus.Registerer) *Services {
	s := &Services{
		proxyHealthy: proxyHealthy,
		log:          log,
		servers:      map[uint16]*portServer{},
		conns:        NewConnLimit(MaxServiceConnections),
		bindErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_service_health_bind_errors",
			Help: "Health-check node ports that could not be opened.",
		}),
	}
	if reg != nil {
		reg.MustRegister(s.bindErrors)
	}
	return s
}

// Result is one service's health check as it stands after a sync.
type Result struct {
	// Err says why the port could not be opened.
	Err error
}

// Verdict is what a service's health-check port answers, the one home of
// the rule: 200 while the node has ready endpoints of the service, its
// proxy is healthy and it is not drained (kube-proxy's rule, and Weir's
// drain); 503 otherwise. The port's answer and the agent's report both
// come from it.
func Verdict(localReady int, proxyHealthy, drained bool) int {
	if localReady > 0 && proxyHealthy && !drained {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// Sync makes the listeners match services: new ports open on addrs (all
// addresses when empty), vanished ones close, and every answer follows the
// new counts at once.
func (s *Services) Sync(addrs []netip.Addr, services []Service) map[string]Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sameAddrs(addrs, s.addrs) {
		// The node's addresses changed: reopen everything on the new ones.
		for port, ps := range s.servers {
			ps.close()
			delete(s.servers, port)
		}
		s.addrs = addrs
	}
	want := map[uint16]Service{}
	results := map[string]Result{}
	for _, svc := range services {
		key := svc.Namespace + "/" + svc.Name
		if other, taken := want[svc.Port]; taken {
			results[key] = Result{Err: fmt.Errorf("port %d is the health-check port of %s/%s too", svc.Port, other.Namespace, other.Name)}
			continue
		}
		want[svc.Port] = svc
	}
	for port, ps := range s.servers {
		if _, ok := want[port]; !ok {
			ps.close()
			delete(s.servers, port)
		}
	}
	for port, svc := range want {
		ps := s.servers[port]
		if ps == nil || ps.bindErr != nil {
			// New, or failed before: (re)try, since whatever held the
			// port may have let it go.
			ps = s.open(port)
			s.servers[port] = ps
		}
		ps.svc.Store(&svc)
		key := svc.Namespace + "/" + svc.Name
		if ps.bindErr != nil {
			results[key] = Result{Err: ps.bindErr}
			continue
		}
		results[key] = Result{}
	}
	failed := 0
	for _, r := range results {
		if r.Err != nil {
			failed++
		}
	}
	s.bindErrors.Set(float64(failed))
	return results
}

// open binds port on every address; a failure on any is the port's error
// (a balancer probing that address would get no answer).
func (s *Services) open(port uint16) *portServer {
	ps := &portServer{}
	ps.http = NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		svc := ps.svc.Load()
		s.answer(w, svc)
	}))
	hosts := []string{""}
	if len(s.addrs) > 0 {
		hosts = hosts[:0]
		for _, a := range s.addrs {
			hosts = append(hosts, a.String())
		}
	}
	var listeners []net.Listener
	for _, h := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(port))))
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			ps.bindErr = fmt.Errorf("opening health-check port %d: %w", port, err)
			s.log.Error("health-check port not served", "port", port, "error", err)
			return ps
		}
		listeners = append(listeners, s.conns.Listen(ln))
	}
	for _, ln := range listeners {
		go func() {
			if err := ps.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health-check port stopped", "port", port, "error", err)
			}
		}()
	}
	return ps
}

func (ps *portServer) close() {
	if ps.http != nil {
		ps.http.Shutdown(context.Background())
	}
}

// answer writes kube-proxy's health-check response, byte for byte.
func (s *Services) answer(w http.ResponseWriter, svc *Service) {
	healthy := s.proxyHealthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(svc.LocalReady))
	w.WriteHeader(Verdict(svc.LocalReady, healthy, s.drained.Load()))
	fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		svc.Namespace, svc.Name, svc.LocalReady, healthy)
}

// Close closes every listener.
func (s *Services) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, ps := range s.servers {
		ps.close()
		delete(s.servers, port)
	}
}

func sameAddrs(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
