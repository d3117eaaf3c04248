// Package nodewire translates a node's desired state between the datapath
// model and its wire form in the agent stream (weir.v1.SyncResponse). The
// server encodes, the agent decodes; both sides meet only here.
package nodewire

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpnumbers"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// EncodeNode is the wire form of a node.
func EncodeNode(n datapath.NodeInfo) *weirv1.NodeInfo {
	out := &weirv1.NodeInfo{
		Name:         n.Name,
		Addresses:    strs(n.Addresses),
		Zone:         n.Zone,
		PodCidrs:     strs(n.PodCIDRs),
		Deleting:     n.Deleting,
		Drained:      n.Drained,
		Excluded:     n.Excluded,
		Registered:   n.Registered,
		ServiceCidrs: strs(n.ServiceCIDRs),
	}
	if !n.DrainDeadline.IsZero() {
		out.DrainDeadline = timestamppb.New(n.DrainDeadline)
	}
	for _, p := range n.BGPPeers {
		np := &weirv1.NodePeer{Address: p.Address.String(), Port: int32(p.Port), Asn: p.ASN, MyAsn: p.MyASN,
			HoldTimeSeconds: int32(p.HoldTime / time.Second), Password: p.Password, Name: p.Name, GracefulRestart: p.GracefulRestart,
			EbgpMultihopTtl: uint32(p.EBGPMultihopTTL), KeepaliveSeconds: int32(p.Keepalive / time.Second),
			ConnectRetrySeconds: int32(p.ConnectRetry / time.Second), Bfd: EncodeBFD(p.BFD),
			Interface: p.Interface, DynamicAsn: string(p.DynamicASN), Vrf: p.VRF}
		if !p.Address.IsValid() {
			np.Address = "" // unnumbered
		}
		if p.SourceAddress.IsValid() {
			np.SourceAddress = p.SourceAddress.String()
		}
		out.BgpPeers = append(out.BgpPeers, np)
	}
	for _, a := range n.Advertisements {
		pa := &weirv1.PoolAdvertisement{Communities: a.Communities, LargeCommunities: EncodeLargeCommunities(a.LargeCommunities),
			LocalPreference: a.LocalPref, Peers: a.Peers, AggregationLength: uint32(a.AggregationLength), AggregationLengthV6: uint32(a.AggregationLengthV6),
			Name: a.Name}
		pa.Ranges = encodeRanges(a.Ranges)
		out.Advertisements = append(out.Advertisements, pa)
	}
	for _, p := range n.L2Pools {
		out.L2Pools = append(out.L2Pools, &weirv1.L2Pool{Ranges: encodeRanges(p.Ranges), Interfaces: p.Interfaces, AnnouncedOverBgp: p.AnnouncedOverBGP})
	}
	out.FlowRingSize = uint32(n.FlowRing)
	out.FlowPeers = encodeFlowPeers(n.FlowPeers)
	out.FlowSenders = encodeFlowPeers(n.FlowSenders)
	return out
}

func encodeFlowPeers(ps []datapath.FlowPeer) []*weirv1.FlowPeer {
	var out []*weirv1.FlowPeer
	for _, p := range ps {
		out = append(out, &weirv1.FlowPeer{Name: p.Name, Addresses: strs(p.Addresses)})
	}
	return out
}

// encodeRanges are ranges as "FIRST-LAST".
func encodeRanges(rs []datapath.AddressRange) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.First.String()+"-"+r.Last.String())
	}
	return out
}

// decodeRanges reads "FIRST-LAST" ranges given in field.
func decodeRanges(field string, rs []string) ([]datapath.AddressRange, error) {
	out := make([]datapath.AddressRange, 0, len(rs))
	for j, r := range rs {
		first, last, ok := strings.Cut(r, "-")
		f, err1 := netip.ParseAddr(first)
		l, err2 := netip.ParseAddr(last)
		if !ok || err1 != nil || err2 != nil || f.Is4() != l.Is4() || l.Less(f) {
			return nil, fmt.Errorf("%s[%d]: %q is not FIRST-LAST", field, j, r)
		}
		out = append(out, datapath.AddressRange{First: f, Last: l})
	}
	return out, nil
}

