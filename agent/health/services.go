package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
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

	mu      sync.Mutex // guards the fields below, up to drained
	addrs   []netip.Addr
	servers map[uint16]*portServer
	// checks are the services' health checks by "namespace/name"; each
	// port answers for its holder, the first service to ask for it (the
	// others are told the port is taken).
	checks  map[string]Service
	holders map[uint16]string
	// failing are the services whose port is not served (taken, or not
	// opened): weir_service_health_bind_errors.
	failing map[string]bool
	// drained makes every port answer 503.
	drained atomic.Bool
	// conns bounds the connections every port together holds.
	conns *ConnLimit
}

// SetDrained makes every health-check port answer 503 (or not).
func (s *Services) SetDrained(drained bool) { s.drained.Store(drained) }

type portServer struct {
	svc  atomic.Pointer[Service] // swapped on every sync; read per request
	http *http.Server
	// listeners are the port's, by address ("" for every address).
	listeners map[string]net.Listener
	bindErr   error
}

// NewServices returns listeners that answer 503 whenever proxyHealthy says
// the agent is not keeping up, and hold connections within limits, every
// port together.
func NewServices(proxyHealthy func() bool, limits Limits, log *slog.Logger, reg prometheus.Registerer) *Services {
	s := &Services{
		proxyHealthy: proxyHealthy,
		log:          log,
		servers:      map[uint16]*portServer{},
		checks:       map[string]Service{},
		holders:      map[uint16]string{},
		failing:      map[string]bool{},
		conns:        NewConnLimit("service_health_checks", limits),
		bindErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_service_health_bind_errors",
			Help: "Health-check node ports that could not be opened.",
		}),
	}
	if reg != nil {
		reg.MustRegister(s.bindErrors, s.conns)
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
// new counts at once. It returns every service's result.
func (s *Services) Sync(addrs []netip.Addr, services []Service) map[string]Result {
	s.mu.Lock()
	want := make(map[string]bool, len(services))
	for _, svc := range services {
		want[svc.Namespace+"/"+svc.Name] = true
	}
	var gone []string
	for key := range s.checks {
		if !want[key] {
			gone = append(gone, key)
		}
	}
	s.mu.Unlock()
	results := s.Update(addrs, services, gone)
	for key := range results {
		if !want[key] {
			delete(results, key)
		}
	}
	return results
}

// Update changes the health checks of the services named alone: set are
// new or changed, gone (by "namespace/name") have none any more. Every
// other service keeps its listener and answer, so that a change costs the
// same with a thousand health checks as with one. New addrs move every
// port to them, address by address: a port keeps its listener, and its
// connections, on an address the node keeps. It returns the result of
// every service whose result may have changed: those named, those that
// took over a port another let go, and those whose port could not be
// opened before (tried again, since whatever held the port may have let
// it go).
func (s *Services) Update(addrs []netip.Addr, set []Service, gone []string) map[string]Result {
	// The steps below are called with s.mu held.
	s.mu.Lock()
	defer s.mu.Unlock()
	results := map[string]Result{}
	// ports whose holder may change, or whose listeners may have to.
	ports := map[uint16]bool{}
	s.followAddrs(addrs, ports, results)
	for _, key := range gone {
		s.release(key, ports)
		results[key] = Result{}
	}
	s.record(set, ports)
	s.assignHolders(set, ports)
	for port := range ports {
		s.serve(port)
	}
	// The results of every service on a port looked at.
	for key := range s.failing {
		results[key] = Result{}
	}
	for _, svc := range set {
		results[svc.Namespace+"/"+svc.Name] = Result{}
	}
	s.checkResults(results)
	return results
}

// followAddrs moves every port to the node's new addresses, if they
// changed; every service's result may then change.
func (s *Services) followAddrs(addrs []netip.Addr, ports map[uint16]bool, results map[string]Result) {
	if sameAddrs(addrs, s.addrs) {
		return
	}
	for port := range s.servers {
		ports[port] = true
	}
	for key := range s.checks {
		results[key] = Result{}
	}
	s.addrs = addrs
}

// release gives up key's health check, and the port it held.
func (s *Services) release(key string, ports map[uint16]bool) {
	if old, ok := s.checks[key]; ok {
		delete(s.checks, key)
		if s.holders[old.Port] == key {
			delete(s.holders, old.Port)
		}
		ports[old.Port] = true
	}
	delete(s.failing, key)
}

// record keeps the new or changed health checks; one that moves to
// another port gives up its old one.
func (s *Services) record(set []Service, ports map[uint16]bool) {
	for _, svc := range set {
		key := svc.Namespace + "/" + svc.Name
		if old, ok := s.checks[key]; ok && old.Port != svc.Port {
			s.release(key, ports)
		}
		s.checks[key] = svc
		ports[svc.Port] = true
	}
}

// assignHolders gives every free port to a service that asks for it: a
// port let go passes first to a service that waits for it, found among
// the failing (which hold every service refused a taken port), then to a
// service of set, the first to ask.
func (s *Services) assignHolders(set []Service, ports map[uint16]bool) {
	for key := range s.failing {
		ports[s.checks[key].Port] = true
	}
	for key := range s.failing {
		if port := s.checks[key].Port; ports[port] && s.holders[port] == "" {
			s.holders[port] = key
		}
	}
	for _, svc := range set {
		key := svc.Namespace + "/" + svc.Name
		if s.holders[svc.Port] == "" {
			s.holders[svc.Port] = key
		}
	}
}

// serve makes port answer for its holder, or closes it when it has none.
func (s *Services) serve(port uint16) {
	key, held := s.holders[port]
	ps := s.servers[port]
	if !held {
		if ps != nil {
			ps.close()
			delete(s.servers, port)
		}
		return
	}
	if ps == nil {
		ps = s.newPortServer()
		s.servers[port] = ps
	}
	// Open what is missing: the port is new, the node has new addresses,
	// or an address failed before (whatever held the port there may have
	// let it go).
	s.listen(ps, port)
	svc := s.checks[key]
	ps.svc.Store(&svc)
}

// checkResults fills in the results of the services still checked: an
// error when another holds their port or it could not be opened; those
// failing are counted in weir_service_health_bind_errors.
func (s *Services) checkResults(results map[string]Result) {
	for key := range results {
		svc, ok := s.checks[key]
		if !ok {
			continue
		}
		var err error
		switch holder := s.holders[svc.Port]; {
		case holder != key:
			other := s.checks[holder]
			err = fmt.Errorf("port %d is the health-check port of %s/%s too", svc.Port, other.Namespace, other.Name)
		case s.servers[svc.Port].bindErr != nil:
			err = s.servers[svc.Port].bindErr
		}
		results[key] = Result{Err: err}
		if err != nil {
			s.failing[key] = true
		} else {
			delete(s.failing, key)
		}
	}
	if len(s.failing) == 0 {
		// A new map: an emptied one keeps its size, and is walked at
		// every update.
		s.failing = map[string]bool{}
	}
	s.bindErrors.Set(float64(len(s.failing)))
}

// newPortServer returns a port's server, listening nowhere yet.
func (s *Services) newPortServer() *portServer {
	ps := &portServer{listeners: map[string]net.Listener{}}
	ps.http = s.conns.Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		svc := ps.svc.Load()
		s.answer(w, svc)
	}))
	return ps
}

