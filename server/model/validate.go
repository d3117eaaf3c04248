package model

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/weirlb/weir/internal/bgpnumbers"
	"github.com/weirlb/weir/internal/iprange"
)

// FieldError says which field of a resource is wrong and why. Field paths
// are spelled as in the API (proto field names), relative to the resource.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// AsFieldError reports whether err carries a FieldError.
func AsFieldError(err error) (*FieldError, bool) {
	var fe *FieldError
	ok := errors.As(err, &fe)
	return fe, ok
}

// dnsName is a DNS-1123 name rule, checked by hand: a slice's node
// names went through a regexp once per endpoint, a third of what
// validating a slice cost (TestDNSNamesAsTheRegexps holds them to the
// regexps they replace).
type dnsName struct{ subdomain bool }

var (
	// dns1123Label is what Kubernetes accepts for namespace and service
	// names: `^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`.
	dns1123Label = dnsName{}
	// dns1123Subdomain is what Kubernetes accepts for node and slice
	// names: labels of any length as above, joined by dots (callers bound
	// the whole).
	dns1123Subdomain = dnsName{subdomain: true}
)

// MatchString reports whether s follows the rule.
func (r dnsName) MatchString(s string) bool {
	if !r.subdomain && len(s) > 63 {
		return false
	}
	start := 0 // of the current label
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			c := s[i]
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
			continue
		}
		// A label ends at i: non-empty, no '-' at either end.
		if i == start || s[start] == '-' || s[i-1] == '-' || i < len(s) && !r.subdomain {
			return false
		}
		start = i + 1
	}
	return true
}

// Kubernetes' sizes, and Weir's where Kubernetes sets none.
const (
	maxSubdomain         = 253  // a DNS-1123 subdomain
	maxLabelName         = 63   // a label key's name part, and a value
	maxLabels            = 64   // Weir's: Kubernetes bounds only the object
	maxServicePorts      = 100  // Weir's, as an EndpointSlice's ports
	maxSlicePorts        = 100  // Kubernetes'
	maxSliceEndpoints    = 1000 // Kubernetes'
	maxEndpointAddresses = 100  // Kubernetes'
)

