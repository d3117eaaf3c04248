package kubernetes

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry/registrytest"
	"github.com/weirlb/weir/test/wait"
)

// reportFakes are the reporter's nodes, counting its rounds, and what
// it writes to the services.
type reportFakes struct {
	mu        sync.Mutex
	nodes     []observed.Node
	rounds    int
	announced []Announcement
}

func (f *reportFakes) Status() []observed.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rounds++
	return slices.Clone(f.nodes)
}

func (f *reportFakes) setNode(connected bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = []observed.Node{{Node: "node1", Connected: connected, SentVersion: 1, AppliedVersion: 1,
		Health: observed.Health{LivezCode: 200, NodeEligible: true}}}
}

func (f *reportFakes) WriteAnnounced(_ context.Context, _ *model.Service, a Announcement) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.announced = append(f.announced, a)
	return nil
}

func (f *reportFakes) WriteConflict(context.Context, *model.Service, string) error { return nil }
func (f *reportFakes) ClearConditions(context.Context, *model.Service) error       { return nil }

func (f *reportFakes) CustomPools() []*v1alpha1.WeirAddressPool  { return nil }
func (f *reportFakes) CustomPeers() []*v1alpha1.WeirBGPPeer      { return nil }
func (f *reportFakes) CustomRefused(resource, name string) error { return nil }
func (f *reportFakes) WriteCustomStatus(context.Context, string, metav1.Object, any) error {
	return nil
}

func (f *reportFakes) said() []Announcement {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.announced)
}

func (f *reportFakes) roundsDone() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rounds
}

// A service's Announced condition is written once its announcement held
// for Settle, rounds Period apart by the reporter's clock; an
// announcement that changes before then is not told, and the one after
// it only once it held for Settle in turn.
func TestReporterTellsOnlyWhatHeldForSettle(t *testing.T) {
	reg := registrytest.Open(t)
	// The service's address is of Weir's pool: Weir assigned it.
	pool, _ := model.ParseAddressRange("203.0.113.220/32")
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: []model.AddressRange{pool}}); err != nil {
		t.Fatal(err)
	}
	svc := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "web", Source: model.SourceKubernetes}, Type: model.LoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.220")}}
	if _, err := reg.Services.Create(svc); err != nil {
		t.Fatal(err)
	}
	f := &reportFakes{}
	f.setNode(true)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	r := NewReporter(ReporterConfig{Registry: reg, Status: f, Services: f, Custom: f, Clock: clk,
		Period: time.Second, Settle: 3 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	rounds := 0
	// round lets one more round run, a Period later, and returns what was
	// written so far.
	round := func() []Announcement {
		t.Helper()
		wait.Until(t, 5*time.Second, "the reporter waiting for its next round", clk.HasWaiters)
		clk.Step(time.Second)
		rounds++
		wait.Until(t, 5*time.Second, "a round", func() bool { return f.roundsDone() == rounds && clk.HasWaiters() })
		return f.said()
	}
	received := Announcement{Lines: []string{"203.0.113.220 received by node1"}}
	for i := range 3 {
		if said := round(); len(said) != 0 {
			t.Fatalf("round %d, %v after the announcement was first seen: told %+v; want nothing before Settle", i+1, time.Duration(i)*time.Second, said)
		}
	}
	if diff := cmp.Diff([]Announcement{received}, round()); diff != "" {
		t.Fatalf("after Settle (-want +told):\n%s", diff)
	}
	// The node goes and comes back within Settle: its absence is not
	// told.
	f.setNode(false)
	round()
	f.setNode(true)
	for range 5 {
		if slices.ContainsFunc(round(), missing) {
			t.Fatal("a blink shorter than Settle was told")
		}
	}
	// The node goes for good: told once that held for Settle, and once.
	f.setNode(false)
	for range 3 {
		if slices.ContainsFunc(round(), missing) {
			t.Fatal("a change told before it held for Settle")
		}
	}
	said := round()
	if !missing(said[len(said)-1]) {
		t.Fatalf("after the node went for Settle, told %+v; want the address missing", said)
	}
	for range 3 {
		if again := round(); len(again) != len(said) {
			t.Fatalf("an unchanged announcement told again: %+v", again)
		}
	}
}

func missing(a Announcement) bool { return a.Missing }
