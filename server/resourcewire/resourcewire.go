// Package resourcewire translates the registry's resources between the
// model and their wire form: the API's messages, and the resources file
// that is written in the API's YAML. The proto types stop here: a request
// is translated into model types once, and an answer back. A value that
// does not parse is a FieldError naming the field as the API spells it.
package resourcewire

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpnumbers"
	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
)

func metaFromProto(m *weirv1.ObjectMeta) (model.Meta, error) {
	out := model.Meta{Namespace: m.GetNamespace(), Name: m.GetName(), Labels: m.GetLabels()}
	if rv := m.GetResourceVersion(); rv != "" {
		v, err := strconv.ParseUint(rv, 10, 64)
		if err != nil {
			return out, &model.FieldError{Field: "metadata.resource_version", Reason: fmt.Sprintf("%q is not a resource version", rv)}
		}
		out.ResourceVersion = v
	}
	return out, nil
}

func metaToProto(m *model.Meta) *weirv1.ObjectMeta {
	return &weirv1.ObjectMeta{
		Namespace:       m.Namespace,
		Name:            m.Name,
		Labels:          m.Labels,
		ResourceVersion: strconv.FormatUint(m.ResourceVersion, 10),
		Revision:        m.ResourceVersion,
		CreateTime:      timestamppb.New(m.CreateTime),
		Source:          m.Source,
	}
}

func parseAddrs(field string, ss []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, &model.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("%q is not an IP address", s)}
		}
		out = append(out, a)
	}
	return out, nil
}

func parsePrefixes(field string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, &model.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("%q is not a CIDR", s)}
		}
		out = append(out, p)
	}
	return out, nil
}