// labelName is a label key's name part, or a non-empty value.
var labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// validateLabels checks labels (or a selector's) given in field.
func validateLabels(field string, labels map[string]string) error {
	if len(labels) > maxLabels {
		return fieldErr(field, "%d labels; at most %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		f := fmt.Sprintf("%s[%q]", field, k)
		prefix, name, hasPrefix := strings.Cut(k, "/")
		if !hasPrefix {
			prefix, name = "", k
		}
		switch {
		case hasPrefix && (len(prefix) > maxSubdomain || !dns1123Subdomain.MatchString(prefix)):
			return fieldErr(f, "the key's prefix %q is not a DNS-1123 subdomain of at most %d characters", prefix, maxSubdomain)
		case len(name) > maxLabelName || !labelName.MatchString(name):
			return fieldErr(f, "the key's name %q: at most %d of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", name, maxLabelName)
		case v != "" && (len(v) > maxLabelName || !labelName.MatchString(v)):
			return fieldErr(f, "the value: at most %d of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", maxLabelName)
		}
	}
	return nil
}

func validateMeta(m *Meta, namespaced bool, name dnsName) error {
	if namespaced && !dns1123Label.MatchString(m.Namespace) {
		return fieldErr("metadata.namespace", "%q is not a DNS-1123 label (lowercase letters, digits and '-', at most 63)", m.Namespace)
	}
	if !namespaced && m.Namespace != "" {
		return fieldErr("metadata.namespace", "must be empty: the resource is cluster-scoped")
	}
	if len(m.Name) > maxSubdomain || !name.MatchString(m.Name) {
		return fieldErr("metadata.name", "%q is not a valid name (lowercase letters, digits and '-'; dots between labels where allowed; at most 63 or 253)", m.Name)
	}
	return validateLabels("metadata.labels", m.Labels)
}

func validPort(p int32) bool { return p >= 1 && p <= 65535 }

func validProtocol(p Protocol) bool { return p == TCP || p == UDP || p == SCTP }

// Validate checks a service on its own; conflicts with other services are
// the registry's to find. The sections are checked in the order of the
// spec, and the first problem found is the one reported.
func (s *Service) Validate() error {
	return firstError(
		func() error { return validateMeta(&s.Meta, true, dns1123Label) },
		s.validateType,
		s.validateAddresses,
		s.validatePorts,
		s.validateTrafficPolicies,
		s.validateLoadBalancer,
	)
}

// firstError runs checks in order and returns the first error.
func firstError(checks ...func() error) error {
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) validateType() error {
	switch s.Type {
	case ClusterIP, NodePort, LoadBalancer:
		return nil
	default:
		return fieldErr("spec.type", "unknown service type %q", s.Type)
	}
}

// validateAddresses checks the cluster, external and load-balancer IPs.
func (s *Service) validateAddresses() error {
	if len(s.ClusterIPs) == 0 {
		return fieldErr("spec.cluster_ips", "at least one cluster IP is required")
	}
	if len(s.ClusterIPs) > 2 || (len(s.ClusterIPs) == 2 && s.ClusterIPs[0].Is4() == s.ClusterIPs[1].Is4()) {
		return fieldErr("spec.cluster_ips", "at most one address per family")
	}
	for _, list := range []struct {
		field string
		addrs []netip.Addr
	}{{"spec.cluster_ips", s.ClusterIPs}, {"spec.external_ips", s.ExternalIPs}, {"status.load_balancer_ips", s.LoadBalancerIPs}} {
		if err := validateServiceAddrs(list.field, list.addrs); err != nil {
			return err
		}
	}
	if len(s.LoadBalancerIPs) > 0 && s.Type != LoadBalancer {
		return fieldErr("status.load_balancer_ips", "only LOAD_BALANCER services have load-balancer addresses")
	}
	return nil
}

// validateServiceAddrs checks a list of service addresses given in field.
func validateServiceAddrs(field string, addrs []netip.Addr) error {
	for i, a := range addrs {
		if err := validateServiceAddr(fmt.Sprintf("%s[%d]", field, i), a); err != nil {
			return err
		}
	}
	return nil
}

// validatePorts checks the ports one by one, in order, and that no two
// share a name, a protocol and port, or a node port.
func (s *Service) validatePorts() error {
	if len(s.Ports) == 0 {
		return fieldErr("spec.ports", "at least one port is required")
	}
	if len(s.Ports) > maxServicePorts {
		return fieldErr("spec.ports", "%d ports; at most %d", len(s.Ports), maxServicePorts)
	}
	seen := portsSeen{names: map[string]int{}, ports: map[string]int{}}
	for i, p := range s.Ports {
		if err := s.validatePort(i, p, seen); err != nil {
			return err
		}
	}
	return nil
}

// portsSeen records, for the ports checked so far, the index of each name
// and of each protocol/port and node/protocol/port key.
type portsSeen struct{ names, ports map[string]int }

func (s *Service) validatePort(i int, p ServicePort, seen portsSeen) error {
	f := fmt.Sprintf("spec.ports[%d]", i)
	if len(s.Ports) > 1 && p.Name == "" {
		return fieldErr(f+".name", "required when the service has more than one port")
	}
	if p.Name != "" && !dns1123Label.MatchString(p.Name) {
		return fieldErr(f+".name", "%q is not a DNS-1123 label", p.Name)
	}
	if j, dup := seen.names[p.Name]; dup && p.Name != "" {
		return fieldErr(f+".name", "duplicate of spec.ports[%d].name %q", j, p.Name)
	}
	seen.names[p.Name] = i
	if !validProtocol(p.Protocol) {
		return fieldErr(f+".protocol", "unknown protocol %q", p.Protocol)
	}
	if !validPort(p.Port) {
		return fieldErr(f+".port", "%d is not a port (1-65535)", p.Port)
	}
	k := fmt.Sprintf("%s/%d", p.Protocol, p.Port)
	if j, dup := seen.ports[k]; dup {
		return fieldErr(f+".port", "duplicate of spec.ports[%d]: %s", j, k)
	}
	seen.ports[k] = i
	if p.TargetPort != 0 && !validPort(p.TargetPort) {
		return fieldErr(f+".target_port", "%d is not a port (1-65535)", p.TargetPort)
	}
	if p.NodePort == 0 {
		return nil
	}
	if s.Type == ClusterIP {
		return fieldErr(f+".node_port", "only NODE_PORT and LOAD_BALANCER services have node ports")
	}
	if !validPort(p.NodePort) {
		return fieldErr(f+".node_port", "%d is not a port (1-65535)", p.NodePort)
	}
	k = fmt.Sprintf("node/%s/%d", p.Protocol, p.NodePort)
	if j, dup := seen.ports[k]; dup {
		return fieldErr(f+".node_port", "duplicate of spec.ports[%d].node_port", j)
	}
	seen.ports[k] = i
	return nil
}

// validateTrafficPolicies checks session affinity, the traffic policies
// and the health-check node port that goes with a LOCAL policy.
func (s *Service) validateTrafficPolicies() error {
	if s.SessionAffinityTimeout < 0 || s.SessionAffinityTimeout > 86400*time.Second {
		return fieldErr("spec.session_affinity_timeout_seconds", "must be between 1 and 86400")
	}
	if err := validatePolicy("spec.external_traffic_policy", s.ExternalTrafficPolicy); err != nil {
		return err
	}
	if err := validatePolicy("spec.internal_traffic_policy", s.InternalTrafficPolicy); err != nil {
		return err
	}
	if s.ExternalTrafficPolicy == PolicyLocal && s.Type == ClusterIP && len(s.ExternalIPs) == 0 {
		return fieldErr("spec.external_traffic_policy", "LOCAL applies only to traffic from outside: NODE_PORT and LOAD_BALANCER services, or those with external IPs")
	}
	if s.HealthCheckNodePort == 0 {
		return nil
	}
	if s.Type != LoadBalancer || s.ExternalTrafficPolicy != PolicyLocal {
		return fieldErr("spec.health_check_node_port", "only a LOAD_BALANCER service with external_traffic_policy LOCAL has one")
	}
	if !validPort(s.HealthCheckNodePort) {
		return fieldErr("spec.health_check_node_port", "%d is not a port (1-65535)", s.HealthCheckNodePort)
	}
	return nil
}

// validateLoadBalancer checks what only a LoadBalancer service may ask
// for: addresses, a pool, a shared-IP key, source ranges and a class.
func (s *Service) validateLoadBalancer() error {
	if err := validateServiceAddrs("spec.load_balancer_ips", s.RequestedLoadBalancerIPs); err != nil {
		return err
	}
	if s.Type == LoadBalancer {
		return nil
	}
	if len(s.RequestedLoadBalancerIPs) > 0 || s.AddressPool != "" || s.AllowSharedIP != "" {
		return fieldErr("spec.load_balancer_ips", "only LOAD_BALANCER services get load-balancer addresses")
	}
	if len(s.LoadBalancerSourceRanges) > 0 {
		return fieldErr("spec.load_balancer_source_ranges", "only LOAD_BALANCER services have them")
	}
	if s.LoadBalancerClass != "" || s.OtherController {
		return fieldErr("spec.load_balancer_class", "only LOAD_BALANCER services have one")
	}
	return nil
}

func validatePolicy(field string, p TrafficPolicy) error {
	if p != PolicyCluster && p != PolicyLocal {
		return fieldErr(field, "unknown traffic policy %q", p)
	}
	return nil
}

func validateUnicast(field string, a netip.Addr) error {
	if usableUnicast(a) {
		return nil
	}
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.Zone() != "" {
		return fieldErr(field, "%q is not a usable unicast address", a)
	}
	if a.Is4In6() {
		return fieldErr(field, "%q is not in canonical form: write %s", a, a.Unmap())
	}
	return nil
}

// usableUnicast: what validateUnicast accepts.
func usableUnicast(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsMulticast() && !a.IsLoopback() && a.Zone() == "" && !a.Is4In6()
}

// validateServiceAddr checks an address a service takes traffic for on
// every node (a cluster, external or load-balancer IP).
func validateServiceAddr(field string, a netip.Addr) error {
	if err := validateUnicast(field, a); err != nil {
		return err
	}
	for _, p := range iprange.SpecialPurpose {
		if p.Contains(a) {
			return fieldErr(field, "%s is in the special-purpose range %s: no service may take it", a, p)
		}
	}
	return nil
}

// Validate checks an endpoint slice on its own.
func (s *EndpointSlice) Validate() error {
	if err := validateMeta(&s.Meta, true, dns1123Subdomain); err != nil {
		return err
	}
	if !dns1123Label.MatchString(s.ServiceName) {
		return fieldErr("service_name", "%q is not a service name", s.ServiceName)
	}
	if len(s.Endpoints) > maxSliceEndpoints {
		return fieldErr("endpoints", "%d endpoints; at most %d in one slice (use more slices)", len(s.Endpoints), maxSliceEndpoints)
	}
	if len(s.Ports) > maxSlicePorts {
		return fieldErr("ports", "%d ports; at most %d", len(s.Ports), maxSlicePorts)
	}
	var is6 *bool
	// Field paths are written only for an error: a slice of 1,000
	// endpoints is checked in a storm of them.
	for i, ep := range s.Endpoints {
		if len(ep.Addresses) == 0 || len(ep.Addresses) > maxEndpointAddresses {
			return fieldErr(fmt.Sprintf("endpoints[%d].addresses", i), "%d addresses; between 1 and %d", len(ep.Addresses), maxEndpointAddresses)
		}
		for j, a := range ep.Addresses {
			af := func() string { return fmt.Sprintf("endpoints[%d].addresses[%d]", i, j) }
			if !usableUnicast(a) {
				return validateUnicast(af(), a)
			}
			v6 := a.Is6()
			if is6 == nil {
				is6 = &v6
			} else if *is6 != v6 {
				return fieldErr(af(), "one slice holds addresses of one family")
			}
		}
		if ep.NodeName != "" && !dns1123Subdomain.MatchString(ep.NodeName) {
			return fieldErr(fmt.Sprintf("endpoints[%d].node_name", i), "%q is not a node name", ep.NodeName)
		}
	}
	names := map[string]int{}
	for i, p := range s.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		if j, dup := names[p.Name]; dup {
			return fieldErr(f+".name", "duplicate of ports[%d].name %q", j, p.Name)
		}
		names[p.Name] = i
		if !validProtocol(p.Protocol) {
			return fieldErr(f+".protocol", "unknown protocol %q", p.Protocol)
		}
		if !validPort(p.Port) {
			return fieldErr(f+".port", "%d is not a port (1-65535)", p.Port)
		}
	}
	return nil
}