// DecodeNode reads a node from the wire.
func DecodeNode(n *weirv1.NodeInfo) (datapath.NodeInfo, error) {
	addrs, err := parseAddrs("node.addresses", n.GetAddresses())
	if err != nil {
		return datapath.NodeInfo{}, err
	}
	cidrs, err := prefixes("node.pod_cidrs", n.GetPodCidrs())
	if err != nil {
		return datapath.NodeInfo{}, err
	}
	serviceCIDRs, err := prefixes("node.service_cidrs", n.GetServiceCidrs())
	if err != nil {
		return datapath.NodeInfo{}, err
	}
	info := datapath.NodeInfo{
		Name: n.GetName(), Addresses: addrs, Zone: n.GetZone(), PodCIDRs: cidrs,
		Deleting: n.GetDeleting(), Drained: n.GetDrained(), Excluded: n.GetExcluded(), Registered: n.GetRegistered(),
		ServiceCIDRs: serviceCIDRs,
	}
	if d := n.GetDrainDeadline(); d != nil {
		if err := d.CheckValid(); err != nil {
			return datapath.NodeInfo{}, fmt.Errorf("node.drain_deadline: %w", err)
		}
		info.DrainDeadline = d.AsTime()
	}
	for i, p := range n.GetBgpPeers() {
		var a netip.Addr
		if s := p.GetAddress(); s != "" || p.GetInterface() == "" {
			if a, err = netip.ParseAddr(s); err != nil {
				return datapath.NodeInfo{}, fmt.Errorf("node.bgp_peers[%d].address: %w", i, err)
			}
			if a.Zone() != "" {
				return datapath.NodeInfo{}, fmt.Errorf("node.bgp_peers[%d].address: %s carries a zone: the interface is its own field", i, s)
			}
		}
		port, err := port16(fmt.Sprintf("node.bgp_peers[%d].port", i), p.GetPort(), true)
		if err != nil {
			return datapath.NodeInfo{}, err
		}
		if p.GetEbgpMultihopTtl() > 255 {
			return datapath.NodeInfo{}, fmt.Errorf("node.bgp_peers[%d].ebgp_multihop_ttl: %d is not a TTL", i, p.GetEbgpMultihopTtl())
		}
		var source netip.Addr
		if s := p.GetSourceAddress(); s != "" {
			if source, err = netip.ParseAddr(s); err != nil {
				return datapath.NodeInfo{}, fmt.Errorf("node.bgp_peers[%d].source_address: %w", i, err)
			}
		}
		profile, err := DecodeBFD(p.GetBfd())
		if err != nil {
			return datapath.NodeInfo{}, fmt.Errorf("node.bgp_peers[%d].bfd.%w", i, err)
		}
		info.BGPPeers = append(info.BGPPeers, datapath.BGPPeer{Address: a, Port: port, ASN: p.GetAsn(), MyASN: p.GetMyAsn(), BFD: profile,
			HoldTime: time.Duration(p.GetHoldTimeSeconds()) * time.Second, Password: p.GetPassword(),
			Name: p.GetName(), GracefulRestart: p.GetGracefulRestart(),
			EBGPMultihopTTL: uint8(p.GetEbgpMultihopTtl()), SourceAddress: source,
			Interface: p.GetInterface(), DynamicASN: bgpnumbers.DynamicASN(p.GetDynamicAsn()), VRF: p.GetVrf(),
			Keepalive:    time.Duration(p.GetKeepaliveSeconds()) * time.Second,
			ConnectRetry: time.Duration(p.GetConnectRetrySeconds()) * time.Second})
	}
	for i, pa := range n.GetAdvertisements() {
		a := datapath.BGPAdvertisement{Communities: pa.GetCommunities(), LargeCommunities: DecodeLargeCommunities(pa.GetLargeCommunities()),
			LocalPref: pa.GetLocalPreference(), Peers: pa.GetPeers(),
			AggregationLength: int(pa.GetAggregationLength()), AggregationLengthV6: int(pa.GetAggregationLengthV6()), Name: pa.GetName()}
		if a.AggregationLength > 32 || a.AggregationLengthV6 > 128 {
			return datapath.NodeInfo{}, fmt.Errorf("node.advertisements[%d]: aggregation lengths %d and %d are not prefix lengths", i, a.AggregationLength, a.AggregationLengthV6)
		}
		if a.Ranges, err = decodeRanges(fmt.Sprintf("node.advertisements[%d].ranges", i), pa.GetRanges()); err != nil {
			return datapath.NodeInfo{}, err
		}
		info.Advertisements = append(info.Advertisements, a)
	}
	for i, p := range n.GetL2Pools() {
		rs, err := decodeRanges(fmt.Sprintf("node.l2_pools[%d].ranges", i), p.GetRanges())
		if err != nil {
			return datapath.NodeInfo{}, err
		}
		info.L2Pools = append(info.L2Pools, datapath.L2Pool{Ranges: rs, Interfaces: p.GetInterfaces(), AnnouncedOverBGP: p.GetAnnouncedOverBgp()})
	}
	r := n.GetFlowRingSize()
	if peers := max(len(n.GetFlowPeers()), len(n.GetFlowSenders())); r > 1<<16 || int(r) < peers+1 && r != 0 {
		return datapath.NodeInfo{}, fmt.Errorf("node.flow_ring_size: %d with %d peers and %d senders", r, len(n.GetFlowPeers()), len(n.GetFlowSenders()))
	}
	info.FlowRing = int(r)
	if info.FlowPeers, err = decodeFlowPeers("node.flow_peers", n.GetFlowPeers()); err != nil {
		return datapath.NodeInfo{}, err
	}
	if info.FlowSenders, err = decodeFlowPeers("node.flow_senders", n.GetFlowSenders()); err != nil {
		return datapath.NodeInfo{}, err
	}
	return info, nil
}

