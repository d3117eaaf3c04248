package datapath

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// Each row of docs/kube-proxy.md's masquerading table, traced through the
// rules: where the connection goes and which of its endpoints see the
// node's address.
func TestMasqueradingFollowsTheRules(t *testing.T) {
	ctx := context.Background()
	local, remote := "10.244.1.11:8080", "10.244.2.11:8080"
	both := []string{local, remote}
	ext := netip.MustParseAddr("198.51.100.20")
	cluster := netip.AddrPortFrom(clusterIP, 80)
	lb := netip.AddrPortFrom(lbIP, 80)
	extIP := netip.MustParseAddrPort("192.0.2.200:80")
	nodePort := netip.AddrPortFrom(nodeAddr, 30080)
	clusterCIDRs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}

	kubeProxy := Config{ClusterCIDRs: clusterCIDRs}
	preserve := Config{ClusterCIDRs: clusterCIDRs, Masquerade: MasqueradePreserveLocal}
	all := Config{ClusterCIDRs: clusterCIDRs, MasqueradeAll: true}
	pod := func(a string) packet { return packet{src: netip.MustParseAddr(a), iif: podInterface, proto: "tcp"} }
	outside := packet{src: ext, iif: uplink, proto: "tcp"}
	host := packet{src: nodeAddr, proto: "tcp"}
	to := func(p packet, dst netip.AddrPort) packet { p.dst = dst; return p }

	for _, tc := range []struct {
		name   string
		cfg    Config
		policy TrafficPolicy
		pkt    packet
		want   verdict
	}{
		{"pod to a cluster IP keeps its address", kubeProxy, Cluster, to(pod("10.244.1.50"), cluster), verdict{Endpoints: both}},
		{"a pod from another node too", kubeProxy, Cluster, to(pod("10.244.3.50"), cluster), verdict{Endpoints: both}},
		{"pod reaching itself is masqueraded (hairpin)", kubeProxy, Cluster, to(pod("10.244.1.11"), cluster), verdict{Endpoints: both, Masqueraded: []string{local}}},
		{"outside to a cluster IP: masqueraded", kubeProxy, Cluster, to(outside, cluster), verdict{Endpoints: both, Masqueraded: both}},
		{"outside to an LB IP: masqueraded", kubeProxy, Cluster, to(outside, lb), verdict{Endpoints: both, Masqueraded: both}},
		{"outside to an external IP: masqueraded", kubeProxy, Cluster, to(outside, extIP), verdict{Endpoints: both, Masqueraded: both}},
		{"outside to a node port: masqueraded", kubeProxy, Cluster, to(outside, nodePort), verdict{Endpoints: both, Masqueraded: both}},
		{"pod to an LB IP: masqueraded", kubeProxy, Cluster, to(pod("10.244.1.50"), lb), verdict{Endpoints: both, Masqueraded: both}},
		{"pod to a node port: masqueraded", kubeProxy, Cluster, to(pod("10.244.1.50"), nodePort), verdict{Endpoints: both, Masqueraded: both}},
		{"the node to its node port: masqueraded", kubeProxy, Cluster, to(host, nodePort), verdict{Endpoints: both, Masqueraded: both}},
		// As kube-proxy's nftables mode: node ports are not served on
		// loopback (DNAT from 127.0.0.1 needs route_localnet and SNAT).
		{"the node to 127.0.0.1's node port: not served", kubeProxy, Cluster, to(packet{src: netip.MustParseAddr("127.0.0.1"), proto: "tcp"}, netip.MustParseAddrPort("127.0.0.1:30080")), verdict{}},
		// The node's address is not a pod's: masqueraded as by kube-proxy
		// (to the address its route already chose, mostly).
		{"the node to a cluster IP is outside the cluster", kubeProxy, Cluster, to(host, cluster), verdict{Endpoints: both, Masqueraded: both}},

		{"Local: outside to an LB IP keeps its address, local endpoints only", kubeProxy, Local, to(outside, lb), verdict{Endpoints: []string{local}}},
		{"Local: outside to a node port likewise", kubeProxy, Local, to(outside, nodePort), verdict{Endpoints: []string{local}}},
		{"Local: outside to an external IP likewise", kubeProxy, Local, to(outside, extIP), verdict{Endpoints: []string{local}}},
		{"Local: pod to an LB IP keeps its address, every endpoint", kubeProxy, Local, to(pod("10.244.1.50"), lb), verdict{Endpoints: both}},
		{"Local: the node to an LB IP is masqueraded, every endpoint", kubeProxy, Local, to(host, lb), verdict{Endpoints: both, Masqueraded: both}},
		{"Local: the node to its node port likewise", kubeProxy, Local, to(host, nodePort), verdict{Endpoints: both, Masqueraded: both}},
		// The node's address coming back in on an interface (its own
		// connection looped through a bridge or a namespace).
		{"Local: the node's address arriving from outside likewise", kubeProxy, Local, to(packet{src: nodeAddr, iif: uplink, proto: "tcp"}, lb), verdict{Endpoints: both, Masqueraded: both}},

		{"preserve-local: outside to an LB IP keeps its address on this node", preserve, Cluster, to(outside, lb), verdict{Endpoints: both, Masqueraded: []string{remote}}},
		{"preserve-local: outside to a node port likewise", preserve, Cluster, to(outside, nodePort), verdict{Endpoints: both, Masqueraded: []string{remote}}},
		{"preserve-local: pod to an LB IP keeps its address", preserve, Cluster, to(pod("10.244.1.50"), lb), verdict{Endpoints: both}},
		{"preserve-local: hairpin still masqueraded", preserve, Cluster, to(pod("10.244.1.11"), cluster), verdict{Endpoints: both, Masqueraded: []string{local}}},

		{"masquerade-all: pod to a cluster IP", all, Cluster, to(pod("10.244.1.50"), cluster), verdict{Endpoints: both, Masqueraded: both}},
		{"masquerade-all: the node to a cluster IP", all, Cluster, to(host, cluster), verdict{Endpoints: both, Masqueraded: both}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newConfiguredFakeDatapath(tc.cfg)
			svc := webService(ep("10.244.1.11", true), ep("10.244.2.11", false))
			svc.ExternalIPs = []netip.Addr{extIP.Addr()}
			if tc.policy == Local {
				svc.ExternalTrafficPolicy, svc.HealthCheckNodePort = Local, 31000
			}
			if err := dp.Apply(ctx, nodeState(svc)); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, traceFlow(t, v4, tc.pkt)); diff != "" {
				t.Errorf("%s -> %s (-want +got):\n%s", tc.pkt.src, tc.pkt.dst, diff)
			}
		})
	}
}