// Validate checks a node on its own.
func (n *Node) Validate() error {
	if err := validateMeta(&n.Meta, false, dns1123Subdomain); err != nil {
		return err
	}
	for i, a := range n.Addresses {
		if err := validateUnicast(fmt.Sprintf("addresses[%d]", i), a); err != nil {
			return err
		}
	}
	for i, p := range n.PodCIDRs {
		if !p.IsValid() || p.Masked() != p {
			return fieldErr(fmt.Sprintf("pod_cidrs[%d]", i), "%q is not a network prefix", p)
		}
	}
	return nil
}

// Validate checks a service CIDR as Kubernetes does: one or two prefixes,
// at most one of each family.
func (c *ServiceCIDR) Validate() error {
	if err := validateMeta(&c.Meta, false, dns1123Subdomain); err != nil {
		return err
	}
	if len(c.CIDRs) == 0 || len(c.CIDRs) > 2 {
		return fieldErr("cidrs", "one or two prefixes are required, %d given", len(c.CIDRs))
	}
	for i, p := range c.CIDRs {
		if err := iprange.ValidateServiceRange(p); err != nil {
			return fieldErr(fmt.Sprintf("cidrs[%d]", i), "%v", err)
		}
	}
	if len(c.CIDRs) == 2 && c.CIDRs[0].Addr().Is4() == c.CIDRs[1].Addr().Is4() {
		return fieldErr("cidrs[1]", "the two prefixes must be of different families")
	}
	return nil
}

