// Package nodestate computes what one node must forward from the cluster
// state: each service with its endpoints resolved to an address and port and
// marked local or remote for that node.
package nodestate

import (
	"net/netip"
	"slices"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// ProxyNameLabel marks a service handled by a proxy other than the default
// one; Weir skips services whose value is not ProxyName, as kube-proxy does.
const (
	ProxyNameLabel = "service.kubernetes.io/service-proxy-name"
	ProxyName      = "weir"
)

// Node describes the node itself.
func Node(v registry.View, name string) datapath.NodeInfo {
	return NodeOnRing(v, name, FlowRingOf(v))
}

// NodeOnRing is Node with the ring worked out once for every node.
func NodeOnRing(v registry.View, name string, ring FlowRing) datapath.NodeInfo {
	n := v.Node(name)
	if n == nil {
		return datapath.NodeInfo{Name: name}
	}
	info := datapath.NodeInfo{
		Name:          n.Name,
		Addresses:     n.Addresses,
		Zone:          n.Zone,
		PodCIDRs:      n.PodCIDRs,
		Deleting:      n.Deleting,
		Drained:       n.Drained,
		DrainDeadline: n.DrainDeadline,
		Excluded:      n.Excluded(),
		Registered:    true,
	}
	for _, p := range v.Peers() {
		if p.Selects(n.Labels) {
			info.BGPPeers = append(info.BGPPeers, datapath.BGPPeer{
				Address: p.Address, Port: uint16(p.Port), ASN: p.ASN, MyASN: p.MyASN, HoldTime: p.HoldTime, Password: p.Password,
				Name: p.Name, GracefulRestart: p.GracefulRestart,
				// Validation keeps the TTL within 255.
				EBGPMultihopTTL: uint8(p.EBGPMultihopTTL), SourceAddress: p.SourceAddress, Keepalive: p.Keepalive, ConnectRetry: p.ConnectRetry,
				BFD: p.BFD, Interface: p.Interface, DynamicASN: p.DynamicASN, VRF: p.VRF,
			})
		}
	}
	for _, c := range v.ServiceCIDRs() {
		info.ServiceCIDRs = append(info.ServiceCIDRs, c.CIDRs...)
	}
	for _, p := range v.Pools() {
		if p.AnsweredOverL2() {
			info.L2Pools = append(info.L2Pools, datapath.L2Pool{Ranges: ranges(p), Interfaces: p.L2.Interfaces, AnnouncedOverBGP: p.AnnouncedOverBGP()})
		}
		switch {
		case p.Selective():
			for i, adv := range p.BGPAdvertisements {
				if adv.SelectsNode(n.Labels) {
					a := AdvertisementOf(p, adv)
					a.Name = model.AdvertisementName(p.Name, i)
					info.Advertisements = append(info.Advertisements, a)
				}
			}
		case !p.BGP.IsZero():
			info.Advertisements = append(info.Advertisements, Advertisement(p))
		}
	}
	ring.place(&info)
	return info
}

// ranges are the pool's ranges in the datapath's terms.
func ranges(p *model.AddressPool) []datapath.AddressRange {
	out := make([]datapath.AddressRange, 0, len(p.Ranges))
	for _, r := range p.Ranges {
		out = append(out, datapath.AddressRange{First: r.First, Last: r.Last})
	}
	return out
}

// Advertisement is how the nodes announce the pool's addresses over BGP
// (its one advertisement).
func Advertisement(p *model.AddressPool) datapath.BGPAdvertisement {
	return AdvertisementOf(p, p.BGP)
}

// AdvertisementOf is adv, one of p's, in the datapath's terms.
func AdvertisementOf(p *model.AddressPool, adv model.BGPAdvertisement) datapath.BGPAdvertisement {
	return datapath.BGPAdvertisement{Communities: adv.Communities, LargeCommunities: adv.LargeCommunities, LocalPref: adv.LocalPref, Peers: adv.Peers,
		AggregationLength: adv.AggregationLength, AggregationLengthV6: adv.AggregationLengthV6, Ranges: ranges(p)}
}

// Advertisements names, for each of svc's load-balancer IPs in a pool
// with several advertisements, those that select the service
// (model.AddressPool.AdvertisementsFor); nil when it has none there.
func Advertisements(pools []*model.AddressPool, svc *model.Service) map[netip.Addr][]string {
	var out map[netip.Addr][]string
	for _, ip := range svc.LoadBalancerIPs {
		pool := model.PoolOf(pools, ip)
		if pool == nil || !pool.Selective() {
			continue
		}
		if out == nil {
			out = map[netip.Addr][]string{}
		}
		out[ip] = pool.AdvertisementsFor(svc)
	}
	return out
}

// Service returns the service as the nodes must forward it, or nil when
// they forward nothing for it (it does not exist, or another proxy owns
// it). Endpoints carry their node's name; each agent marks its own local.
// c, when not nil, keeps the announcer candidates from call to call (see
// Announcers).
func Service(v registry.View, key string, c *Candidates) *datapath.Service {
	svc := v.Service(key)
	if svc == nil {
		return nil
	}
	if name, ok := svc.Labels[ProxyNameLabel]; ok && name != ProxyName {
		return nil
	}
	svc, ok := withoutConflicts(svc, v.ServiceConflicts(svc))
	if !ok {
		return nil
	}
	out := &datapath.Service{
		Key:                      datapath.ServiceKey{Namespace: svc.Namespace, Name: svc.Name},
		ClusterIPs:               svc.ClusterIPs,
		ExternalIPs:              svc.ExternalIPs,
		LoadBalancerIPs:          svc.LoadBalancerIPs,
		SessionAffinityTimeout:   svc.SessionAffinityTimeout,
		ExternalTrafficPolicy:    policy(svc.ExternalTrafficPolicy),
		InternalTrafficPolicy:    policy(svc.InternalTrafficPolicy),
		HealthCheckNodePort:      uint16(svc.HealthCheckNodePort),
		LoadBalancerSourceRanges: svc.LoadBalancerSourceRanges,
		PreferClose:              svc.PreferClose,
		Announcers:               Announcers(v, svc, c),
		Advertisements:           advertisementsOf(v, svc, c),
		OtherController:          svc.OtherController,
	}
	slicesOf := v.EndpointSlicesOf(key)
	for _, sp := range svc.Ports {
		port := datapath.ServicePort{
			Name:      sp.Name,
			Protocol:  protocol(sp.Protocol),
			Port:      uint16(sp.Port),
			NodePort:  uint16(sp.NodePort),
			Endpoints: endpoints(slicesOf, sp),
		}
		out.Ports = append(out.Ports, port)
	}
	return out
}

// advertisementsOf is Advertisements with the pools c keeps (one listing
// per revision of the registry, not one per service).
func advertisementsOf(v registry.View, svc *model.Service, c *Candidates) map[netip.Addr][]string {
	if len(svc.LoadBalancerIPs) == 0 || svc.OtherController {
		return nil
	}
	if c == nil {
		c = &Candidates{}
	}
	c.at(v)
	return Advertisements(c.pools, svc)
}

// endpoints resolves the endpoints of one service port across its slices.
func endpoints(slicesOf []*model.EndpointSlice, sp model.ServicePort) []datapath.Endpoint {
	seen := map[netip.AddrPort]bool{}
	var out []datapath.Endpoint
	for _, slice := range slicesOf {
		target, ok := targetPort(slice, sp)
		if !ok {
			continue
		}
		for _, ep := range slice.Endpoints {
			e := datapath.Endpoint{
				Addr:        ep.Addresses[0], // as kube-proxy: the others are ignored
				Port:        target,
				NodeName:    ep.NodeName,
				Zone:        ep.Zone,
				Hints:       datapath.NewHints(ep.HintZones, ep.HintNodes),
				Ready:       ep.IsReady(),
				Serving:     ep.IsServing(),
				Terminating: ep.IsTerminating(),
			}
			if seen[e.AddrPort()] {
				continue
			}
			seen[e.AddrPort()] = true
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b datapath.Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	return out
}

// targetPort finds the port a slice's endpoints serve sp on: the slice port
// of the same name and protocol or, for a slice that lists no ports, the
// service's target port.
func targetPort(slice *model.EndpointSlice, sp model.ServicePort) (uint16, bool) {
	if len(slice.Ports) == 0 {
		if sp.TargetPort != 0 {
			return uint16(sp.TargetPort), true
		}
		return uint16(sp.Port), true
	}
	for _, p := range slice.Ports {
		if p.Name == sp.Name && p.Protocol == sp.Protocol {
			return uint16(p.Port), true
		}
	}
	return 0, false
}

func policy(p model.TrafficPolicy) datapath.TrafficPolicy {
	if p == model.PolicyLocal {
		return datapath.Local
	}
	return datapath.Cluster
}

func protocol(p model.Protocol) datapath.Protocol {
	switch p {
	case model.UDP:
		return datapath.UDP
	case model.SCTP:
		return datapath.SCTP
	}
	return datapath.TCP
}

// withoutConflicts leaves out what the nodes must not program of a service
// (registry.View.ServiceConflicts): an address with any port another
// service holds, a node port or health-check node port. False when not
// even a cluster IP is left: the service is not programmed at all.
func withoutConflicts(svc *model.Service, lost []registry.Conflict) (*model.Service, bool) {
	if len(lost) == 0 {
		return svc, true
	}
	type place struct {
		field registry.ClaimField
		index int
	}
	drop := map[place]bool{}
	for _, c := range lost {
		drop[place{c.Claim.Field, c.Claim.Index}] = true
	}
	keep := func(field registry.ClaimField, addrs []netip.Addr) []netip.Addr {
		var out []netip.Addr
		for i, a := range addrs {
			if !drop[place{field, i}] {
				out = append(out, a)
			}
		}
		return out
	}
	cp := *svc
	cp.ClusterIPs = keep(registry.ClusterIPs, svc.ClusterIPs)
	cp.ExternalIPs = keep(registry.ExternalIPs, svc.ExternalIPs)
	cp.LoadBalancerIPs = keep(registry.LoadBalancerIPs, svc.LoadBalancerIPs)
	cp.Ports = slices.Clone(svc.Ports)
	for i := range cp.Ports {
		if drop[place{registry.NodePort, i}] {
			cp.Ports[i].NodePort = 0
		}
	}
	if drop[place{registry.HealthCheckNodePort, 0}] {
		cp.HealthCheckNodePort = 0
	}
	return &cp, len(cp.ClusterIPs) > 0
}
