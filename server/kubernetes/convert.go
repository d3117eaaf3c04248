package kubernetes

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/server/model"
)

// Labels kube-proxy selects on.
const (
	// LabelServiceProxyName marks a service for a proxy other than the default.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks the endpoint slices of a headless service.
	LabelHeadless = "service.kubernetes.io/headless"
	// TaintToBeDeleted is the cluster autoscaler's mark of a node going away.
	TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"
	// Annotations a LoadBalancer service asks Weir's address pools with.
	AnnotationLoadBalancerIPs = "weir.dev/load-balancer-ips" // comma-separated
	AnnotationAddressPool     = "weir.dev/address-pool"
	AnnotationAllowSharedIP   = "weir.dev/allow-shared-ip"
	// DefaultLoadBalancerClass is the spec.loadBalancerClass Weir handles
	// unless --load-balancer-class names another.
	DefaultLoadBalancerClass = "weir.dev/weir"
)

// MetalLB's annotations for the same requests, read when Weir's own are
// absent, so that a Service moves from MetalLB unchanged: its current
// prefix first, then the one before v0.14.
var metalLBAnnotations = [...]struct{ ips, pool, shared string }{
	{"metallb.io/loadBalancerIPs", "metallb.io/address-pool", "metallb.io/allow-shared-ip"},
	{"metallb.universe.tf/loadBalancerIPs", "metallb.universe.tf/address-pool", "metallb.universe.tf/allow-shared-ip"},
}

// Classes says which LoadBalancer services Weir handles: those of Class,
// and, when Default (Weir is the cluster's default load balancer), those
// with no class. Another controller handles the rest.
type Classes struct {
	Class   string
	Default bool
}

// ours tells whether Weir handles a LoadBalancer service of class c.
func (cl Classes) ours(c *string) bool {
	if c == nil || *c == "" {
		return cl.Default
	}
	return *c == cl.Class
}

// annotation is the first of the keys s carries.
func annotation(s *corev1.Service, keys ...string) string {
	for _, k := range keys {
		if v, ok := s.Annotations[k]; ok {
			return v
		}
	}
	return ""
}

// service maps a Service, or returns nil when proxies have nothing to do
// for it (headless, ExternalName); classes says whether it is Weir's to
// assign and announce, when a LoadBalancer.
func service(s *corev1.Service, classes Classes) *model.Service {
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	out := &model.Service{
		Meta:                  meta(&s.ObjectMeta),
		Type:                  serviceType(s.Spec.Type),
		ClusterIPs:            addrs(s.Spec.ClusterIPs),
		ExternalIPs:           addrs(s.Spec.ExternalIPs),
		ExternalTrafficPolicy: model.PolicyCluster,
		InternalTrafficPolicy: model.PolicyCluster,
		HealthCheckNodePort:   s.Spec.HealthCheckNodePort,
	}
	if len(out.ClusterIPs) == 0 {
		return nil // headless ("None") or not yet allocated
	}
	out.Ports = servicePorts(s.Spec.Ports, out.Type)
	out.SessionAffinityTimeout = sessionAffinityTimeout(&s.Spec)
	setTrafficPolicies(out, &s.Spec)
	if out.Type == model.LoadBalancer {
		setLoadBalancer(out, s, classes)
	}
	out.WeirStatusLeft = (out.Type != model.LoadBalancer || out.OtherController) && hasWeirCondition(s.Status.Conditions)
	if d := s.Spec.TrafficDistribution; d != nil && (*d == corev1.ServiceTrafficDistributionPreferClose || *d == "PreferSameZone") {
		out.PreferClose = true
	}
	return out
}

// hasWeirCondition reports whether conditions hold one of Weir's.
func hasWeirCondition(conditions []metav1.Condition) bool {
	return slices.ContainsFunc(conditions, func(c metav1.Condition) bool { return slices.Contains(weirConditions, c.Type) })
}

func serviceType(t corev1.ServiceType) model.ServiceType {
	switch t {
	case corev1.ServiceTypeNodePort:
		return model.NodePort
	case corev1.ServiceTypeLoadBalancer:
		return model.LoadBalancer
	}
	return model.ClusterIP
}

// servicePorts maps the ports; a named target port is the endpoints' to
// resolve, and a ClusterIP service has no node ports.
func servicePorts(ports []corev1.ServicePort, typ model.ServiceType) []model.ServicePort {
	var out []model.ServicePort
	for _, p := range ports {
		sp := model.ServicePort{Name: p.Name, Protocol: protocol(p.Protocol), Port: p.Port, NodePort: p.NodePort}
		if p.TargetPort.IntVal != 0 {
			sp.TargetPort = p.TargetPort.IntVal
		}
		if typ == model.ClusterIP {
			sp.NodePort = 0
		}
		out = append(out, sp)
	}
	return out
}

// sessionAffinityTimeout is 0 without ClientIP affinity, else the timeout
// given or Kubernetes' default.
func sessionAffinityTimeout(spec *corev1.ServiceSpec) time.Duration {
	if spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		return time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
	}
	return model.DefaultSessionAffinityTimeout
}

// setTrafficPolicies sets the traffic policies: an external policy of
// Local applies to traffic from outside only, and brings the health-check
// node port.
func setTrafficPolicies(out *model.Service, spec *corev1.ServiceSpec) {
	if spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && out.Type != model.ClusterIP {
		out.ExternalTrafficPolicy = model.PolicyLocal
	} else {
		out.HealthCheckNodePort = 0
	}
	if p := spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		out.InternalTrafficPolicy = model.PolicyLocal
	}
}

