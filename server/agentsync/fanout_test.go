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

// A node joining the ring changes every node's place on it: the others
// are sent their node again, with the new ring size and next nodes; a
// change that leaves the ring alone (a label on another node) sends them
// nothing.
func TestRingChangesReachEveryNode(t *testing.T) {
	reg := registrytest.Open(t)
	node := func(name string, last byte) *model.Node {
		return &model.Node{Meta: model.Meta{Name: name}, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, last})}}
	}
	for i, name := range []string{"n1", "n3"} {
		if _, err := reg.Nodes.Create(node(name, byte(11+2*i))); err != nil {
			t.Fatal(err)
		}
	}
	h := New(reg, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	client := h.cache.Connect("n1")
	defer client.Close()
	if full := client.Full(); full.GetNode().GetFlowRingSize() != 2 || full.GetNode().GetFlowPeers()[0].GetName() != "n3" {
		t.Fatalf("n1 before: %v", full.GetNode())
	}

	added, err := reg.Nodes.Create(node("n2", 12))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.catchUp(ctx, added.ResourceVersion); err != nil {
		t.Fatal(err)
	}
	msg, _ := client.Next()
	got := msg.GetNode()
	if got.GetFlowRingSize() != 3 || len(got.GetFlowPeers()) != 2 || got.GetFlowPeers()[0].GetName() != "n2" || got.GetFlowPeers()[1].GetName() != "n3" {
		t.Fatalf("n1 after n2 joined: %v", got)
	}

	labelled := node("n3", 13)
	labelled.Labels = map[string]string{"rack": "r2"}
	labelled.ResourceVersion = 0
	updated, err := reg.Nodes.Update(labelled)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.catchUp(ctx, updated.ResourceVersion); err != nil {
		t.Fatal(err)
	}
	if msg, _ := client.Next(); msg.GetNode() != nil {
		t.Errorf("a label on n3 sent n1 its node again: %v", msg.GetNode())
	}
}
