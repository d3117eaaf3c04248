package datapath

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestNoStateCutsTheNodeOffItsServer programs what a careless or hostile
// writer could: a cluster IP that is weir-server's address, another that
// is the node's own, and a service range of every address. The agent's
// marked connection to its server still goes straight there, the node's
// host services and the agent's health port still answer, and the rest of
// the state still does what it says.
func TestNoStateCutsTheNodeOffItsServer(t *testing.T) {
	server := netip.MustParseAddrPort("192.0.2.100:7443")
	dp, v4, _ := newConfiguredFakeDatapath(Config{ProtectedPorts: []uint16{10256}})
	serverAsClusterIP := &Service{Key: ServiceKey{"default", "hostile"}, ClusterIPs: []netip.Addr{server.Addr()},
		Ports: []ServicePort{{Name: "grpc", Protocol: TCP, Port: server.Port(), Endpoints: []Endpoint{ep("10.244.1.11", true)}}}}
	nodeAsClusterIP := &Service{Key: ServiceKey{"default", "careless"}, ClusterIPs: []netip.Addr{nodeAddr},
		Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}}
	st := nodeState(serverAsClusterIP, nodeAsClusterIP)
	// Every address as a service range (which the server refuses, but an
	// older version may have stored), beside a true one.
	st.Node.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("10.96.0.0/16")}
	if err := dp.Apply(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	// The control: without the mark, a connection there is the state's.
	if got := traceFlow(t, v4, packet{src: nodeAddr, proto: "tcp", dst: server}); !cmp.Equal(got.Endpoints, []string{"10.244.1.11:8080"}) {
		t.Fatalf("an unmarked connection to the server's address: %+v; want it DNAT'ed, or the test shows nothing", got)
	}
	outside := netip.MustParseAddr("198.51.100.2")
	for _, tc := range []struct {
		name string
		pkt  packet
		want verdict
	}{
		{"the agent's connection to its server", packet{src: nodeAddr, proto: "tcp", dst: server, mark: DefaultControlMark}, verdict{}},
		{"the agent's connection on another port", packet{src: nodeAddr, proto: "tcp", dst: netip.AddrPortFrom(server.Addr(), 9999), mark: DefaultControlMark}, verdict{}},
		{"a probe of the agent's health port", packet{src: outside, iif: "eth0", proto: "tcp", dst: netip.AddrPortFrom(nodeAddr, 10256)}, verdict{}},
		{"ssh to the node", packet{src: outside, iif: "eth0", proto: "tcp", dst: netip.AddrPortFrom(nodeAddr, 22)}, verdict{}},
		// The state still holds where it does not touch the control plane.
		{"the node's address as a frontend with no endpoint", packet{src: outside, iif: "eth0", proto: "tcp", dst: netip.AddrPortFrom(nodeAddr, 80)}, verdict{Rejected: true}},
		{"a pod reaching a pod of another node", packet{src: podSource, iif: interfaceOf(podSource), proto: "tcp", dst: netip.MustParseAddrPort("10.244.2.5:8080")}, verdict{}},
		{"a pod reaching outside the cluster", packet{src: podSource, iif: interfaceOf(podSource), proto: "tcp", dst: netip.MustParseAddrPort("198.51.100.2:443")}, verdict{}},
		{"an address of the true range no service holds", packet{src: podSource, iif: interfaceOf(podSource), proto: "tcp", dst: netip.MustParseAddrPort("10.96.99.99:80")}, verdict{Dropped: true}},
	} {
		if diff := cmp.Diff(tc.want, traceFlow(t, v4, tc.pkt)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}