// Validate checks a pool on its own; overlaps with other pools are the
// registry's to find. The first problem found, in the order of the
// sections below, is the one reported.
func (p *AddressPool) Validate() error {
	return firstError(
		func() error { return validateMeta(&p.Meta, false, dns1123Subdomain) },
		p.validateRanges,
		func() error {
			if p.L2 == nil {
				return nil
			}
			if !p.BGP.IsZero() {
				return p.L2.validate("bgp_advertisement")
			}
			return p.L2.validate("")
		},
		func() error {
			if p.Allocation == nil {
				return nil
			}
			return p.Allocation.validate()
		},
		p.validateBGP,
	)
}

// validateRanges checks that every range holds only assignable addresses,
// then that no two ranges overlap.
func (p *AddressPool) validateRanges() error {
	if len(p.Ranges) == 0 {
		return fieldErr("addresses", "at least one CIDR or range is required")
	}
	for i, r := range p.Ranges {
		for _, bad := range notAssignable {
			lo, hi := bad.prefix.Masked().Addr(), lastOf(bad.prefix)
			if r.First.Is4() == lo.Is4() && r.First.Compare(hi) <= 0 && lo.Compare(r.Last) <= 0 {
				return fieldErr(fmt.Sprintf("addresses[%d]", i), "holds %s addresses (%s), which no service can be given", bad.what, bad.prefix)
			}
		}
	}
	for i, r := range p.Ranges {
		for j := range i {
			if o := p.Ranges[j]; r.First.Is4() == o.First.Is4() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0 {
				return fieldErr(fmt.Sprintf("addresses[%d]", i), "overlaps addresses[%d]", j)
			}
		}
	}
	return nil
}