// decodeFlowPeers reads the ring's nodes given in field.
func decodeFlowPeers(field string, ps []*weirv1.FlowPeer) ([]datapath.FlowPeer, error) {
	var out []datapath.FlowPeer
	for i, p := range ps {
		addrs, err := parseAddrs(fmt.Sprintf("%s[%d].addresses", field, i), p.GetAddresses())
		if err != nil {
			return nil, err
		}
		out = append(out, datapath.FlowPeer{Name: p.GetName(), Addresses: addrs})
	}
	return out, nil
}

// EncodeService is the wire form of a service as one node forwards it.
func EncodeService(s *datapath.Service) *weirv1.NodeService {
	out := &weirv1.NodeService{
		Namespace:                     s.Key.Namespace,
		Name:                          s.Key.Name,
		ClusterIps:                    strs(s.ClusterIPs),
		ExternalIps:                   strs(s.ExternalIPs),
		LoadBalancerIps:               strs(s.LoadBalancerIPs),
		SessionAffinityTimeoutSeconds: int32(s.SessionAffinityTimeout / time.Second),
		ExternalTrafficPolicy:         encodePolicy(s.ExternalTrafficPolicy),
		InternalTrafficPolicy:         encodePolicy(s.InternalTrafficPolicy),
		HealthCheckNodePort:           int32(s.HealthCheckNodePort),
		LoadBalancerSourceRanges:      strs(s.LoadBalancerSourceRanges),
		OtherController:               s.OtherController,
	}
	if s.PreferClose {
		out.TrafficDistribution = weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_CLOSE
	}
	for _, ip := range s.LoadBalancerIPs { // in the addresses' order
		if nodes, ok := s.Announcers[ip]; ok {
			out.Announcers = append(out.Announcers, &weirv1.AddressAnnouncers{Address: ip.String(), Nodes: nodes})
		}
		if names, ok := s.Advertisements[ip]; ok {
			out.Advertisements = append(out.Advertisements, &weirv1.AddressAdvertisements{Address: ip.String(), Names: names})
		}
	}
	for _, p := range s.Ports {
		wp := &weirv1.NodeServicePort{Name: p.Name, Protocol: weirv1.Protocol(p.Protocol), Port: int32(p.Port), NodePort: int32(p.NodePort)}
		for _, e := range p.Endpoints {
			wp.Endpoints = append(wp.Endpoints, &weirv1.NodeEndpoint{
				Address: e.Addr.String(), Port: int32(e.Port), NodeName: e.NodeName, Zone: e.Zone, HintZones: e.HintZones(), HintNodes: e.HintNodes(),
				Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
			})
		}
		out.Ports = append(out.Ports, wp)
	}
	return out
}

