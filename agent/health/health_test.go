package health

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/report"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/datapath"
)

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// freePort finds a port free on every address, below the range the
// kernel takes source ports from (see distinctPorts). A port the kernel
// hands out for 127.0.0.1:0 may be held on another address meanwhile: a
// connection bound to 127.0.1.1:0, say, takes its port from the same
// range and lingers in TIME_WAIT for a minute after it closes, and the
// agent, told of loopback addresses only, opens its ports on every
// address.
func freePort(t *testing.T) uint16 {
	t.Helper()
	return distinctPorts(t, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), 1)[0]
}

type httpAnswer struct {
	code    int
	headers http.Header
	body    string
}

func get(t *testing.T, port uint16, path string) httpAnswer {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpAnswer{resp.StatusCode, resp.Header, string(b)}
}

func TestServiceHealthCheckAnswersLikeKubeProxy(t *testing.T) {
	healthy := true
	s := NewServices(func() bool { return healthy }, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer s.Close()
	port := freePort(t)
	s.Sync(loopback, []Service{{Namespace: "shop", Name: "cart", Port: port, LocalReady: 2}})

	got := get(t, port, "/any/path")
	wantBody := "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"cart\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	if got.code != 200 || got.body != wantBody {
		t.Errorf("got %d %q, want 200 %q", got.code, got.body, wantBody)
	}
	for h, want := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "X-Load-Balancing-Endpoint-Weight": "2"} {
		if v := got.headers.Get(h); v != want {
			t.Errorf("header %s = %q, want %q", h, v, want)
		}
	}

	s.Sync(loopback, []Service{{Namespace: "shop", Name: "cart", Port: port, LocalReady: 0}})
	if got := get(t, port, "/"); got.code != 503 || got.headers.Get("X-Load-Balancing-Endpoint-Weight") != "0" {
		t.Errorf("no local endpoint: got %d weight %q, want 503 weight 0", got.code, got.headers.Get("X-Load-Balancing-Endpoint-Weight"))
	}
	s.Sync(loopback, []Service{{Namespace: "shop", Name: "cart", Port: port, LocalReady: 1}})
	healthy = false
	if got := get(t, port, "/"); got.code != 503 {
		t.Errorf("agent unhealthy: got %d, want 503", got.code)
	}
	healthy = true

	// The service goes: the port closes.
	s.Sync(loopback, nil)
	if _, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		t.Error("the health-check port is still open after its service went")
	}
}

// TestNodeAddressChangesLeaveTheAddressesThatStayAlone: when the node
// gains or loses an address, a health-check port opens or closes its
// listener there alone. A balancer probing an address the node keeps
// sees no gap, neither a refused probe nor its open connection closed.
func TestNodeAddressChangesLeaveTheAddressesThatStayAlone(t *testing.T) {
	s := NewServices(func() bool { return true }, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer s.Close()
	port := freePort(t)
	one, two := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	cart := []Service{{Namespace: "shop", Name: "cart", Port: port, LocalReady: 1}}
	// A prober's connection, kept open between its probes (HTTP
	// keep-alive), and one probe on it.
	type conn struct {
		net.Conn
		r *bufio.Reader
	}
	dial := func(a netip.Addr) (conn, error) {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(a, port).String(), time.Second)
		if err != nil {
			return conn{}, err
		}
		t.Cleanup(func() { c.Close() })
		return conn{c, bufio.NewReader(c)}, nil
	}
	probe := func(c conn) (int, error) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}
	answers := func(when string, c conn) {
		t.Helper()
		if code, err := probe(c); code != http.StatusOK {
			t.Errorf("%s: a prober's open connection to %s gets %d, %v; want 200", when, c.RemoteAddr(), code, err)
		}
	}

	s.Sync([]netip.Addr{one}, cart)
	first, err := dial(one)
	if err != nil {
		t.Fatal(err)
	}
	answers("one address", first)

	s.Sync([]netip.Addr{one, two}, cart)
	answers("an address added", first)
	second, err := dial(two)
	if err != nil {
		t.Fatalf("an address added: %v", err)
	}
	answers("an address added", second)

	s.Sync([]netip.Addr{two, one}, cart)
	answers("the same addresses in another order", first)
	answers("the same addresses in another order", second)

	s.Sync([]netip.Addr{two}, cart)
	answers("another address gone", second)
	if _, err := dial(one); err == nil {
		t.Errorf("the port still takes connections on %s after the node lost it", one)
	}
}

