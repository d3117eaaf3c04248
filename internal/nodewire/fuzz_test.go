package nodewire

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/datapath"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// FuzzDecode: whatever bytes an agent is sent, decoding yields a state the
// datapath can take, which encodes back to the same thing, or an error;
// never a panic.
func FuzzDecode(f *testing.F) {
	svc := EncodeService(&datapath.Service{
		Key:             datapath.ServiceKey{Namespace: "shop", Name: "cart"},
		ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		Ports: []datapath.ServicePort{{Name: "http", Protocol: datapath.TCP, Port: 80, NodePort: 30080, Endpoints: []datapath.Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.11"), Port: 8080, NodeName: "node1", Ready: true, Serving: true, Hints: &datapath.Hints{Zones: []string{"a"}}},
		}}},
	})
	node := EncodeNode(datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		BGPPeers:     []datapath.BGPPeer{{Address: netip.MustParseAddr("192.0.2.1"), ASN: 64500, MyASN: 64512}}})
	for _, m := range []proto.Message{svc, node} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	same := cmp.Options{cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s weirv1.NodeService
		if proto.Unmarshal(b, &s) == nil {
			if d, err := DecodeService(&s, "node1"); err == nil {
				again, err := DecodeService(EncodeService(d), "node1")
				if err != nil {
					t.Fatalf("a decoded service does not decode again: %v", err)
				}
				if diff := cmp.Diff(d, again, same); diff != "" {
					t.Fatalf("round trip changed the service:\n%s", diff)
				}
			}
		}
		var n weirv1.NodeInfo
		if proto.Unmarshal(b, &n) == nil {
			if d, err := DecodeNode(&n); err == nil {
				if _, err := DecodeNode(EncodeNode(d)); err != nil {
					t.Fatalf("a decoded node does not decode again: %v", err)
				}
			}
		}
	})
}