// listen makes ps listen on port on the node's addresses (every address
// when it has none), keeping the listeners it has on them: a balancer
// probing an address the node keeps must not be refused, nor lose its
// connection, because another address came or went. Listeners on
// addresses gone are closed first (one on every address would keep the
// port from being opened on one). A failure on any address is the port's
// error (a balancer probing that address gets no answer); the addresses
// opened keep answering.
func (s *Services) listen(ps *portServer, port uint16) {
	hosts := []string{""}
	if len(s.addrs) > 0 {
		hosts = hosts[:0]
		for _, a := range s.addrs {
			hosts = append(hosts, a.String())
		}
	}
	for h, ln := range ps.listeners {
		if !slices.Contains(hosts, h) {
			ln.Close()
			delete(ps.listeners, h)
		}
	}
	ps.bindErr = nil
	for _, h := range hosts {
		if ps.listeners[h] != nil {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(port))))
		if err != nil {
			if ps.bindErr == nil {
				ps.bindErr = fmt.Errorf("opening health-check port %d: %w", port, err)
			}
			s.log.Error("health-check port not served", "port", port, "error", err)
			continue
		}
		lim := s.conns.Listen(ln)
		ps.listeners[h] = lim
		go func() {
			// A listener closed here, its address gone, ends its Serve
			// with net.ErrClosed; the port itself serves on.
			if err := ps.http.Serve(lim); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				s.log.Error("health-check port stopped", "port", port, "error", err)
			}
		}()
	}
}

// close stops serving the port. The listeners are closed here, not left
// to Shutdown: a Serve goroutine not started yet would close its listener
// later, and the port could not be opened again at once.
func (ps *portServer) close() {
	for _, ln := range ps.listeners {
		ln.Close()
	}
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