// DecodeService reads a service from the wire for the node called node,
// marking its endpoints local, and rejecting anything the datapath could
// not program.
func DecodeService(s *weirv1.NodeService, node string) (*datapath.Service, error) {
	key := datapath.ServiceKey{Namespace: s.GetNamespace(), Name: s.GetName()}
	wrap := func(err error) error { return fmt.Errorf("service %s: %w", key, err) }
	out := &datapath.Service{
		Key:                    key,
		SessionAffinityTimeout: time.Duration(s.GetSessionAffinityTimeoutSeconds()) * time.Second,
		ExternalTrafficPolicy:  decodePolicy(s.GetExternalTrafficPolicy()),
		InternalTrafficPolicy:  decodePolicy(s.GetInternalTrafficPolicy()),
		PreferClose:            s.GetTrafficDistribution() == weirv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_CLOSE,
		OtherController:        s.GetOtherController(),
	}
	var err error
	if out.ClusterIPs, err = parseAddrs("cluster_ips", s.GetClusterIps()); err != nil {
		return nil, wrap(err)
	}
	if out.ExternalIPs, err = parseAddrs("external_ips", s.GetExternalIps()); err != nil {
		return nil, wrap(err)
	}
	if out.LoadBalancerIPs, err = parseAddrs("load_balancer_ips", s.GetLoadBalancerIps()); err != nil {
		return nil, wrap(err)
	}
	if out.LoadBalancerSourceRanges, err = prefixes("load_balancer_source_ranges", s.GetLoadBalancerSourceRanges()); err != nil {
		return nil, wrap(err)
	}
	if out.HealthCheckNodePort, err = port16("health_check_node_port", s.GetHealthCheckNodePort(), true); err != nil {
		return nil, wrap(err)
	}
	for i, a := range s.GetAnnouncers() {
		ip, err := netip.ParseAddr(a.GetAddress())
		if err != nil {
			return nil, wrap(fmt.Errorf("announcers[%d].address: %w", i, err))
		}
		if out.Announcers == nil {
			out.Announcers = map[netip.Addr][]string{}
		}
		out.Announcers[ip] = a.GetNodes()
	}
	for i, a := range s.GetAdvertisements() {
		ip, err := netip.ParseAddr(a.GetAddress())
		if err != nil {
			return nil, wrap(fmt.Errorf("advertisements[%d].address: %w", i, err))
		}
		if out.Advertisements == nil {
			out.Advertisements = map[netip.Addr][]string{}
		}
		out.Advertisements[ip] = a.GetNames()
	}
	for i, p := range s.GetPorts() {
		f := fmt.Sprintf("ports[%d]", i)
		proto := datapath.Protocol(p.GetProtocol())
		if proto < datapath.TCP || proto > datapath.SCTP {
			return nil, wrap(fmt.Errorf("%s.protocol: unknown protocol %v", f, p.GetProtocol()))
		}
		sp := datapath.ServicePort{Name: p.GetName(), Protocol: proto}
		if sp.Port, err = port16(f+".port", p.GetPort(), false); err != nil {
			return nil, wrap(err)
		}
		if sp.NodePort, err = port16(f+".node_port", p.GetNodePort(), true); err != nil {
			return nil, wrap(err)
		}
		// A node's state holds a million endpoints at 100,000 services:
		// no more room than they take, and a field's path is written only
		// for an error.
		sp.Endpoints = make([]datapath.Endpoint, 0, len(p.GetEndpoints()))
		for j, e := range p.GetEndpoints() {
			addr, err := netip.ParseAddr(e.GetAddress())
			if err != nil {
				return nil, wrap(fmt.Errorf("%s.endpoints[%d].address: %w", f, j, err))
			}
			ep := datapath.Endpoint{Addr: addr, NodeName: e.GetNodeName(), Local: node != "" && e.GetNodeName() == node,
				Zone: e.GetZone(), Hints: datapath.NewHints(e.GetHintZones(), e.GetHintNodes()),
				Ready: e.GetReady(), Serving: e.GetServing(), Terminating: e.GetTerminating()}
			if ep.Port, err = port16("", e.GetPort(), false); err != nil {
				return nil, wrap(fmt.Errorf("%s.endpoints[%d].port%w", f, j, err))
			}
			sp.Endpoints = append(sp.Endpoints, ep)
		}
		out.Ports = append(out.Ports, sp)
	}
	return out, nil
}

