package agentsync

import (
	"context"
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
	"github.com/weirlb/weir/test/wait"
)

// MinSyncPeriod, as kube-proxy's minSyncPeriod: a lone change goes out at
// once, a change right after it waits out the period, and the changes that
// come meanwhile go out with it, as one batch.
func TestMinSyncPeriodCoalescesBursts(t *testing.T) {
	reg := registrytest.Open(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	h := New(reg, Config{MinSyncPeriod: time.Second, Clock: clk})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	client := h.cache.Connect("n1")
	defer client.Close()
	client.Full()

	create := func(name, ip string) uint64 {
		t.Helper()
		svc, err := reg.Services.Create(&model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.ClusterIP,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster})
		if err != nil {
			t.Fatal(err)
		}
		return svc.ResourceVersion
	}
	// Alone: at once, without the clock moving.
	first := create("a", "10.96.0.10")
	if err := h.catchUp(ctx, first); err != nil {
		t.Fatalf("a lone change did not go out at once: %v", err)
	}
	msg, _ := client.Next()
	if len(msg.GetUpserts()) != 1 {
		t.Fatalf("first batch %v; want shop/a", msg)
	}
	// Right after: held until the period is over, with what follows.
	create("b", "10.96.0.11")
	last := create("c", "10.96.0.12")
	wait.Until(t, 10*time.Second, "the fanout waits out the period", clk.HasWaiters)
	if v := h.Version(); v >= last {
		t.Fatalf("the cache took revision %d before the period was over", v)
	}
	clk.Step(time.Second)
	if err := h.catchUp(ctx, last); err != nil {
		t.Fatal(err)
	}
	msg, _ = client.Next()
	if len(msg.GetUpserts()) != 2 || msg.GetVersion() != last {
		t.Fatalf("second batch %v; want shop/b and shop/c together at %d", msg, last)
	}
}
