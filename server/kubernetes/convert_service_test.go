package kubernetes

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirlb/weir/server/model"
)

// A Service becomes the model's service as kube-proxy reads it: the
// fields each type has, the defaults the API gives, and Weir's and
// MetalLB's load-balancer requests.
func TestServiceConversion(t *testing.T) {
	ptr := func(s string) *string { return &s }
	ip := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	local := corev1.ServiceInternalTrafficPolicyLocal
	timeout := int32(600)
	proxy := corev1.LoadBalancerIPModeProxy
	in := func(typ corev1.ServiceType, edit func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"app": "web"}},
			Spec: corev1.ServiceSpec{Type: typ, ClusterIPs: []string{"10.96.0.10", "fd00::10"},
				Ports: []corev1.ServicePort{
					{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080},
					{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromString("dns"), NodePort: 30053},
				}},
		}
		if edit != nil {
			edit(s)
		}
		return s
	}
	out := func(s *corev1.Service, typ model.ServiceType, edit func(*model.Service)) *model.Service {
		m := &model.Service{Meta: meta(&s.ObjectMeta), Type: typ, ClusterIPs: ip("10.96.0.10", "fd00::10"),
			Ports: []model.ServicePort{
				{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30080},
				{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30053},
			},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
		if edit != nil {
			edit(m)
		}
		return m
	}
	weirs := Classes{Class: DefaultLoadBalancerClass}
	for _, tc := range []struct {
		what    string
		svc     *corev1.Service
		classes Classes
		want    func(*corev1.Service) *model.Service
	}{
		{"an ExternalName service", in(corev1.ServiceTypeExternalName, nil), weirs, func(*corev1.Service) *model.Service { return nil }},
		{"a headless service", in(corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"None"} }), weirs,
			func(*corev1.Service) *model.Service { return nil }},
		{"a ClusterIP service: no node ports, no load-balancer fields, Cluster policies", in(corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"192.0.2.7", "bogus"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 30999
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.7/24"}
			s.Annotations = map[string]string{AnnotationLoadBalancerIPs: "203.0.113.1"}
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}), weirs, func(s *corev1.Service) *model.Service {
			return out(s, model.ClusterIP, func(m *model.Service) {
				m.Ports[0].NodePort, m.Ports[1].NodePort = 0, 0
				m.ExternalIPs = ip("192.0.2.7")
				m.InternalTrafficPolicy = model.PolicyLocal
				m.SessionAffinityTimeout = model.DefaultSessionAffinityTimeout
			})
		}},
		{"a NodePort service with Local policies and an affinity timeout", in(corev1.ServiceTypeNodePort, func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
			s.Spec.TrafficDistribution = ptr("PreferSameZone")
		}), weirs, func(s *corev1.Service) *model.Service {
			return out(s, model.NodePort, func(m *model.Service) {
				m.ExternalTrafficPolicy = model.PolicyLocal
				m.SessionAffinityTimeout = 600 * time.Second
				m.PreferClose = true
			})
		}},
		{"Weir's LoadBalancer service with its requests and a condition", in(corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 30999
			s.Spec.LoadBalancerClass = ptr(DefaultLoadBalancerClass)
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.7/24", "bogus"}
			s.Spec.LoadBalancerIP = "203.0.113.99"
			s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferClose)
			s.Annotations = map[string]string{
				AnnotationLoadBalancerIPs: "203.0.113.1, 2001:db8::1", "metallb.io/loadBalancerIPs": "203.0.113.2",
				"metallb.universe.tf/address-pool": "old", AnnotationAllowSharedIP: "key", "metallb.io/allow-shared-ip": "other",
			}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.1"}, {IP: "203.0.113.50", IPMode: &proxy}}
			s.Status.Conditions = []metav1.Condition{{Type: ConditionAddressAssigned, Status: metav1.ConditionFalse, Reason: "PoolExhausted", Message: "full"}}
		}), weirs, func(s *corev1.Service) *model.Service {
			return out(s, model.LoadBalancer, func(m *model.Service) {
				m.ExternalTrafficPolicy, m.HealthCheckNodePort = model.PolicyLocal, 30999
				m.LoadBalancerClass = DefaultLoadBalancerClass
				m.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
				m.LoadBalancerIPs = ip("203.0.113.1")
				m.RequestedLoadBalancerIPs = ip("203.0.113.1", "2001:db8::1")
				m.AddressPool, m.AllowSharedIP = "old", "key"
				m.AddressReason, m.AddressMessage = "PoolExhausted", "full"
				m.PreferClose = true
			})
		}},
		{"a LoadBalancer service asking with spec.loadBalancerIP; a released address is no reason", in(corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
			s.Spec.LoadBalancerIP = "203.0.113.99"
			s.Status.Conditions = []metav1.Condition{{Type: ConditionAddressAssigned, Status: metav1.ConditionFalse, Reason: "Released", Message: "gone"}}
		}), Classes{Class: DefaultLoadBalancerClass, Default: true}, func(s *corev1.Service) *model.Service {
			return out(s, model.LoadBalancer, func(m *model.Service) { m.RequestedLoadBalancerIPs = ip("203.0.113.99") })
		}},
		{"another controller's LoadBalancer service keeps no reason, and Weir's condition left on it is to go", in(corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
			s.Annotations = map[string]string{"metallb.universe.tf/loadBalancerIPs": "203.0.113.3", "metallb.io/address-pool": "new"}
			s.Status.Conditions = []metav1.Condition{{Type: ConditionAddressAssigned, Status: metav1.ConditionFalse, Reason: "PoolExhausted"}}
		}), weirs, func(s *corev1.Service) *model.Service {
			return out(s, model.LoadBalancer, func(m *model.Service) {
				m.RequestedLoadBalancerIPs = ip("203.0.113.3")
				m.AddressPool = "new"
				m.OtherController = true
				m.WeirStatusLeft = true
			})
		}},
		{"a ClusterIP service that was Weir's: its Weir condition is to go, another's stays", in(corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
			s.Status.Conditions = []metav1.Condition{{Type: "example.com/Ready"}, {Type: ConditionAnnounced, Status: metav1.ConditionTrue}}
		}), weirs, func(s *corev1.Service) *model.Service {
			return out(s, model.ClusterIP, func(m *model.Service) {
				m.Ports[0].NodePort, m.Ports[1].NodePort = 0, 0
				m.WeirStatusLeft = true
			})
		}},
		{"a ClusterIP service with another's condition only", in(corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
			s.Status.Conditions = []metav1.Condition{{Type: "example.com/Ready"}}
		}), weirs, func(s *corev1.Service) *model.Service {
			return out(s, model.ClusterIP, func(m *model.Service) { m.Ports[0].NodePort, m.Ports[1].NodePort = 0, 0 })
		}},
	} {
		if diff := cmp.Diff(tc.want(tc.svc), service(tc.svc, tc.classes), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.what, diff)
		}
	}
}