func encodePolicy(p datapath.TrafficPolicy) weirv1.TrafficPolicy {
	if p == datapath.Local {
		return weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	return weirv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
}

func decodePolicy(p weirv1.TrafficPolicy) datapath.TrafficPolicy {
	if p == weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		return datapath.Local
	}
	return datapath.Cluster
}

func strs[T fmt.Stringer](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

func parseAddrs(field string, ss []string) ([]netip.Addr, error) {
	out := make([]netip.Addr, 0, len(ss))
	for i, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		out = append(out, a)
	}
	return out, nil
}

func prefixes(field string, ss []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ss))
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func port16(field string, p int32, zeroOK bool) (uint16, error) {
	if (p == 0 && zeroOK) || (p >= 1 && p <= 65535) {
		return uint16(p), nil
	}
	return 0, fmt.Errorf("%s: %d is not a port", field, p)
}

// EncodeLargeCommunities is the wire form of large communities.
func EncodeLargeCommunities(cs []bgpcommunity.Large) []*weirv1.LargeCommunity {
	var out []*weirv1.LargeCommunity
	for _, c := range cs {
		out = append(out, &weirv1.LargeCommunity{GlobalAdmin: c.Global, LocalData1: c.Local1, LocalData2: c.Local2})
	}
	return out
}

// DecodeLargeCommunities reads large communities from their wire form;
// every value of each field is one, so nothing is refused.
func DecodeLargeCommunities(cs []*weirv1.LargeCommunity) []bgpcommunity.Large {
	var out []bgpcommunity.Large
	for _, c := range cs {
		out = append(out, bgpcommunity.Large{Global: c.GetGlobalAdmin(), Local1: c.GetLocalData1(), Local2: c.GetLocalData2()})
	}
	return out
}

// EncodeBFD is a peer's BFD profile on the wire; nil for none.
func EncodeBFD(p *bfd.Profile) *weirv1.BfdProfile {
	if p == nil {
		return nil
	}
	return &weirv1.BfdProfile{
		ReceiveIntervalMs: uint32(p.ReceiveInterval / time.Millisecond), TransmitIntervalMs: uint32(p.TransmitInterval / time.Millisecond),
		DetectMultiplier: uint32(p.DetectMultiplier), Passive: p.Passive, MinimumTtl: uint32(p.MinimumTTL),
	}
}

// DecodeBFD reads a BFD profile; nil for none. It refuses the numbers that
// fit no byte, naming the field ("detect_multiplier: ..."); the profile's
// own bounds are bfd.Profile.Validate's.
func DecodeBFD(p *weirv1.BfdProfile) (*bfd.Profile, error) {
	if p == nil {
		return nil, nil
	}
	if m := p.GetDetectMultiplier(); m > 255 {
		return nil, fmt.Errorf("detect_multiplier: %d is not 0 (3) or 2-255", m)
	}
	if t := p.GetMinimumTtl(); t > 255 {
		return nil, fmt.Errorf("minimum_ttl: %d is not a TTL: 0 (254) or 1-255", t)
	}
	return &bfd.Profile{
		ReceiveInterval:  time.Duration(p.GetReceiveIntervalMs()) * time.Millisecond,
		TransmitInterval: time.Duration(p.GetTransmitIntervalMs()) * time.Millisecond,
		DetectMultiplier: uint8(p.GetDetectMultiplier()), Passive: p.GetPassive(), MinimumTTL: uint8(p.GetMinimumTtl()),
	}, nil
}