func TestServiceHealthCheckReportsPortsItCannotOpen(t *testing.T) {
	s := NewServices(func() bool { return true }, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer s.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(taken.Addr().(*net.TCPAddr).Port)
	other := freePort(t)
	results := s.Sync(loopback, []Service{
		{Namespace: "a", Name: "held", Port: port, LocalReady: 1},
		{Namespace: "b", Name: "first", Port: other, LocalReady: 1},
		{Namespace: "c", Name: "second", Port: other, LocalReady: 1},
	})
	if results["a/held"].Err == nil {
		t.Error("a port another process holds was reported as served")
	}
	if (results["b/first"].Err == nil) == (results["c/second"].Err == nil) {
		t.Errorf("two services on one port: want exactly one error, got %v and %v", results["b/first"].Err, results["c/second"].Err)
	}
	// Once the holder lets go, the next sync serves the port.
	taken.Close()
	results = s.Sync(loopback, []Service{{Namespace: "a", Name: "held", Port: port, LocalReady: 1}})
	if results["a/held"].Err != nil || get(t, port, "/").code != 200 {
		t.Errorf("after the port was freed: %v", results["a/held"].Err)
	}
}

func TestNodeHealthz(t *testing.T) {
	now := time.Unix(1000, 0)
	n := NewNode(time.Minute, nil)
	n.now = func() time.Time { return now }
	n.oldestQueue = now
	codes := func() [2]int { h, l := n.Codes(); return [2]int{h, l} }

	now = now.Add(2 * time.Minute)
	if got := codes(); got != [2]int{503, 503} {
		t.Errorf("never synced for longer than the timeout: %v, want 503/503", got)
	}
	n.Updated()
	if got := codes(); got != [2]int{200, 200} {
		t.Errorf("synced: %v, want 200/200", got)
	}
	n.Queued()
	now = now.Add(30 * time.Second)
	if got := codes(); got != [2]int{200, 200} {
		t.Errorf("update waiting 30 s of a 60 s timeout: %v, want 200/200", got)
	}
	now = now.Add(31 * time.Second)
	if got := codes(); got != [2]int{503, 503} {
		t.Errorf("update waiting longer than the timeout: %v, want 503/503", got)
	}
	n.Updated()
	n.SetEligible(false)
	if got := codes(); got != [2]int{503, 200} {
		t.Errorf("node being deleted: %v, want healthz 503, livez 200", got)
	}
}

// cartState is a node state with one Local service, shop/cart, whose
// health-check port is port: ready local endpoints, and one terminating.
func cartState(port uint16, ready int, terminating bool) datapath.NodeState {
	svc := &datapath.Service{Key: datapath.ServiceKey{Namespace: "shop", Name: "cart"},
		ExternalTrafficPolicy: datapath.Local, HealthCheckNodePort: port,
		Ports: []datapath.ServicePort{{Protocol: datapath.TCP, Port: 80}}}
	for i := range ready {
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, datapath.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), Port: 8080, Local: true, Ready: true, Serving: true})
	}
	if terminating {
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, datapath.Endpoint{
			Addr: netip.MustParseAddr("10.244.1.99"), Port: 8080, Local: true, Serving: true, Terminating: true})
	}
	return datapath.NodeState{Node: datapath.NodeInfo{Addresses: loopback},
		Services: map[datapath.ServiceKey]*datapath.Service{svc.Key: svc}}
}