func TestMasqueradingIPv6(t *testing.T) {
	dp, _, v6 := newConfiguredFakeDatapath(Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/32")}})
	svc := webService(ep("fd00:244:1::11", true), ep("fd00:244:2::11", false))
	svc.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("2001:db8:100::10")}
	if err := dp.Apply(context.Background(), nodeState(svc)); err != nil {
		t.Fatal(err)
	}
	both := []string{"[fd00:244:1::11]:8080", "[fd00:244:2::11]:8080"}
	for _, tc := range []struct {
		src, iif, dst string
		want          verdict
	}{
		{"fd00:244:1::50", podInterface, "[fd00:96::10]:80", verdict{Endpoints: both}},
		{"2001:db8:ff::2", uplink, "[fd00:96::10]:80", verdict{Endpoints: both, Masqueraded: both}},
		{"2001:db8:ff::2", uplink, "[2001:db8:100::10]:80", verdict{Endpoints: both, Masqueraded: both}},
		{"fd00:244:1::11", podInterface, "[fd00:96::10]:80", verdict{Endpoints: both, Masqueraded: both[:1]}},
	} {
		pkt := packet{src: netip.MustParseAddr(tc.src), iif: tc.iif, proto: "tcp", dst: netip.MustParseAddrPort(tc.dst)}
		if diff := cmp.Diff(tc.want, traceFlow(t, v6, pkt)); diff != "" {
			t.Errorf("%s -> %s (-want +got):\n%s", tc.src, tc.dst, diff)
		}
	}
}

