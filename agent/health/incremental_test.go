package health

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/report"
)

// TestAgentFollowsChangesAsAWholeStateWould: over random states handed
// over as changes (Changed naming the services that differ), with
// drains, applies that come or not and a proxy that goes stale, the
// agent's reports (the full one, and the changes the server adds up) and
// the count each health-check port answers with are what working them
// out from the whole state gives at every step.
func TestAgentFollowsChangesAsAWholeStateWould(t *testing.T) {
	const names = 12
	for seed := range uint64(4) {
		ports := distinctPorts(t, rand.New(rand.NewPCG(seed, 8)), names)
		rng := rand.New(rand.NewPCG(seed, 7))
		a := NewAgent(time.Minute, ServiceLimits, slog.New(slog.DiscardHandler), nil)
		stale := false
		a.Node.now = func() time.Time {
			if stale {
				return time.Now().Add(time.Hour)
			}
			return time.Now()
		}
		services := map[datapath.ServiceKey]*datapath.Service{}
		served := map[string]int{} // the reference's counts served
		server := map[string]report.ServiceReport{}
		// want is every service's report, worked out from the whole state.
		want := func(drained bool) []report.ServiceReport {
			healthy := a.Node.Status().Healthy
			var out []report.ServiceReport
			for key, svc := range services {
				r := localCounts(svc)
				r.Namespace, r.Name = key.Namespace, key.Name
				if svc.ExternalTrafficPolicy == datapath.Local && svc.HealthCheckNodePort != 0 {
					r.HealthCheckNodePort = svc.HealthCheckNodePort
					r.HealthCheckCode = Verdict(served[key.String()], healthy, drained)
				}
				if r.LocalReady+r.LocalServing+r.LocalTerminating > 0 || r.HealthCheckNodePort != 0 {
					out = append(out, r)
				}
			}
			return out
		}
		byName := cmpopts.SortSlices(func(x, y report.ServiceReport) bool { return x.Name < y.Name })
		checkServed := func(at string) {
			t.Helper()
			a.Services.mu.Lock()
			defer a.Services.mu.Unlock()
			got := map[string]int{}
			for port, ps := range a.Services.servers {
				if ps.bindErr != nil {
					t.Fatalf("%s: port %d: %v", at, port, ps.bindErr)
				}
				svc := ps.svc.Load()
				got[svc.Namespace+"/"+svc.Name] = svc.LocalReady
			}
			if diff := cmp.Diff(served, got, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("%s: counts the ports answer with (-want +got):\n%s", at, diff)
			}
		}
		checkReports := func(at string, drained bool) {
			t.Helper()
			// The changes, added up as the server does, then the whole.
			if r := a.Report(false); r != nil {
				for _, s := range r.Services {
					server[s.Namespace+"/"+s.Name] = s
				}
				for _, key := range r.Removed {
					delete(server, key)
				}
			}
			if diff := cmp.Diff(want(drained), slices.Collect(maps.Values(server)), byName, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("%s: reported changes add up to (-want +got):\n%s", at, diff)
			}
			if rand.IntN(4) == 0 {
				r := a.Report(true)
				if diff := cmp.Diff(want(drained), r.Services, byName, cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("%s: full report (-want +got):\n%s", at, diff)
				}
				clear(server)
				for _, s := range r.Services {
					server[s.Namespace+"/"+s.Name] = s
				}
			}
		}
		for step := range 150 {
			at := fmt.Sprintf("seed %d, step %d", seed, step)
			drained := rng.IntN(10) == 0
			st := datapath.NodeState{Node: datapath.NodeInfo{Addresses: loopback, Drained: drained}, Changed: []datapath.ServiceKey{}}
			for range rng.IntN(4) {
				i := rng.IntN(names)
				key := datapath.ServiceKey{Namespace: "default", Name: fmt.Sprintf("s%d", i)}
				st.Changed = append(st.Changed, key)
				if rng.IntN(4) == 0 {
					delete(services, key)
					continue
				}
				svc := &datapath.Service{Key: key, Ports: []datapath.ServicePort{{Protocol: datapath.TCP, Port: 80}}}
				if rng.IntN(3) > 0 {
					svc.ExternalTrafficPolicy = datapath.Local
				}
				if rng.IntN(3) > 0 {
					svc.HealthCheckNodePort = ports[i]
				}
				for j := range rng.IntN(4) {
					svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, datapath.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(j)}),
						Local: rng.IntN(3) > 0, Ready: rng.IntN(3) > 0, Serving: rng.IntN(2) > 0, Terminating: rng.IntN(4) == 0})
				}
				services[key] = svc
			}
			if rng.IntN(15) == 0 {
				st.Changed = nil
			}
			st.Services = maps.Clone(services)
			// The reference's counts: down at once, up when applied.
			checks := map[string]int{}
			for key, svc := range services {
				if svc.ExternalTrafficPolicy == datapath.Local && svc.HealthCheckNodePort != 0 {
					ready := localCounts(svc).LocalReady
					checks[key.String()] = ready
				}
			}
			for key := range served {
				if _, ok := checks[key]; !ok {
					delete(served, key)
				}
			}
			for key, ready := range checks {
				served[key] = min(ready, served[key])
			}
			stale = rng.IntN(8) == 0
			a.Received(st)
			checkServed(at + ", received")
			checkReports(at+", received", drained)
			if rng.IntN(4) > 0 {
				a.Applied(time.Millisecond)
				maps.Copy(served, checks)
				checkServed(at + ", applied")
				checkReports(at+", applied", drained)
			}
		}
		a.Services.Close()
	}
}

// TestAPortLetGoPassesToTheServiceWaitingForIt: of two services asking
// for one health-check port, the second is refused while the first holds
// it, and serves it once the first lets go, though it did not change.
func TestAPortLetGoPassesToTheServiceWaitingForIt(t *testing.T) {
	s := NewServices(func() bool { return true }, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer s.Close()
	port := freePort(t)
	if res := s.Update(loopback, []Service{{Namespace: "a", Name: "first", Port: port, LocalReady: 1}}, nil)["a/first"]; res.Err != nil {
		t.Fatalf("the first service on a free port: %v", res.Err)
	}
	results := s.Update(loopback, []Service{{Namespace: "b", Name: "second", Port: port, LocalReady: 2}}, nil)
	if err := results["b/second"].Err; err == nil || !strings.Contains(err.Error(), "a/first") {
		t.Fatalf("the second service on a held port: %v, want an error naming a/first", err)
	}
	results = s.Update(loopback, nil, []string{"a/first"})
	if res, ok := results["b/second"]; !ok || res.Err != nil {
		t.Fatalf("after the holder went, the waiting service's result is %v (given: %v), want served", res.Err, ok)
	}
	if w := get(t, port, "/").headers.Get("X-Load-Balancing-Endpoint-Weight"); w != "2" {
		t.Errorf("the port answers with weight %s, want the second service's 2", w)
	}
}

// distinctPorts finds n ports free on every address, all different, below
// the range the kernel takes source ports from (so that no connection of
// another process takes one before the test opens it).
func distinctPorts(t *testing.T, rng *rand.Rand, n int) []uint16 {
	t.Helper()
	var ports []uint16
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			t.Fatal("no free ports below 32768")
		}
		port := uint16(20000 + rng.IntN(12000))
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			continue
		}
		held = append(held, ln)
		ports = append(ports, port)
	}
	return ports
}