func TestHealthChecksDropAtOnceButRiseOnlyWhenApplied(t *testing.T) {
	a := NewAgent(time.Minute, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer a.Services.Close()
	port := freePort(t)
	// A terminating local endpoint never counts.
	state := func(ready int) datapath.NodeState { return cartState(port, ready, true) }
	weight := func() string { return get(t, port, "/").headers.Get("X-Load-Balancing-Endpoint-Weight") }

	a.Received(state(2))
	if w := weight(); w != "0" {
		t.Errorf("before the first apply: weight %s, want 0", w)
	}
	a.Applied(time.Millisecond)
	if w := weight(); w != "2" {
		t.Errorf("applied: weight %s, want 2", w)
	}
	a.Received(state(0))
	if got := get(t, port, "/"); got.code != 503 {
		t.Errorf("last ready endpoint gone, not yet applied: %d, want 503 at once", got.code)
	}
	a.Applied(time.Millisecond)
	a.Received(state(3))
	if w := weight(); w != "0" {
		t.Errorf("endpoints back but rules not applied: weight %s, want still 0", w)
	}
	a.Applied(time.Millisecond)
	if w := weight(); w != "3" {
		t.Errorf("applied: weight %s, want 3", w)
	}

	r := a.Report(true)
	want := []report.ServiceReport{{Namespace: "shop", Name: "cart", LocalReady: 3, LocalServing: 4, LocalTerminating: 1, HealthCheckNodePort: port, HealthCheckCode: 200}}
	if diff := cmp.Diff(want, r.Services); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if a.Report(false) != nil {
		t.Error("a second report with nothing changed is not empty")
	}
}

// The rule of a service's health answer has one home (Verdict): the code
// the agent reports to the server is, in every state, the code its port
// answers a load balancer.
func TestTheReportedCodeIsWhatThePortAnswers(t *testing.T) {
	for _, tc := range []struct {
		ready          int
		healthy, drain bool
		want           int
	}{{1, true, false, 200}, {0, true, false, 503}, {1, false, false, 503}, {1, true, true, 503}, {0, false, true, 503}} {
		if got := Verdict(tc.ready, tc.healthy, tc.drain); got != tc.want {
			t.Errorf("Verdict(ready %d, healthy %v, drained %v) = %d, want %d", tc.ready, tc.healthy, tc.drain, got, tc.want)
		}
	}

	a := NewAgent(time.Minute, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer a.Services.Close()
	port := freePort(t)
	state := func(ready int) datapath.NodeState { return cartState(port, ready, false) }
	check := func(when string, want int) {
		t.Helper()
		answered := get(t, port, "/").code
		r := a.Report(true)
		if len(r.Services) != 1 || r.Services[0].HealthCheckCode != answered || answered != want {
			t.Errorf("%s: the port answers %d, the report says %+v; want both %d", when, answered, r.Services, want)
		}
	}
	a.Received(state(2))
	a.Applied(time.Millisecond)
	check("ready and applied", 200)
	a.Services.SetDrained(true)
	check("drained", 503)
	a.Services.SetDrained(false)
	check("no longer drained", 200)
	a.Received(state(0))
	check("no ready endpoint", 503)
}

// TestUnrelatedChangesLeaveHealthChecksAlone: a new state that does not
// touch a service must not move its health check, not even for the moment
// between receiving the state and applying it. A balancer probing then
// would mark a healthy node down on every unrelated change.
func TestUnrelatedChangesLeaveHealthChecksAlone(t *testing.T) {
	a := NewAgent(time.Minute, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer a.Services.Close()
	port := freePort(t)
	cart := &datapath.Service{Key: datapath.ServiceKey{Namespace: "shop", Name: "cart"},
		ExternalTrafficPolicy: datapath.Local, HealthCheckNodePort: port,
		Ports: []datapath.ServicePort{{Protocol: datapath.TCP, Port: 80, Endpoints: []datapath.Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.10"), Port: 8080, Local: true, Ready: true, Serving: true}}}}}
	state := func(other int) datapath.NodeState {
		web := &datapath.Service{Key: datapath.ServiceKey{Namespace: "shop", Name: "web"},
			Ports: []datapath.ServicePort{{Protocol: datapath.TCP, Port: 80}}}
		for i := range other {
			web.Ports[0].Endpoints = append(web.Ports[0].Endpoints, datapath.Endpoint{
				Addr: netip.AddrFrom4([4]byte{10, 244, 2, byte(10 + i)}), Port: 8080, Ready: true, Serving: true})
		}
		return datapath.NodeState{Node: datapath.NodeInfo{Addresses: loopback},
			Services: map[datapath.ServiceKey]*datapath.Service{cart.Key: cart, web.Key: web}}
	}
	a.Received(state(1))
	a.Applied(time.Millisecond)
	for other := 2; other < 6; other++ {
		a.Received(state(other))
		if got := get(t, port, "/"); got.code != 200 || got.headers.Get("X-Load-Balancing-Endpoint-Weight") != "1" {
			t.Fatalf("change %d to another service, before it is applied: %d weight %q, want 200 weight 1",
				other, got.code, got.headers.Get("X-Load-Balancing-Endpoint-Weight"))
		}
		a.Applied(time.Millisecond)
	}
}

// TestLivezCarriesNoNodeEligible: kube-proxy's /healthz answer says
// whether the node is eligible; its /livez answer does not.
func TestLivezCarriesNoNodeEligible(t *testing.T) {
	n := NewNode(time.Minute, nil)
	n.Updated()
	h := n.Handler()
	for path, want := range map[string]bool{"/healthz": true, "/livez": false} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, has := body["nodeEligible"]; has != want {
			t.Errorf("%s: nodeEligible present %v, want %v (%s)", path, has, want, rec.Body.String())
		}
		if _, has := body["healthy"]; !has {
			t.Errorf("%s: no healthy field: %s", path, rec.Body.String())
		}
	}
}

func TestReadyzWaitsForTheFirstApplyAndTheGate(t *testing.T) {
	n := NewNode(time.Minute, nil)
	srv := httptest.NewServer(n.Handler())
	defer srv.Close()
	code := func() int {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := code(); c != http.StatusServiceUnavailable {
		t.Errorf("before the first apply: %d, want 503", c)
	}
	n.Updated()
	if c := code(); c != http.StatusOK {
		t.Errorf("after the first apply: %d, want 200", c)
	}
	var gate atomic.Bool
	n.SetReady(gate.Load)
	if c := code(); c != http.StatusServiceUnavailable {
		t.Errorf("with the gate shut: %d, want 503", c)
	}
	gate.Store(true)
	if c := code(); c != http.StatusOK {
		t.Errorf("with the gate open: %d, want 200", c)
	}
}