func (a *ServiceAllocation) validate() error {
	if a.Priority < 0 {
		return fieldErr("service_allocation.priority", "%d is negative", a.Priority)
	}
	if len(a.Namespaces) > maxAllocationNamespaces {
		return fieldErr("service_allocation.namespaces", "%d namespaces; at most %d", len(a.Namespaces), maxAllocationNamespaces)
	}
	for i, ns := range a.Namespaces {
		if !dns1123Label.MatchString(ns) {
			return fieldErr(fmt.Sprintf("service_allocation.namespaces[%d]", i), "%q is not a namespace name", ns)
		}
		if slices.Contains(a.Namespaces[:i], ns) {
			return fieldErr(fmt.Sprintf("service_allocation.namespaces[%d]", i), "%q is given twice", ns)
		}
	}
	if err := validateLabels("service_allocation.service_selector", a.ServiceSelector); err != nil {
		return err
	}
	return validateLabels("service_allocation.namespace_selector", a.NamespaceSelector)
}

// maxAdvertisements bounds a pool's bgp_advertisements (Weir's).
const maxAdvertisements = 32

// validateBGP checks the pool's one advertisement or its several.
func (p *AddressPool) validateBGP() error {
	if len(p.BGPAdvertisements) == 0 {
		if len(p.BGP.NodeSelector) > 0 || len(p.BGP.ServiceSelector) > 0 {
			return fieldErr("bgp_advertisement", "node_selector and service_selector are for bgp_advertisements, several advertisements each for some nodes and services: move it there")
		}
		return p.validateAdvertisement("bgp_advertisement", &p.BGP)
	}
	if !p.BGP.IsZero() {
		return fieldErr("bgp_advertisements", "a pool has one bgp_advertisement or several bgp_advertisements, not both: remove bgp_advertisement")
	}
	if len(p.BGPAdvertisements) > maxAdvertisements {
		return fieldErr("bgp_advertisements", "%d advertisements; at most %d", len(p.BGPAdvertisements), maxAdvertisements)
	}
	for i := range p.BGPAdvertisements {
		a := &p.BGPAdvertisements[i]
		field := fmt.Sprintf("bgp_advertisements[%d]", i)
		if err := p.validateAdvertisement(field, a); err != nil {
			return err
		}
		if a.MaxAnnouncingNodes != 0 {
			return fieldErr(field+".max_announcing_nodes", "is for a pool's one bgp_advertisement: with several, choose the announcing nodes by node_selector")
		}
		if len(a.ServiceSelector) > 0 && (a.AggregationLength != 0 || a.AggregationLengthV6 != 0) {
			// MetalLB's rule too: an aggregate would announce the other
			// services' addresses with this one's attributes.
			return fieldErr(field+".service_selector", "is exclusive with aggregation_length and aggregation_length_v6: an aggregate holds other services' addresses too")
		}
		if err := validateLabels(field+".node_selector", a.NodeSelector); err != nil {
			return err
		}
		if err := validateLabels(field+".service_selector", a.ServiceSelector); err != nil {
			return err
		}
	}
	return nil
}

// validateAdvertisement checks one advertisement's peers and the
// aggregation lengths of each family.
func (p *AddressPool) validateAdvertisement(field string, a *BGPAdvertisement) error {
	for i, peer := range a.Peers {
		if !dns1123Subdomain.MatchString(peer) {
			return fieldErr(fmt.Sprintf("%s.peers[%d]", field, i), "%q is not a BGP peer's name", peer)
		}
	}
	if err := p.validateAggregation(field+".aggregation_length", a.AggregationLength, true); err != nil {
		return err
	}
	return p.validateAggregation(field+".aggregation_length_v6", a.AggregationLengthV6, false)
}

