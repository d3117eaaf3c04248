package agentsync

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weirlb/weir/server/agentsync/cache"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// An agent that takes its first state while a batch of removals is being
// worked out, with no other agent connected and the removal log past its
// limit, must still be sent the batch's removals: the log may forget only
// what every connected agent has been sent. (The floor was once read
// before the cache was locked: an agent joining in between was sent the
// state before the batch, and the batch's removals were forgotten, so it
// kept forwarding deleted services.)
func TestAnAgentJoiningDuringABatchIsSentItsRemovals(t *testing.T) {
	reg := registrytest.Open(t)
	svc := func(name, ip string) *model.Service {
		return &model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.ClusterIP,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	}
	for _, s := range []*model.Service{svc("a", "10.96.0.10"), svc("b", "10.96.0.11")} {
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	h := New(reg, Config{RemovalLogLimit: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go h.Run(ctx)

	// One removal in the log: at its limit, not past it.
	rev, err := reg.Services.Delete("shop/b", 0, model.SourceNative)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.catchUp(ctx, rev); err != nil {
		t.Fatal(err)
	}

	// The next batch removes a; the agent joins just before the cache
	// takes the batch, as a session does (registered, then sent a whole
	// state).
	var client *cache.Client
	joined := make(chan uint64, 1)
	beforeCacheUpdate = func() {
		beforeCacheUpdate = nil
		client = h.cache.Connect("n1")
		joined <- client.Full().GetVersion()
	}
	defer func() { beforeCacheUpdate = nil }()
	rev, err = reg.Services.Delete("shop/a", 0, model.SourceNative)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.catchUp(ctx, rev); err != nil {
		t.Fatal(err)
	}
	var first uint64
	select {
	case first = <-joined:
	default:
		t.Fatal("the agent did not join during the batch")
	}
	if first >= rev {
		t.Fatalf("the agent's first state is at %d, the batch's removal at %d: the interleaving was not forced", first, rev)
	}

	msg, _ := client.Next()
	if !slices.Contains(msg.GetRemovals(), "shop/a") {
		t.Fatalf("the agent sent the state at %d is then sent %v; want the removal of shop/a (at %d)", first, msg, rev)
	}
}
