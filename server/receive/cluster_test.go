package receive_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/receive"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// ClusterOf holds what one read saw: a drain made after it does not
// change what the cluster says of the node, and only the services with
// load-balancer IPs are in it.
func TestClusterOfIsOneRead(t *testing.T) {
	reg := registrytest.Open(t)
	svc := func(name, clusterIP, vip string) *model.Service {
		s := &model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.LoadBalancer,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		if vip != "" {
			s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(vip)}
		}
		return s
	}
	for _, obj := range []model.Object{
		&model.Node{Meta: model.Meta{Name: "n1"}, Addresses: []netip.Addr{netip.MustParseAddr("198.51.100.1")}},
		&model.AddressPool{Meta: model.Meta{Name: "public"},
			Ranges: []model.AddressRange{{First: netip.MustParseAddr("192.0.2.100"), Last: netip.MustParseAddr("192.0.2.110")}}},
		svc("web", "10.96.0.10", "192.0.2.100"), svc("pending", "10.96.0.11", ""),
	} {
		if _, _, err := reg.Apply([]model.Object{obj}, false); err != nil {
			t.Fatal(err)
		}
	}
	var c receive.Cluster
	reg.Read(func(v registry.View) { c = receive.ClusterOf(v, []observed.Node{{Node: "n1"}}) })
	if _, _, err := reg.Drain("n1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if c.Aside("n1").Drained {
		t.Error("a drain made after the read is in the cluster it read")
	}
	if !reg.Aside("n1").Drained {
		t.Fatal("the drain was not made")
	}
	if len(c.Nodes) != 1 || c.Nodes[0].Name != "n1" {
		t.Errorf("nodes %v; want n1", c.Nodes)
	}
	if len(c.Services) != 1 || c.Services[0].Name != "web" {
		t.Errorf("services %v; want web alone, the one with a load-balancer IP", c.Services)
	}
}