// validateAggregation checks one family's aggregation length, 0 being
// none.
func (p *AddressPool) validateAggregation(field string, bits int, is4 bool) error {
	if bits == 0 {
		return nil
	}
	width := 128
	if is4 {
		width = 32
	}
	if bits < 1 || bits > width {
		return fieldErr(field, "%d is not a prefix length (1-%d)", bits, width)
	}
	// Each address's aggregate must lie inside the pool: no prefix of
	// the pool may be longer than the aggregation length.
	for i, r := range p.Ranges {
		if r.First.Is4() != is4 {
			continue
		}
		for _, pfx := range r.Prefixes() {
			if pfx.Bits() > bits {
				return fieldErr(field, "%d would announce addresses outside the pool: addresses[%d] holds %s, longer than /%d", bits, i, pfx, bits)
			}
		}
	}
	return nil
}

// BGPBesideL2 is why an L2 pool may not have bgp_advertisement: its one
// advertisement is the default of a pool that is not answered over L2,
// so an L2 pool says that it is announced over BGP too, and by which
// nodes, with bgp_advertisements.
const BGPBesideL2 = "an L2 pool is announced over BGP too by its bgp_advertisements (one with no field set: every node, no attribute), not by bgp_advertisement: move it there"

// maxInterfaces bounds an L2 advertisement's interfaces (Weir's).
const maxInterfaces = 16

// maxAllocationNamespaces bounds a pool's service_allocation.namespaces.
const maxAllocationNamespaces = 64