// Which sources count as the cluster's pods: a pod keeps its address to a
// cluster IP and reaches every endpoint of a Local service's LB IP; an
// outside source is masqueraded to the first and sent to local endpoints
// only (or dropped) by the second.
func TestLocalTrafficDetectionModes(t *testing.T) {
	ctx := context.Background()
	cluster := netip.AddrPortFrom(clusterIP, 80)
	lb := netip.AddrPortFrom(lbIP, 80)
	both := []string{"10.244.1.11:8080", "10.244.2.11:8080"}
	asPod := verdict{Endpoints: both}
	asOutside := verdict{Endpoints: both, Masqueraded: both}
	asOutsideLB := verdict{Endpoints: []string{"10.244.1.11:8080"}}
	for _, tc := range []struct {
		name       string
		detect     LocalDetection
		clusterCID []netip.Prefix
		src        string
		iif        string
		cip, lbv   verdict
	}{
		{"ClusterCIDR: a source in the cluster CIDR", LocalDetection{}, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, "10.244.3.5", "eth1", asPod, asPod},
		{"ClusterCIDR: a source outside it", LocalDetection{}, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, "10.9.0.5", podInterface, asOutside, asOutsideLB},
		{"ClusterCIDR without the flag: the node's pod CIDR", LocalDetection{}, nil, "10.244.1.5", podInterface, asPod, asPod},
		{"NodeCIDR: another node's pod is outside", LocalDetection{Mode: DetectNodeCIDR}, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, "10.244.3.5", "eth1", asOutside, asOutsideLB},
		{"NodeCIDR: this node's pod", LocalDetection{Mode: DetectNodeCIDR}, nil, "10.244.1.5", podInterface, asPod, asPod},
		{"BridgeInterface: on the bridge", LocalDetection{Mode: DetectBridgeInterface, Interface: "cbr0"}, nil, "10.9.0.5", "cbr0", asPod, asPod},
		{"BridgeInterface: elsewhere", LocalDetection{Mode: DetectBridgeInterface, Interface: "cbr0"}, nil, "10.244.1.5", "eth0", asOutside, asOutsideLB},
		{"InterfaceNamePrefix: a pod's veth", LocalDetection{Mode: DetectInterfaceNamePrefix, Interface: "veth"}, nil, "10.9.0.5", "veth12ab", asPod, asPod},
		{"InterfaceNamePrefix: elsewhere", LocalDetection{Mode: DetectInterfaceNamePrefix, Interface: "veth"}, nil, "10.244.1.5", "cbr0", asOutside, asOutsideLB},
		// Nothing is local: outside sources are not masqueraded to cluster
		// IPs either (kube-proxy without a detector).
		{"None", LocalDetection{Mode: DetectNone}, nil, "10.244.1.5", podInterface, asPod, asOutsideLB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp, v4, _ := newConfiguredFakeDatapath(Config{LocalDetection: tc.detect, ClusterCIDRs: tc.clusterCID})
			svc := webService(ep("10.244.1.11", true), ep("10.244.2.11", false))
			svc.ExternalTrafficPolicy, svc.HealthCheckNodePort = Local, 31000
			if err := dp.Apply(ctx, nodeState(svc)); err != nil {
				t.Fatal(err)
			}
			src := netip.MustParseAddr(tc.src)
			if diff := cmp.Diff(tc.cip, traceFlow(t, v4, packet{src: src, iif: tc.iif, proto: "tcp", dst: cluster})); diff != "" {
				t.Errorf("to the cluster IP (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.lbv, traceFlow(t, v4, packet{src: src, iif: tc.iif, proto: "tcp", dst: lb})); diff != "" {
				t.Errorf("to the Local service's LB IP (-want +got):\n%s", diff)
			}
		})
	}
}

// A connection to an address of the service ranges that no service holds
// is dropped; one a service holds on a port it does not serve is rejected.
func TestUnallocatedServiceAddressesAreDropped(t *testing.T) {
	dp, v4, _ := newConfiguredFakeDatapath(Config{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}})
	if err := dp.Apply(context.Background(), nodeState(webService(ep("10.244.1.11", true)))); err != nil {
		t.Fatal(err)
	}
	for dst, want := range map[string]verdict{
		"10.96.0.99:80": {Dropped: true},
		"10.96.0.10:81": {Rejected: true},
		"10.97.0.1:80":  {},
		"10.96.0.10:80": {Endpoints: []string{"10.244.1.11:8080"}},
	} {
		if diff := cmp.Diff(want, trace(t, v4, podSource, "tcp", netip.MustParseAddrPort(dst))); diff != "" {
			t.Errorf("to %s (-want +got):\n%s", dst, diff)
		}
	}
}

// The server's service CIDRs (Kubernetes' ServiceCIDR objects) count as
// the flag's do, and follow the node's changes.
func TestServiceCIDRsFromTheServer(t *testing.T) {
	ctx := context.Background()
	dp, v4, _ := newConfiguredFakeDatapath(Config{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}})
	st := nodeState(webService(ep("10.244.1.11", true)))
	st.Node.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16")}
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	for dst, want := range map[string]verdict{"10.96.0.99:80": {Dropped: true}, "10.100.0.1:80": {Dropped: true}, "10.101.0.1:80": {}} {
		if diff := cmp.Diff(want, trace(t, v4, podSource, "tcp", netip.MustParseAddrPort(dst))); diff != "" {
			t.Errorf("to %s (-want +got):\n%s", dst, diff)
		}
	}
	st.Node.ServiceCIDRs = nil
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if got := trace(t, v4, podSource, "tcp", netip.MustParseAddrPort("10.100.0.1:80")); got.Dropped {
		t.Error("a removed service CIDR still drops")
	}
}

func newConfiguredFakeDatapath(cfg Config) (*Datapath, *knftables.Fake, *knftables.Fake) {
	v4 := knftables.NewFake(knftables.IPv4Family, TableName)
	v6 := knftables.NewFake(knftables.IPv6Family, TableName)
	return New(v4, v6, cfg), v4, v6
}

// nodeInfoEqual decides whether the node's elements are worked out again:
// a field it forgets is a change the datapath never programs.
func TestNodeInfoEqualSeesEveryField(t *testing.T) {
	base := NodeInfo{}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		changed := base
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int:
			f.SetInt(1)
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Struct:
			if f.Type() != reflect.TypeFor[time.Time]() {
				t.Fatalf("field %s: struct %s not covered by this test", typ.Field(i).Name, f.Type())
			}
			f.Set(reflect.ValueOf(time.Unix(1, 0)))
		default:
			t.Fatalf("field %s: kind %s not covered by this test", typ.Field(i).Name, f.Kind())
		}
		if nodeInfoEqual(base, changed) {
			t.Errorf("nodeInfoEqual ignores NodeInfo.%s", typ.Field(i).Name)
		}
	}
}
