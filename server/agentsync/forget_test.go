package agentsync

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// A node deleted from the registry leaves no status and no history behind:
// at once when its agent is away, when its agent's stream ends when it is
// connected (its status shows it connected until then).
func TestADeletedNodeIsForgotten(t *testing.T) {
	reg := registrytest.Open(t)
	for _, n := range []string{"n1", "n2"} {
		if _, err := reg.Nodes.Create(&model.Node{Meta: model.Meta{Name: n}, Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}); err != nil {
			t.Fatal(err)
		}
	}
	h := New(reg, Config{})
	ctx, conn, srv := serve(t, h)
	connect := func(node string) (weirv1.AgentService_SyncClient, context.CancelFunc) {
		t.Helper()
		sctx, scancel := context.WithCancel(ctx)
		st, err := weirv1.NewAgentServiceClient(conn).Sync(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: node}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		return st, scancel
	}
	known := func() []string {
		var out []string
		for _, s := range h.Status() {
			out = append(out, s.Node)
		}
		h.mu.Lock()
		for n, rec := range h.nodes {
			if rec.history != nil {
				out = append(out, "history of "+n)
			}
		}
		h.mu.Unlock()
		slices.Sort(out)
		return out
	}
	eventually := func(what string, want []string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			got := known()
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the hub knows %q, want %q", what, got, want)
			}
		}
	}
	delete := func(node string) {
		t.Helper()
		if _, err := reg.Nodes.Delete(node, 0, model.SourceNative); err != nil {
			t.Fatal(err)
		}
	}

	// n1 connects and leaves; n2 stays connected.
	_, leave := connect("n1")
	leave()
	eventually("n1 left", []string{"history of n1", "n1"})
	connect("n2")
	eventually("n2 connected", []string{"history of n1", "n1", "n2"})

	delete("n1")
	eventually("n1 deleted while away", []string{"n2"})

	delete("n2")
	time.Sleep(100 * time.Millisecond)
	if got := known(); !slices.Equal(got, []string{"n2"}) {
		t.Fatalf("n2 deleted while connected: the hub knows %q; want its status until its stream ends", got)
	}
	srv.Stop() // ends n2's stream
	eventually("n2's stream ended", nil)
}