// interfaceName is a Linux interface name: 1 to 15 bytes (IFNAMSIZ less
// the NUL), no '/', ':' or white space, not "." or "..".
var interfaceName = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,15}$`)

// validate checks the L2 advertisement of a pool that also sets the BGP
// field bgp ("" for none).
func (a *L2Advertisement) validate(bgp string) error {
	if bgp != "" {
		return fieldErr(bgp, "%s", BGPBesideL2)
	}
	if len(a.Interfaces) > maxInterfaces {
		return fieldErr("l2_advertisement.interfaces", "%d interfaces; at most %d", len(a.Interfaces), maxInterfaces)
	}
	for i, name := range a.Interfaces {
		if !validInterfaceName(name) {
			return fieldErr(fmt.Sprintf("l2_advertisement.interfaces[%d]", i), "%q is not an interface name (1 to 15 of letters, digits, '_', '.', '@' and '-')", name)
		}
		if slices.Contains(a.Interfaces[:i], name) {
			return fieldErr(fmt.Sprintf("l2_advertisement.interfaces[%d]", i), "%q is given twice", name)
		}
	}
	if err := validateLabels("l2_advertisement.node_selector", a.NodeSelector); err != nil {
		return err
	}
	return validateLabels("l2_advertisement.service_selector", a.ServiceSelector)
}

// Validate checks a BGP peer.
func (p *BGPPeer) Validate() error {
	if err := validateMeta(&p.Meta, false, dns1123Subdomain); err != nil {
		return err
	}
	if err := p.validateWhere(); err != nil {
		return err
	}
	switch {
	case p.ASN == 0 && p.DynamicASN == "":
		return fieldErr("asn", "the router's AS number is required (or dynamic_asn)")
	case p.ASN != 0 && p.DynamicASN != "":
		return fieldErr("dynamic_asn", "stands for asn: set one, not both")
	case p.DynamicASN != "":
		if err := bgpnumbers.ValidateDynamicASN(p.DynamicASN); err != nil {
			return fieldErr("dynamic_asn", "%s", err)
		}
	}
	if p.MyASN == 0 {
		return fieldErr("my_asn", "the nodes' AS number is required")
	}
	for _, f := range []struct {
		field string
		asn   uint32
	}{{"asn", p.ASN}, {"my_asn", p.MyASN}} {
		// An asn of 0 is a dynamic one, checked above.
		if err := bgpnumbers.ValidateASN(f.asn); err != nil && f.asn != 0 {
			return fieldErr(f.field, "%s", err)
		}
	}
	if p.Port != 0 && !validPort(p.Port) {
		return fieldErr("port", "%d is not a port (1-65535)", p.Port)
	}
	if p.HoldTime != 0 && (p.HoldTime < 3*time.Second || p.HoldTime > 65535*time.Second) {
		return fieldErr("hold_time_seconds", "must be 0 (90 s) or between 3 and 65535")
	}
	if err := p.validateSession(); err != nil {
		return err
	}
	return validateLabels("node_selector", p.NodeSelector)
}

// validateWhere checks where the router is: a unicast address, an IPv6
// link-local address on an interface, or an interface alone (unnumbered);
// and the VRF the session is bound to.
func (p *BGPPeer) validateWhere() error {
	linkLocal := p.Address.Is6() && p.Address.IsLinkLocalUnicast()
	switch {
	case !p.Address.IsValid() && p.Interface == "":
		return fieldErr("address", "the router's address is required, or interface for an unnumbered peer")
	case linkLocal && p.Interface == "":
		return fieldErr("interface", "%s is link-local: name the node's interface it is on", p.Address)
	case p.Address.IsValid() && p.Interface != "" && !linkLocal:
		return fieldErr("interface", "only for an unnumbered peer (no address) or an IPv6 link-local address (fe80::/10); %s is routed", p.Address)
	case p.Address.IsValid() && !linkLocal:
		if err := validateUnicast("address", p.Address); err != nil {
			return err
		}
	}
	if p.Address.Zone() != "" {
		return fieldErr("address", "%q carries a zone: write it as interface", p.Address)
	}
	for _, f := range []struct{ field, name string }{{"interface", p.Interface}, {"vrf", p.VRF}} {
		if f.name != "" && !validInterfaceName(f.name) {
			return fieldErr(f.field, "%q is not an interface name (1 to 15 of letters, digits, '_', '.', '@' and '-')", f.name)
		}
	}
	if !p.LinkLocal() {
		return nil
	}
	// A link-local address is on the link only, and so is the session.
	if p.EBGPMultihopTTL > 1 {
		return fieldErr("ebgp_multihop_ttl", "a link-local router is on the link: no multi-hop")
	}
	if p.SourceAddress.IsValid() {
		return fieldErr("source_address", "a link-local session is made from the interface's own link-local address")
	}
	return nil
}

// validInterfaceName reports whether name is a Linux interface name.
func validInterfaceName(name string) bool {
	return interfaceName.MatchString(name) && name != "." && name != ".."
}

// validateSession checks the session options a fabric needs: multi-hop,
// source address and timers.
func (p *BGPPeer) validateSession() error {
	if p.EBGPMultihopTTL > 255 {
		return fieldErr("ebgp_multihop_ttl", "%d is not a TTL: must be 0 (directly connected) or 1-255", p.EBGPMultihopTTL)
	}
	if p.SourceAddress.IsValid() {
		if err := validateUnicast("source_address", p.SourceAddress); err != nil {
			return err
		}
		if p.SourceAddress.Is4() != p.Address.Is4() {
			return fieldErr("source_address", "%s is not of the address family of the peer's address %s", p.SourceAddress, p.Address)
		}
	}
	hold := cmp.Or(p.HoldTime, bgpnumbers.DefaultHoldTime)
	if p.Keepalive < 0 || p.Keepalive >= hold {
		return fieldErr("keepalive_seconds", "must be 0 (a third of the hold time) or 1 s or more and less than the hold time (%d s)", hold/time.Second)
	}
	if p.ConnectRetry < 0 || p.ConnectRetry > 65535*time.Second {
		return fieldErr("connect_retry_seconds", "must be 0 (1 s) or 1-65535")
	}
	if p.BFD != nil {
		if err := p.BFD.Validate(); err != nil {
			field, reason, _ := strings.Cut(err.Error(), ": ")
			return fieldErr("bfd."+field, "%s", reason)
		}
		if p.BFD.MinimumTTL != 0 && p.EBGPMultihopTTL <= 1 {
			return fieldErr("bfd.minimum_ttl", "only for a multi-hop session (ebgp_multihop_ttl above 1): a single-hop one takes only TTL 255")
		}
		if p.VRF != "" {
			// Its sockets would be routed by the default VRF's table, so
			// it would never come up: say so rather than run it.
			return fieldErr("bfd", "not run in a VRF (vrf %q): BFD's sockets are not bound to one; take bfd off or peer outside the VRF", p.VRF)
		}
	}
	return nil
}

// notAssignable are the addresses a pool may not hold: a node cannot
// answer for them as a service's.
var notAssignable = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// lastOf is a prefix's last address.
func lastOf(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().AsSlice()
	for i := range a {
		bits := p.Bits() - 8*i
		switch {
		case bits <= 0:
			a[i] = 0xff
		case bits < 8:
			a[i] |= 0xff >> bits
		}
	}
	last, _ := netip.AddrFromSlice(a)
	return last
}
