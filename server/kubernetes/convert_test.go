package kubernetes

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEndpointHintsAreCopied: the EndpointSlice controller's hints are
// what the agents' topology follows, zones and nodes both.
func TestEndpointHintsAreCopied(t *testing.T) {
	node, zone := "node1", "a"
	s := endpointSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.11"}, NodeName: &node, Zone: &zone,
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "a"}}, ForNodes: []discoveryv1.ForNode{{Name: "node1"}, {Name: "node2"}}}}},
	})
	if s == nil || len(s.Endpoints) != 1 {
		t.Fatalf("converted %+v", s)
	}
	e := s.Endpoints[0]
	if !slices.Equal(e.HintZones, []string{"a"}) || !slices.Equal(e.HintNodes, []string{"node1", "node2"}) {
		t.Errorf("hints: zones %v nodes %v", e.HintZones, e.HintNodes)
	}
}

// TestLoadBalancerIngressAsKubeProxy: the addresses nodes program are the
// ingress IPs in VIP mode (the default); one in Proxy mode is reached
// through a proxy that rewrites the destination, and a hostname is not an
// address, so neither is programmed.
func TestLoadBalancerIngressAsKubeProxy(t *testing.T) {
	vip, proxy := corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy
	s := service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: "203.0.113.10"}, {IP: "203.0.113.11", IPMode: &vip}, {IP: "203.0.113.12", IPMode: &proxy}, {Hostname: "lb.example.invalid"},
		}}},
	}, Classes{Default: true})
	want := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}
	if s == nil || !slices.Equal(s.LoadBalancerIPs, want) {
		t.Errorf("load-balancer IPs %v, want %v", s.LoadBalancerIPs, want)
	}
}

// TestEndpointConditionsDefaultAsTheAPISays: a nil ready or serving
// condition is true, a nil terminating false.
func TestEndpointConditionsDefaultAsTheAPISays(t *testing.T) {
	f := false
	s := endpointSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.11"}},
			{Addresses: []string{"10.244.1.12"}, Conditions: discoveryv1.EndpointConditions{Ready: &f}},
		},
	})
	if s == nil || len(s.Endpoints) != 2 {
		t.Fatalf("converted %+v", s)
	}
	if e := s.Endpoints[0]; !e.IsReady() || !e.IsServing() || e.IsTerminating() {
		t.Errorf("no conditions: ready %v serving %v terminating %v", e.IsReady(), e.IsServing(), e.IsTerminating())
	}
	if e := s.Endpoints[1]; e.IsReady() || !e.IsServing() {
		t.Errorf("ready false, serving unset: ready %v serving %v", e.IsReady(), e.IsServing())
	}
	if fqdn := endpointSlice(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeFQDN}); fqdn != nil {
		t.Error("an FQDN slice was converted")
	}
}