func strs[T fmt.Stringer](xs []T) []string {
	var out []string
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

var serviceTypes = map[weirv1.ServiceType]model.ServiceType{
	weirv1.ServiceType_SERVICE_TYPE_UNSPECIFIED:   model.ClusterIP,
	weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP:    model.ClusterIP,
	weirv1.ServiceType_SERVICE_TYPE_NODE_PORT:     model.NodePort,
	weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER: model.LoadBalancer,
}

var protocols = map[weirv1.Protocol]model.Protocol{
	weirv1.Protocol_PROTOCOL_UNSPECIFIED: model.TCP,
	weirv1.Protocol_PROTOCOL_TCP:         model.TCP,
	weirv1.Protocol_PROTOCOL_UDP:         model.UDP,
	weirv1.Protocol_PROTOCOL_SCTP:        model.SCTP,
}

var policies = map[weirv1.TrafficPolicy]model.TrafficPolicy{
	weirv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED: model.PolicyCluster,
	weirv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER:     model.PolicyCluster,
	weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL:       model.PolicyLocal,
}

// lookup maps an enum value, naming the field when it is unknown.
func lookup[K ~int32, V any](m map[K]V, field string, k K) (V, error) {
	v, ok := m[k]
	if !ok {
		return v, &model.FieldError{Field: field, Reason: fmt.Sprintf("unknown value %d", k)}
	}
	return v, nil
}

// reverse finds the first proto value for a model value (skipping UNSPECIFIED).
func reverse[K ~int32, V comparable](m map[K]V, v V) K {
	var best K
	for k, mv := range m {
		if mv == v && (best == 0 || k < best) && k != 0 {
			best = k
		}
	}
	return best
}

// ServiceFromProto reads a service from its wire form.
func ServiceFromProto(s *weirv1.Service) (*model.Service, error) {
	meta, err := metaFromProto(s.GetMetadata())
	if err != nil {
		return nil, err
	}
	spec := s.GetSpec()
	out := &model.Service{Meta: meta}
	if out.Type, err = lookup(serviceTypes, "spec.type", spec.GetType()); err != nil {
		return nil, err
	}
	if out.ClusterIPs, err = parseAddrs("spec.cluster_ips", spec.GetClusterIps()); err != nil {
		return nil, err
	}
	if out.ExternalIPs, err = parseAddrs("spec.external_ips", spec.GetExternalIps()); err != nil {
		return nil, err
	}
	if out.LoadBalancerIPs, err = parseAddrs("status.load_balancer_ips", s.GetStatus().GetLoadBalancerIps()); err != nil {
		return nil, err
	}
	if out.LoadBalancerSourceRanges, err = parsePrefixes("spec.load_balancer_source_ranges", spec.GetLoadBalancerSourceRanges()); err != nil {
		return nil, err
	}
	for i, p := range spec.GetPorts() {
		proto, err := lookup(protocols, fmt.Sprintf("spec.ports[%d].protocol", i), p.GetProtocol())
		if err != nil {
			return nil, err
		}
		out.Ports = append(out.Ports, model.ServicePort{Name: p.GetName(), Protocol: proto, Port: p.GetPort(), TargetPort: p.GetTargetPort(), NodePort: p.GetNodePort()})
	}
	switch spec.GetSessionAffinity() {
	case weirv1.SessionAffinity_SESSION_AFFINITY_UNSPECIFIED, weirv1.SessionAffinity_SESSION_AFFINITY_NONE:
		if spec.GetSessionAffinityTimeoutSeconds() != 0 {
			return nil, &model.FieldError{Field: "spec.session_affinity_timeout_seconds", Reason: "only with session_affinity CLIENT_IP"}
		}
	case weirv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP:
		out.SessionAffinityTimeout = time.Duration(spec.GetSessionAffinityTimeoutSeconds()) * time.Second
		if out.SessionAffinityTimeout == 0 {
			out.SessionAffinityTimeout = model.DefaultSessionAffinityTimeout
		}
	default:
		return nil, &model.FieldError{Field: "spec.session_affinity", Reason: fmt.Sprintf("unknown value %d", spec.GetSessionAffinity())}
	}
	if out.ExternalTrafficPolicy, err = lookup(policies, "spec.external_traffic_policy", spec.GetExternalTrafficPolicy()); err != nil {
		return nil, err
	}
	if out.InternalTrafficPolicy, err = lookup(policies, "spec.internal_traffic_policy", spec.GetInternalTrafficPolicy()); err != nil {
		return nil, err
	}
	out.HealthCheckNodePort = spec.GetHealthCheckNodePort()
	if out.RequestedLoadBalancerIPs, err = parseAddrs("spec.load_balancer_ips", spec.GetLoadBalancerIps()); err != nil {
		return nil, err
	}
	out.AddressPool, out.AllowSharedIP = spec.GetAddressPool(), spec.GetAllowSharedIp()
	if spec.GetLoadBalancerClass() != "" {
		return nil, &model.FieldError{Field: "spec.load_balancer_class", Reason: "only Kubernetes services have a class: a native service is Weir's"}
	}
	switch spec.GetTrafficDistribution() {
	case weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED:
	case weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_CLOSE:
		out.PreferClose = true
	default:
		return nil, &model.FieldError{Field: "spec.traffic_distribution", Reason: fmt.Sprintf("unknown value %d", spec.GetTrafficDistribution())}
	}
	return out, nil
}

// ServiceToProto is the wire form of a service.
func ServiceToProto(s *model.Service) *weirv1.Service {
	spec := &weirv1.ServiceSpec{
		Type:                     reverse(serviceTypes, s.Type),
		ClusterIps:               strs(s.ClusterIPs),
		ExternalIps:              strs(s.ExternalIPs),
		SessionAffinity:          weirv1.SessionAffinity_SESSION_AFFINITY_NONE,
		ExternalTrafficPolicy:    reverse(policies, s.ExternalTrafficPolicy),
		InternalTrafficPolicy:    reverse(policies, s.InternalTrafficPolicy),
		HealthCheckNodePort:      s.HealthCheckNodePort,
		LoadBalancerSourceRanges: strs(s.LoadBalancerSourceRanges),
		LoadBalancerIps:          strs(s.RequestedLoadBalancerIPs),
		AddressPool:              s.AddressPool,
		AllowSharedIp:            s.AllowSharedIP,
		LoadBalancerClass:        s.LoadBalancerClass,
	}
	if s.SessionAffinityTimeout > 0 {
		spec.SessionAffinity = weirv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP
		spec.SessionAffinityTimeoutSeconds = int32(s.SessionAffinityTimeout / time.Second)
	}
	if s.PreferClose {
		spec.TrafficDistribution = weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_CLOSE
	}
	for _, p := range s.Ports {
		spec.Ports = append(spec.Ports, &weirv1.ServicePort{Name: p.Name, Protocol: reverse(protocols, p.Protocol), Port: p.Port, TargetPort: p.TargetPort, NodePort: p.NodePort})
	}
	return &weirv1.Service{Metadata: metaToProto(&s.Meta), Spec: spec, Status: &weirv1.ServiceStatus{
		LoadBalancerIps: strs(s.LoadBalancerIPs), AddressReason: s.AddressReason, AddressMessage: s.AddressMessage,
		OtherController: s.OtherController,
	}}
}

// EndpointSliceFromProto reads an endpoint slice from its wire form.
func EndpointSliceFromProto(s *weirv1.EndpointSlice) (*model.EndpointSlice, error) {
	meta, err := metaFromProto(s.GetMetadata())
	if err != nil {
		return nil, err
	}
	out := &model.EndpointSlice{Meta: meta, ServiceName: s.GetServiceName()}
	for i, e := range s.GetEndpoints() {
		// The field's path only for an error: one slice per change in a storm.
		addrs, err := parseAddrs("", e.GetAddresses())
		if err != nil {
			if fe, ok := model.AsFieldError(err); ok {
				fe.Field = fmt.Sprintf("endpoints[%d].addresses%s", i, fe.Field)
			}
			return nil, err
		}
		var c weirv1.EndpointConditions
		if e.GetConditions() != nil {
			c = *e.GetConditions()
		}
		out.Endpoints = append(out.Endpoints, model.Endpoint{
			Addresses: addrs, Ready: c.Ready, Serving: c.Serving, Terminating: c.Terminating,
			NodeName: e.GetNodeName(), Zone: e.GetZone(), HintZones: e.GetHintZones(), HintNodes: e.GetHintNodes(),
		})
	}
	for i, p := range s.GetPorts() {
		proto, err := lookup(protocols, fmt.Sprintf("ports[%d].protocol", i), p.GetProtocol())
		if err != nil {
			return nil, err
		}
		out.Ports = append(out.Ports, model.EndpointPort{Name: p.GetName(), Protocol: proto, Port: p.GetPort()})
	}
	return out, nil
}

// EndpointSliceToProto is the wire form of an endpoint slice.
func EndpointSliceToProto(s *model.EndpointSlice) *weirv1.EndpointSlice {
	out := &weirv1.EndpointSlice{Metadata: metaToProto(&s.Meta), ServiceName: s.ServiceName}
	for _, e := range s.Endpoints {
		out.Endpoints = append(out.Endpoints, &weirv1.Endpoint{
			Addresses:  strs(e.Addresses),
			Conditions: &weirv1.EndpointConditions{Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating},
			NodeName:   e.NodeName, Zone: e.Zone, HintZones: e.HintZones, HintNodes: e.HintNodes,
		})
	}
	for _, p := range s.Ports {
		out.Ports = append(out.Ports, &weirv1.EndpointPort{Name: p.Name, Protocol: reverse(protocols, p.Protocol), Port: p.Port})
	}
	return out
}

// NodeFromProto reads a node from its wire form.
func NodeFromProto(n *weirv1.Node) (*model.Node, error) {
	meta, err := metaFromProto(n.GetMetadata())
	if err != nil {
		return nil, err
	}
	out := &model.Node{Meta: meta, Zone: n.GetZone(), Deleting: n.GetDeleting()}
	if out.Addresses, err = parseAddrs("addresses", n.GetAddresses()); err != nil {
		return nil, err
	}
	if out.PodCIDRs, err = parsePrefixes("pod_cidrs", n.GetPodCidrs()); err != nil {
		return nil, err
	}
	return out, nil
}

// NodeToProto is the wire form of a node.
func NodeToProto(n *model.Node) *weirv1.Node {
	out := &weirv1.Node{Metadata: metaToProto(&n.Meta), Addresses: strs(n.Addresses), Zone: n.Zone, PodCidrs: strs(n.PodCIDRs), Deleting: n.Deleting,
		Drained: n.Drained}
	if !n.DrainDeadline.IsZero() {
		out.DrainDeadline = timestamppb.New(n.DrainDeadline)
	}
	return out
}

// PoolFromProto reads an address pool (fields are named as in the API).
func PoolFromProto(p *weirv1.AddressPool) (*model.AddressPool, error) {
	meta, err := metaFromProto(p.GetMetadata())
	if err != nil {
		return nil, err
	}
	out := &model.AddressPool{Meta: meta, ManualOnly: p.GetManualOnly(), AvoidBuggyIPs: p.GetAvoidBuggyIps()}
	if l2 := p.GetL2Advertisement(); l2 != nil {
		out.L2 = &model.L2Advertisement{Interfaces: l2.GetInterfaces(), NodeSelector: l2.GetNodeSelector(), ServiceSelector: l2.GetServiceSelector()}
	}
	if a := p.GetServiceAllocation(); a != nil {
		out.Allocation = &model.ServiceAllocation{Priority: int(a.GetPriority()), Namespaces: a.GetNamespaces(), ServiceSelector: a.GetServiceSelector(),
			NamespaceSelector: a.GetNamespaceSelector()}
	}
	if out.L2 != nil && p.GetBgpAdvertisement() != nil {
		// Even empty: what it asks for (BGP too) would not be done.
		return nil, &model.FieldError{Field: "bgp_advertisement", Reason: model.BGPBesideL2}
	}
	if out.BGP, err = advertisementFromProto("bgp_advertisement", p.GetBgpAdvertisement()); err != nil {
		return nil, err
	}
	for i, adv := range p.GetBgpAdvertisements() {
		a, err := advertisementFromProto(fmt.Sprintf("bgp_advertisements[%d]", i), adv)
		if err != nil {
			return nil, err
		}
		out.BGPAdvertisements = append(out.BGPAdvertisements, a)
	}
	for i, a := range p.GetAddresses() {
		r, err := model.ParseAddressRange(a)
		if err != nil {
			return nil, &model.FieldError{Field: fmt.Sprintf("addresses[%d]", i), Reason: err.Error()}
		}
		out.Ranges = append(out.Ranges, r)
	}
	return out, nil
}

// advertisementFromProto reads one BGP advertisement given at field.
func advertisementFromProto(field string, adv *weirv1.BgpAdvertisement) (model.BGPAdvertisement, error) {
	out := model.BGPAdvertisement{LocalPref: adv.GetLocalPreference(), Peers: adv.GetPeers(),
		AggregationLength: int(adv.GetAggregationLength()), AggregationLengthV6: int(adv.GetAggregationLengthV6()),
		MaxAnnouncingNodes: int(adv.GetMaxAnnouncingNodes()), NodeSelector: adv.GetNodeSelector(), ServiceSelector: adv.GetServiceSelector()}
	for i, c := range adv.GetCommunities() {
		v, err := bgpcommunity.Parse(c)
		if err != nil {
			return model.BGPAdvertisement{}, &model.FieldError{Field: fmt.Sprintf("%s.communities[%d]", field, i), Reason: err.Error()}
		}
		out.AddCommunity(v)
	}
	return out, nil
}

// advertisementToProto is the wire form of one BGP advertisement.
func advertisementToProto(a model.BGPAdvertisement) *weirv1.BgpAdvertisement {
	return &weirv1.BgpAdvertisement{LocalPreference: a.LocalPref, Peers: a.Peers,
		AggregationLength: uint32(a.AggregationLength), AggregationLengthV6: uint32(a.AggregationLengthV6),
		MaxAnnouncingNodes: uint32(a.MaxAnnouncingNodes), Communities: a.CommunityList(),
		NodeSelector: a.NodeSelector, ServiceSelector: a.ServiceSelector}
}

// PoolToProto is the wire form of an address pool.
func PoolToProto(p *model.AddressPool) *weirv1.AddressPool {
	out := &weirv1.AddressPool{Metadata: metaToProto(&p.Meta), ManualOnly: p.ManualOnly, AvoidBuggyIps: p.AvoidBuggyIPs}
	if !p.BGP.IsZero() {
		out.BgpAdvertisement = advertisementToProto(p.BGP)
	}
	for _, a := range p.BGPAdvertisements {
		out.BgpAdvertisements = append(out.BgpAdvertisements, advertisementToProto(a))
	}
	if p.L2 != nil {
		out.L2Advertisement = &weirv1.L2Advertisement{Interfaces: p.L2.Interfaces, NodeSelector: p.L2.NodeSelector, ServiceSelector: p.L2.ServiceSelector}
	}
	if a := p.Allocation; a != nil {
		out.ServiceAllocation = &weirv1.ServiceAllocation{Priority: int32(a.Priority), Namespaces: a.Namespaces, ServiceSelector: a.ServiceSelector,
			NamespaceSelector: a.NamespaceSelector}
	}
	for _, r := range p.Ranges {
		out.Addresses = append(out.Addresses, r.String())
	}
	return out
}

// BGPPeerFromProto reads a BGP peer (fields are named as in the API).
func BGPPeerFromProto(p *weirv1.BgpPeer) (*model.BGPPeer, error) {
	meta, err := metaFromProto(p.GetMetadata())
	if err != nil {
		return nil, err
	}
	out := &model.BGPPeer{Meta: meta, ASN: p.GetAsn(), MyASN: p.GetMyAsn(), Port: p.GetPort(),
		HoldTime: time.Duration(p.GetHoldTimeSeconds()) * time.Second, Password: p.GetPassword(), NodeSelector: p.GetNodeSelector(),
		GracefulRestart: p.GetGracefulRestart(), EBGPMultihopTTL: p.GetEbgpMultihopTtl(),
		Keepalive:    time.Duration(p.GetKeepaliveSeconds()) * time.Second,
		ConnectRetry: time.Duration(p.GetConnectRetrySeconds()) * time.Second}
	if out.BFD, err = nodewire.DecodeBFD(p.GetBfd()); err != nil {
		field, reason, _ := strings.Cut(err.Error(), ": ")
		return nil, &model.FieldError{Field: "bfd." + field, Reason: reason}
	}
	if out.Address, out.Interface, err = PeerAddress(p.GetAddress(), p.GetInterface()); err != nil {
		return nil, err
	}
	out.DynamicASN, out.VRF = bgpnumbers.DynamicASN(p.GetDynamicAsn()), p.GetVrf()
	if s := p.GetSourceAddress(); s != "" {
		if out.SourceAddress, err = netip.ParseAddr(s); err != nil {
			return nil, &model.FieldError{Field: "source_address", Reason: fmt.Sprintf("%q is not an IP address", s)}
		}
	}
	return out, nil
}

// PeerAddress reads a peer's address and interface: "" for an unnumbered
// peer; a zone ("fe80::1%eth0") is the interface, which, when also
// given, must be the same.
func PeerAddress(address, iface string) (netip.Addr, string, error) {
	if address == "" {
		return netip.Addr{}, iface, nil
	}
	a, err := netip.ParseAddr(address)
	if err != nil {
		return netip.Addr{}, "", &model.FieldError{Field: "address", Reason: fmt.Sprintf("%q is not an IP address", address)}
	}
	if zone := a.Zone(); zone != "" {
		if iface != "" && iface != zone {
			return netip.Addr{}, "", &model.FieldError{Field: "interface", Reason: fmt.Sprintf("%q is not the zone of address %s", iface, address)}
		}
		a, iface = a.WithZone(""), zone
	}
	return a, iface, nil
}

// BGPPeerToProto leaves the password out: it is write-only.
func BGPPeerToProto(p *model.BGPPeer) *weirv1.BgpPeer {
	out := &weirv1.BgpPeer{Metadata: metaToProto(&p.Meta), Address: p.Address.String(), Asn: p.ASN, MyAsn: p.MyASN, Port: p.Port,
		HoldTimeSeconds: int32(p.HoldTime / time.Second), NodeSelector: p.NodeSelector, GracefulRestart: p.GracefulRestart,
		EbgpMultihopTtl: p.EBGPMultihopTTL, KeepaliveSeconds: int32(p.Keepalive / time.Second),
		ConnectRetrySeconds: int32(p.ConnectRetry / time.Second), Bfd: nodewire.EncodeBFD(p.BFD),
		Interface: p.Interface, DynamicAsn: string(p.DynamicASN), Vrf: p.VRF}
	if !p.Address.IsValid() {
		out.Address = ""
	}
	if p.SourceAddress.IsValid() {
		out.SourceAddress = p.SourceAddress.String()
	}
	return out
}

// ServiceCIDRFromProto reads a service CIDR; a prefix with host bits set
// is refused by its validation, not masked here.
func ServiceCIDRFromProto(c *weirv1.ServiceCidr) (*model.ServiceCIDR, error) {
	meta, err := metaFromProto(c.GetMetadata())
	if err != nil {
		return nil, err
	}
	cidrs, err := parsePrefixes("cidrs", c.GetCidrs())
	if err != nil {
		return nil, err
	}
	return &model.ServiceCIDR{Meta: meta, CIDRs: cidrs}, nil
}

// ServiceCIDRToProto is the wire form of a service CIDR.
func ServiceCIDRToProto(c *model.ServiceCIDR) *weirv1.ServiceCidr {
	return &weirv1.ServiceCidr{Metadata: metaToProto(&c.Meta), Cidrs: strs(c.CIDRs)}
}
