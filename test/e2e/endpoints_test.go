package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

func clusterIPService(name string, clusterIPs ...string) *weirv1.Service {
	svc := lbService(name, 0, clusterIPs, nil)
	svc.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP
	svc.Status = nil
	return svc
}

// onlyPod asserts that every connection from ns to dst reaches want.
func onlyPod(t *testing.T, ns *lab.Netns, dst netip.AddrPort, want string) {
	t.Helper()
	eventually(t, dst.String()+" answers", func() error {
		_, err := weirlab.Get(context.Background(), ns, dst)
		return err
	})
	for _, r := range sample(t, ns, dst, 15) {
		if r.Pod != want {
			t.Fatalf("connection from %s to %s reached %s; want only %s", ns, dst, r.Pod, want)
		}
	}
}

// TestEndpointSelection covers, with real connections in both families,
// the choice among endpoints: the serving-terminating fallback, topology,
// and services another proxy owns.
func TestEndpointSelection(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	n1p1, n1p2, n2p1 := c.Nodes[0].Pods[0], c.Nodes[0].Pods[1], c.Nodes[1].Pods[0]
	fams := families("10.96.0.30", "fd00:96::30", "203.0.113.30", "2001:db8:113::30")

	// No ready endpoint: the one still serving while terminating takes
	// the connections; the one that stopped serving takes none.
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: clusterIPService("draining", "10.96.0.30", "fd00:96::30")}); err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		slice := endpointSlices("draining", []*lab.Pod{n1p1, n2p1})[map[string]int{"IPv4": 0, "IPv6": 1}[fam.name]]
		slice.Endpoints[0].Conditions = &weirv1.EndpointConditions{Ready: proto.Bool(false), Serving: proto.Bool(true), Terminating: proto.Bool(true)}
		slice.Endpoints[1].Conditions = &weirv1.EndpointConditions{Ready: proto.Bool(false), Serving: proto.Bool(false), Terminating: proto.Bool(true)}
		if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: slice}); err != nil {
			t.Fatal(err)
		}
		onlyPod(t, n1p2.Netns, netip.AddrPortFrom(fam.clusterIP, 80), n1p1.Name)
	}

	// trafficDistribution PreferClose: node1 is in zone a with n1p1, node2
	// in zone b with n2p1; with the hints the EndpointSlice controller
	// writes, each node keeps connections in its zone.
	for i, zone := range []string{"a", "b"} {
		got, err := c.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: c.Nodes[i].Name})
		if err != nil {
			t.Fatal(err)
		}
		n := got.GetNode()
		n.Zone = zone
		if _, err := c.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	nearby := clusterIPService("close", "10.96.0.31", "fd00:96::31")
	nearby.Spec.TrafficDistribution = weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_CLOSE
	slices := endpointSlices("close", []*lab.Pod{n1p1, n2p1})
	for _, s := range slices {
		s.Endpoints[0].Zone, s.Endpoints[1].Zone = "a", "b"
		s.Endpoints[0].HintZones, s.Endpoints[1].HintZones = []string{"a"}, []string{"b"}
	}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: nearby}); err != nil {
		t.Fatal(err)
	}
	for _, s := range slices {
		if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	for _, fam := range families("10.96.0.31", "fd00:96::31", "203.0.113.31", "2001:db8:113::31") {
		onlyPod(t, n1p2.Netns, netip.AddrPortFrom(fam.clusterIP, 80), n1p1.Name)
		onlyPod(t, n2p1.Netns, netip.AddrPortFrom(fam.clusterIP, 80), n2p1.Name)
	}
	// PreferSameNode: node hints win over zone hints. Both endpoints are
	// hinted for both zones, so zone hints alone would reach both; the
	// node hints keep each node's connections on its own pod.
	sameNode := clusterIPService("samenode", "10.96.0.35", "fd00:96::35")
	nodeHinted := endpointSlices("samenode", []*lab.Pod{n1p1, n2p1})
	for _, s := range nodeHinted {
		s.Endpoints[0].Zone, s.Endpoints[1].Zone = "a", "b"
		s.Endpoints[0].HintZones, s.Endpoints[1].HintZones = []string{"a", "b"}, []string{"a", "b"}
		s.Endpoints[0].HintNodes, s.Endpoints[1].HintNodes = []string{c.Nodes[0].Name}, []string{c.Nodes[1].Name}
	}
	createServiceWithSlices(t, c, sameNode, nodeHinted)
	for _, fam := range families("10.96.0.35", "fd00:96::35", "203.0.113.35", "2001:db8:113::35") {
		onlyPod(t, n1p2.Netns, netip.AddrPortFrom(fam.clusterIP, 80), n1p1.Name)
		onlyPod(t, n2p1.Netns, netip.AddrPortFrom(fam.clusterIP, 80), n2p1.Name)
	}

	// Without hints, PreferClose changes nothing (as kube-proxy, which
	// reads only the hints): both zones' endpoints take connections.
	unhinted := clusterIPService("unhinted", "10.96.0.34", "fd00:96::34")
	unhinted.Spec.TrafficDistribution = weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_CLOSE
	zonedOnly := endpointSlices("unhinted", []*lab.Pod{n1p1, n2p1})
	for _, s := range zonedOnly {
		s.Endpoints[0].Zone, s.Endpoints[1].Zone = "a", "b"
	}
	createServiceWithSlices(t, c, unhinted, zonedOnly)
	seen := map[string]bool{}
	for _, r := range sample(t, n1p2.Netns, netip.MustParseAddrPort("10.96.0.34:80"), 30) {
		seen[r.Pod] = true
	}
	if !seen[n1p1.Name] || !seen[n2p1.Name] {
		t.Errorf("PreferClose without hints reached %v from node1; want both zones' pods", seen)
	}

	// A service labelled for another proxy gets no rules from Weir: its
	// cluster IP is not Weir's to answer or refuse, so a connection to it
	// leaves the node as sent (here to the router, which answers there).
	otherIP := netip.MustParseAddrPort("10.96.0.32:80")
	routerAccepted := answerOnRouter(t, c, otherIP)
	other := clusterIPService("other", "10.96.0.32")
	other.Metadata.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	createService(t, c, other, c.Pods())
	mine := clusterIPService("mine", "10.96.0.33")
	createService(t, c, mine, c.Pods()) // created after: once it answers, "other" was seen too
	eventually(t, "the service created after answers", func() error {
		_, err := weirlab.Get(ctx, n1p2.Netns, netip.MustParseAddrPort("10.96.0.33:80"))
		return err
	})
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := n1p2.Netns.DialContext(dctx, "tcp", otherIP.String())
	if err != nil {
		t.Fatalf("connection to another proxy's cluster IP: %v; want it to leave the node and reach the router", err)
	}
	conn.Close()
	eventually(t, "the router accepts the connection", func() error {
		if n := routerAccepted(); n != 1 {
			return fmt.Errorf("the router accepted %d connections at %s; want the one sent", n, otherIP)
		}
		return nil
	})
}
