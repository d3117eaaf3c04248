package resourcewire

import (
	"testing"

	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
)

// FuzzConvertAndValidate: any bytes as any resource reach the registry's
// checks as a field error or a resource those checks accept, which
// converts back and forth to itself; never a panic.
func FuzzConvertAndValidate(f *testing.F) {
	seeds := []proto.Message{
		&weirv1.Service{Metadata: &weirv1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"app": "web"}},
			Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{"10.96.0.10", "fd00:96::10"},
				Ports: []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080}}, ExternalTrafficPolicy: weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, HealthCheckNodePort: 32000},
			Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{"203.0.113.10"}}},
		&weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "shop", Name: "web-1"}, ServiceName: "web",
			Endpoints: []*weirv1.Endpoint{{Addresses: []string{"10.244.1.11"}, NodeName: "node1", HintZones: []string{"a"}}}},
		&weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: "node1"}, Addresses: []string{"192.0.2.11"}, PodCidrs: []string{"10.244.1.0/24"}},
		&weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/24", "2001:db8::1-2001:db8::9"}},
		&weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: "192.0.2.1", Asn: 64500, MyAsn: 64512},
		&weirv1.ServiceCidr{Metadata: &weirv1.ObjectMeta{Name: "kubernetes"}, Cidrs: []string{"10.96.0.0/16"}},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		switch kind % 6 {
		case 0:
			roundTrip(t, b, &weirv1.Service{}, ServiceFromProto, ServiceToProto, (*model.Service).Validate)
		case 1:
			roundTrip(t, b, &weirv1.EndpointSlice{}, EndpointSliceFromProto, EndpointSliceToProto, (*model.EndpointSlice).Validate)
		case 2:
			roundTrip(t, b, &weirv1.Node{}, NodeFromProto, NodeToProto, (*model.Node).Validate)
		case 3:
			roundTrip(t, b, &weirv1.AddressPool{}, PoolFromProto, PoolToProto, (*model.AddressPool).Validate)
		case 4:
			roundTrip(t, b, &weirv1.BgpPeer{}, BGPPeerFromProto, BGPPeerToProto, (*model.BGPPeer).Validate)
		case 5:
			roundTrip(t, b, &weirv1.ServiceCidr{}, ServiceCIDRFromProto, ServiceCIDRToProto, (*model.ServiceCIDR).Validate)
		}
	})
}

func roundTrip[M any, P proto.Message](t *testing.T, b []byte, p P, from func(P) (M, error), to func(M) P, validate func(M) error) {
	if proto.Unmarshal(b, p) != nil {
		return
	}
	m, err := from(p)
	if err != nil || validate(m) != nil {
		return
	}
	back := to(m)
	again, err := from(back)
	if err != nil {
		t.Fatalf("an accepted resource does not read back: %v\n%v", err, back)
	}
	if err := validate(again); err != nil {
		t.Fatalf("an accepted resource, written and read back, is refused: %v\n%v", err, back)
	}
	if !proto.Equal(to(again), back) {
		t.Fatalf("a round trip changed the resource:\n%v\n%v", back, to(again))
	}
}
