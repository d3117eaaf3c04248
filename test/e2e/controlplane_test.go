package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/store"
	"github.com/weirlb/weir/test/weirlab"
)

// TestNoStateCutsANodeOffItsServer gives the nodes the worst state a
// careless hand could write before Weir checked it, stored as an older
// version would have left it: a service range of every address
// (0.0.0.0/0, ::/0), and a service whose cluster IP and port are
// weir-server's, with no endpoint. Through two server restarts (each a new
// connection from every agent) the agents reconnect, the hostile
// service's deletion reaches them, the nodes' /healthz and host services
// answer, pods reach each other, and services still work.
func TestNoStateCutsANodeOffItsServer(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	createWeb(t, c)
	node1 := c.Nodes[0]

	// A host service on node1, outside every Weir port.
	host := netip.AddrPortFrom(node1.IPv4, 2222)
	acceptOn(t, node1.Netns, host)

	// The hostile service goes into the server's store while it is down,
	// as an older version would have left it.
	if err := c.Server.Stop(); err != nil {
		t.Fatal(err)
	}
	server := weirlab.ServerAddr(0)
	hostileRev := storeUnchecked(t, c.DataDir, &model.ServiceCIDR{
		Meta:  model.Meta{Name: "everything", Source: model.SourceNative, CreateTime: time.Now().UTC()},
		CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
	}, &model.Service{
		Meta: model.Meta{Namespace: "default", Name: "hostile", Source: model.SourceNative, CreateTime: time.Now().UTC()},
		Type: model.ClusterIP, ClusterIPs: []netip.Addr{server.Addr()},
		Ports:                 []model.ServicePort{{Name: "grpc", Protocol: model.TCP, Port: int32(server.Port())}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster,
	})
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitEveryNodeProgrammed(t, c, "the hostile service", hostileRev)
	// The control: a process on node1 other than the agent connecting
	// to the server's address and port is refused by that state.
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if conn, err := node1.Netns.DialContext(dctx, "tcp", server.String()); err == nil {
		conn.Close()
		t.Fatal("node1 reaches the server's address past the hostile service: the test shows nothing")
	}
	cancel()

	// Every agent dials anew.
	if err := c.Server.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	del, err := c.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "hostile"})
	if err != nil {
		t.Fatal(err)
	}
	delRev := del.GetRevision()
	waitEveryNodeProgrammed(t, c, "the hostile service's deletion", delRev)

	eventually(t, "node1's /healthz answers the router", func() error {
		resp, err := c.Router.HTTPClient(2 * time.Second).Get(fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(node1.IPv4, 10256)))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	dctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := c.Client.DialContext(dctx, "tcp", host.String())
	if err != nil {
		t.Fatalf("a host service on node1: %v; want it reached", err)
	}
	conn.Close()
	sample(t, node1.Pods[0].Netns, netip.AddrPortFrom(clusterIPv4, 80), 3)
	n2p1 := c.Nodes[1].Pods[0]
	if _, err := weirlab.Get(ctx, node1.Pods[0].Netns, netip.AddrPortFrom(n2p1.IPv4, weirlab.PodPort)); err != nil {
		t.Errorf("a pod of node1 reaching a pod of node2: %v", err)
	}
}

// storeUnchecked writes a ServiceCidr and a service into a stopped
// server's store in one commit, without the registry's checks, and returns
// the revision that holds them.
func storeUnchecked(t *testing.T, dataDir string, cidr *model.ServiceCIDR, svc *model.Service) uint64 {
	t.Helper()
	st, err := store.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	base, err := st.Load(func(string, string, uint64, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var ops []store.Op
	for _, o := range []struct {
		kind string
		obj  model.Object
	}{{"servicecidrs", cidr}, {"services", svc}} {
		o.obj.GetMeta().ResourceVersion = base + 1
		value, err := json.Marshal(o.obj)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, store.Op{Kind: o.kind, Key: o.obj.GetMeta().Key(), Value: value})
	}
	rev, err := st.Commit(base, ops...)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}