// setLoadBalancer sets a LoadBalancer service's fields: its source
// ranges, its addresses, what it asks Weir's pools for (Weir's
// annotations, else MetalLB's, else spec.loadBalancerIP), its class and
// why no address could be assigned.
func setLoadBalancer(out *model.Service, s *corev1.Service, classes Classes) {
	for _, r := range s.Spec.LoadBalancerSourceRanges {
		if p, err := netip.ParsePrefix(r); err == nil {
			out.LoadBalancerSourceRanges = append(out.LoadBalancerSourceRanges, p.Masked())
		}
	}
	for _, ing := range s.Status.LoadBalancer.Ingress {
		// An ingress with ipMode Proxy is reached through a proxy
		// that rewrites the destination: nothing to program for it.
		if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
			continue
		}
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out.LoadBalancerIPs = append(out.LoadBalancerIPs, a)
		}
	}
	m0, m1 := metalLBAnnotations[0], metalLBAnnotations[1]
	requested := annotation(s, AnnotationLoadBalancerIPs, m0.ips, m1.ips)
	if requested == "" {
		requested = s.Spec.LoadBalancerIP
	}
	for _, ip := range strings.Split(requested, ",") {
		if a, err := netip.ParseAddr(strings.TrimSpace(ip)); err == nil {
			out.RequestedLoadBalancerIPs = append(out.RequestedLoadBalancerIPs, a)
		}
	}
	out.AddressPool = annotation(s, AnnotationAddressPool, m0.pool, m1.pool)
	out.AllowSharedIP = annotation(s, AnnotationAllowSharedIP, m0.shared, m1.shared)
	if c := s.Spec.LoadBalancerClass; c != nil {
		out.LoadBalancerClass = *c
	}
	out.OtherController = !classes.ours(s.Spec.LoadBalancerClass)
	// Why no address could be assigned lives in the condition the
	// status writer sets.
	if c := apimeta.FindStatusCondition(s.Status.Conditions, ConditionAddressAssigned); c != nil && !out.OtherController &&
		c.Status == metav1.ConditionFalse && c.Reason != "Released" {
		out.AddressReason, out.AddressMessage = c.Reason, c.Message
	}
}

// endpointSlice maps an EndpointSlice, or returns nil for one no proxy
// uses (FQDN addresses, or no owning service).
func endpointSlice(s *discoveryv1.EndpointSlice) *model.EndpointSlice {
	svc := s.Labels[discoveryv1.LabelServiceName]
	if svc == "" || s.AddressType == discoveryv1.AddressTypeFQDN {
		return nil
	}
	out := &model.EndpointSlice{Meta: meta(&s.ObjectMeta), ServiceName: svc}
	for _, ep := range s.Endpoints {
		e := model.Endpoint{
			Addresses:   addrs(ep.Addresses),
			Ready:       ep.Conditions.Ready,
			Serving:     ep.Conditions.Serving,
			Terminating: ep.Conditions.Terminating,
		}
		if len(e.Addresses) == 0 {
			continue
		}
		if ep.NodeName != nil {
			e.NodeName = *ep.NodeName
		}
		if ep.Zone != nil {
			e.Zone = *ep.Zone
		}
		if ep.Hints != nil {
			for _, z := range ep.Hints.ForZones {
				e.HintZones = append(e.HintZones, z.Name)
			}
			for _, n := range ep.Hints.ForNodes {
				e.HintNodes = append(e.HintNodes, n.Name)
			}
		}
		out.Endpoints = append(out.Endpoints, e)
	}
	for _, p := range s.Ports {
		ep := model.EndpointPort{Protocol: model.TCP}
		if p.Name != nil {
			ep.Name = *p.Name
		}
		if p.Protocol != nil {
			ep.Protocol = protocol(*p.Protocol)
		}
		if p.Port != nil {
			ep.Port = *p.Port
		}
		out.Ports = append(out.Ports, ep)
	}
	return out
}

// node maps a Node: its internal addresses first (the node's primary
// addresses), then external ones.
func node(n *corev1.Node) *model.Node {
	out := &model.Node{
		Meta:     meta(&n.ObjectMeta),
		Zone:     n.Labels[corev1.LabelTopologyZone],
		Deleting: n.DeletionTimestamp != nil,
	}
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == t && !slices.Contains(out.Addresses, ip) {
				out.Addresses = append(out.Addresses, ip)
			}
		}
	}
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToBeDeleted {
			out.Deleting = true
		}
	}
	return out
}

// meta keeps the object's creation time: the older of two services that
// claim one frontend keeps it, as the cluster created them.
func meta(m *metav1.ObjectMeta) model.Meta {
	return model.Meta{Namespace: m.Namespace, Name: m.Name, Labels: m.Labels, Source: model.SourceKubernetes, CreateTime: m.CreationTimestamp.UTC()}
}

func addrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

func protocol(p corev1.Protocol) model.Protocol {
	switch p {
	case corev1.ProtocolUDP:
		return model.UDP
	case corev1.ProtocolSCTP:
		return model.SCTP
	}
	return model.TCP
}

// serviceCIDR maps a ServiceCIDR; nil when none of its prefixes parse.
// One being deleted still counts: the apiserver keeps it (by a finalizer)
// while any service holds an address of it, and kube-proxy drops
// unallocated addresses until it is gone.
func serviceCIDR(c *networkingv1.ServiceCIDR) *model.ServiceCIDR {
	out := &model.ServiceCIDR{Meta: meta(&c.ObjectMeta)}
	for _, s := range c.Spec.CIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out.CIDRs = append(out.CIDRs, p.Masked())
		}
	}
	if len(out.CIDRs) == 0 {
		return nil
	}
	return out
}
