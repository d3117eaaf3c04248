// Package datapath turns what a node must forward (a NodeState) into
// nftables rules. It talks to the kernel only through knftables.Interface and
// knows nothing of gRPC, Kubernetes or the server.
package datapath

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpnumbers"
)

// NodeState is everything one node must forward.
type NodeState struct {
	Node     NodeInfo
	Services map[ServiceKey]*Service
	// Changed, when not nil, names every service that may differ from the
	// state last applied: added, replaced or removed. The datapath then
	// looks at those alone, so that a change costs the same at 100,000
	// services as at 10. nil: it compares every service.
	Changed []ServiceKey
}

// NodeInfo is the node the state is for.
type NodeInfo struct {
	Name      string
	Addresses []netip.Addr
	Zone      string
	PodCIDRs  []netip.Prefix
	Deleting  bool
	// Drained: an operator took the node out of external traffic.
	Drained bool
	// DrainDeadline, when set, is when a drained node ends the external
	// connections it still serves (agent/drain); the datapath itself
	// does not use it.
	DrainDeadline time.Time
	// Excluded: the node is labelled out of external load balancers; it
	// forwards what reaches it but announces nothing.
	Excluded bool
	// Registered is false while the server knows no Node of this name.
	Registered bool
	// BGPPeers are the routers the node's speaker peers with; the datapath
	// itself does not use them.
	BGPPeers []BGPPeer
	// Advertisements are the BGP attributes of the pools that set them,
	// and those of the pools with several advertisements that select
	// this node (named: see Service.Advertisements).
	Advertisements []BGPAdvertisement
	// ServiceCIDRs are the cluster's service ranges as the server knows
	// them (Kubernetes' ServiceCIDR objects), added to Config.ServiceCIDRs.
	ServiceCIDRs []netip.Prefix
	// L2Pools are the pools answered over L2, announced over BGP only
	// when they say so; the datapath itself does not use them.
	L2Pools []L2Pool
	// FlowRing is how many nodes pass moved connections along (this one
	// included), FlowPeers the next ones after this node, nearest first:
	// a packet goes to the first that is alive. The datapath bounds how
	// far a packet goes by FlowRing; agent/flows routes to FlowPeers.
	FlowRing  int
	FlowPeers []FlowPeer
	// FlowSenders are the nodes before this one on the ring, nearest
	// first: those that pass packets (and probes) to it. The datapath
	// drops what reaches the tunnel's port from any other address.
	FlowSenders []FlowPeer
}

// FlowPeer is a node of the ring of moved connections.
type FlowPeer struct {
	Name      string
	Addresses []netip.Addr
}

// Equal reports whether two peers are the same.
func (p FlowPeer) Equal(o FlowPeer) bool {
	return p.Name == o.Name && slices.Equal(p.Addresses, o.Addresses)
}

// L2Pool is a pool whose addresses are answered by ARP and NDP on
// Interfaces (empty: the interfaces whose subnets hold the address);
// AnnouncedOverBGP: also announced over BGP, through the node's
// Advertisements.
type L2Pool struct {
	Ranges           []AddressRange
	Interfaces       []string
	AnnouncedOverBGP bool
}

// Equal reports whether two L2 pools are the same.
func (p L2Pool) Equal(o L2Pool) bool {
	return slices.Equal(p.Ranges, o.Ranges) && slices.Equal(p.Interfaces, o.Interfaces) && p.AnnouncedOverBGP == o.AnnouncedOverBGP
}

// AnnouncesOverBGP reports whether the node announces addr over BGP (if
// its service and advertisements have it do so): unless addr is in an L2
// pool that is answered over L2 alone.
func (n NodeInfo) AnnouncesOverBGP(addr netip.Addr) bool {
	p, l2 := n.L2PoolOf(addr)
	return !l2 || p.AnnouncedOverBGP
}

// L2PoolOf is the L2 pool holding addr, if one does.
func (n NodeInfo) L2PoolOf(addr netip.Addr) (L2Pool, bool) {
	for _, p := range n.L2Pools {
		if slices.ContainsFunc(p.Ranges, func(r AddressRange) bool { return r.Contains(addr) }) {
			return p, true
		}
	}
	return L2Pool{}, false
}

// BGPAdvertisement is how the addresses in Ranges are announced.
type BGPAdvertisement struct {
	Ranges           []AddressRange
	Communities      []uint32 // ASN<<16 | VALUE
	LargeCommunities []bgpcommunity.Large
	LocalPref        uint32
	// Peers names the peers that hear the routes; empty means all.
	Peers []string
	// AggregationLength and AggregationLengthV6 are the prefix lengths
	// announced; 0 means the host prefix.
	AggregationLength, AggregationLengthV6 int
	// Name is set for one of a pool's several advertisements: it then
	// applies only to the addresses whose Service.Advertisements name
	// it, not to the whole Ranges.
	Name string
}

// AdvertisementsOf are the advertisements the node announces svc's
// load-balancer IP addr through: those the service names for it that the
// node was given, or else the one of the pool holding it (the default,
// with no attribute, when no pool sets one). None: the node does not
// announce addr.
func (n NodeInfo) AdvertisementsOf(svc *Service, addr netip.Addr) []BGPAdvertisement {
	if names, named := svc.Advertisements[addr]; named {
		var out []BGPAdvertisement
		for _, a := range n.Advertisements {
			if a.Name != "" && slices.Contains(names, a.Name) {
				out = append(out, a)
			}
		}
		return out
	}
	for _, a := range n.Advertisements {
		if a.Name == "" && slices.ContainsFunc(a.Ranges, func(r AddressRange) bool { return r.Contains(addr) }) {
			return []BGPAdvertisement{a}
		}
	}
	return []BGPAdvertisement{{}}
}

// CombineAdvertisements is one route's attributes when several
// advertisements announce the same prefix (MetalLB's rule for several
// BGPAdvertisements of one pool): the union of their communities, the
// highest local preference, and the union of their peers, which is every
// peer when one of them names none. For several, the result's Ranges and
// Name are left empty and its aggregation lengths are the first's (they
// all announce one prefix); one is returned as it is.
func CombineAdvertisements(advs []BGPAdvertisement) BGPAdvertisement {
	if len(advs) == 1 {
		return advs[0]
	}
	var out BGPAdvertisement
	everyPeer := false
	for i, a := range advs {
		if i == 0 {
			out.AggregationLength, out.AggregationLengthV6 = a.AggregationLength, a.AggregationLengthV6
		}
		out.Communities = append(out.Communities, a.Communities...)
		out.LargeCommunities = append(out.LargeCommunities, a.LargeCommunities...)
		out.LocalPref = max(out.LocalPref, a.LocalPref)
		everyPeer = everyPeer || len(a.Peers) == 0
		out.Peers = append(out.Peers, a.Peers...)
	}
	slices.Sort(out.Communities)
	out.Communities = slices.Compact(out.Communities)
	slices.SortFunc(out.LargeCommunities, func(x, y bgpcommunity.Large) int {
		return cmp.Or(cmp.Compare(x.Global, y.Global), cmp.Compare(x.Local1, y.Local1), cmp.Compare(x.Local2, y.Local2))
	})
	out.LargeCommunities = slices.Compact(out.LargeCommunities)
	if everyPeer {
		out.Peers = nil
	} else {
		slices.Sort(out.Peers)
		out.Peers = slices.Compact(out.Peers)
	}
	return out
}

// PrefixOf is the prefix announced for address a.
func (a BGPAdvertisement) PrefixOf(addr netip.Addr) netip.Prefix {
	bits := a.AggregationLengthV6
	if addr.Is4() {
		bits = a.AggregationLength
	}
	if bits == 0 {
		bits = addr.BitLen()
	}
	return netip.PrefixFrom(addr, bits).Masked()
}

// LocalCounts counts the service's endpoints of one family on this node,
// by condition; an endpoint behind several ports counts once. The weight a
// node announces itself with and the local endpoints its health check
// reports are both these counts.
func (s *Service) LocalCounts(is6 bool) (ready, serving, terminating int) {
	r, sv, t := map[netip.Addr]bool{}, map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, p := range s.Ports {
		for _, ep := range p.Endpoints {
			if !ep.Local || ep.Addr.Is6() != is6 {
				continue
			}
			if ep.Ready {
				r[ep.Addr] = true
			}
			if ep.Serving {
				sv[ep.Addr] = true
			}
			if ep.Terminating {
				t[ep.Addr] = true
			}
		}
	}
	return len(r), len(sv), len(t)
}

// NextHop is the node's address of one family that BGP paths name as next
// hop, whether the node announces itself or a load-balancer speaker
// announces it: its first that is neither loopback nor link-local.
func NextHop(addrs []netip.Addr, is6 bool) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Is6() == is6 && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// AddressRange is the addresses from First to Last, both included.
type AddressRange struct{ First, Last netip.Addr }

// Contains reports whether a is in the range.
func (r AddressRange) Contains(a netip.Addr) bool {
	return r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0 && a.Is4() == r.First.Is4()
}

// Equal reports whether a and b are the same advertisement.
func (a BGPAdvertisement) Equal(b BGPAdvertisement) bool {
	return a.Name == b.Name && slices.Equal(a.Ranges, b.Ranges) && slices.Equal(a.Communities, b.Communities) &&
		slices.Equal(a.LargeCommunities, b.LargeCommunities) && a.LocalPref == b.LocalPref &&
		slices.Equal(a.Peers, b.Peers) && a.AggregationLength == b.AggregationLength && a.AggregationLengthV6 == b.AggregationLengthV6
}

// BGPPeer is an upstream router of the node.
type BGPPeer struct {
	Address  netip.Addr
	Port     uint16
	ASN      uint32
	MyASN    uint32
	HoldTime time.Duration
	Password string
	// Name is the BgpPeer's, which advertisements refer to.
	Name            string
	GracefulRestart bool
	// EBGPMultihopTTL is the TTL of the session's packets for a router
	// beyond the node's link; 0 means directly connected.
	EBGPMultihopTTL uint8
	// SourceAddress is the node's address the session is made from; the
	// zero Addr lets the kernel choose.
	SourceAddress netip.Addr
	// Keepalive (0: a third of the hold time) and ConnectRetry (0: the
	// speaker's default) are the session's other timers.
	Keepalive, ConnectRetry time.Duration
	// BFD runs a BFD session beside the BGP one; nil for none.
	BFD *bfd.Profile
	// Interface is the node's interface of a link-local router (Address
	// is then link-local, without a zone) or an unnumbered one (no
	// Address).
	Interface string
	// DynamicASN stands for ASN (then 0).
	DynamicASN bgpnumbers.DynamicASN
	// VRF is the device the session is bound to; "" for none.
	VRF string
}

// Equal tells whether two peers are configured alike.
func (p BGPPeer) Equal(o BGPPeer) bool {
	bfdEqual := (p.BFD == nil) == (o.BFD == nil) && (p.BFD == nil || *p.BFD == *o.BFD)
	p.BFD, o.BFD = nil, nil
	return p == o && bfdEqual
}

// ServiceKey names a service.
type ServiceKey struct{ Namespace, Name string }

func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// Compare orders keys by namespace, then name.
func (k ServiceKey) Compare(o ServiceKey) int {
	return cmp.Or(strings.Compare(k.Namespace, o.Namespace), strings.Compare(k.Name, o.Name))
}

// Protocol is a transport protocol a service port forwards.
type Protocol uint8

const (
	TCP Protocol = iota + 1
	UDP
	SCTP
)

// String returns the protocol's nftables name.
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return "unknown"
}

// TrafficPolicy is a service's external or internal traffic policy.
type TrafficPolicy uint8

const (
	// Cluster spreads connections over every usable endpoint.
	Cluster TrafficPolicy = iota
	// Local sends connections only to endpoints on the node they arrived at.
	Local
)

// Service is one service as this node must forward it.
type Service struct {
	Key             ServiceKey
	ClusterIPs      []netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	Ports           []ServicePort
	// SessionAffinityTimeout is zero when the service has no ClientIP affinity.
	SessionAffinityTimeout   time.Duration
	ExternalTrafficPolicy    TrafficPolicy
	InternalTrafficPolicy    TrafficPolicy
	HealthCheckNodePort      uint16
	LoadBalancerSourceRanges []netip.Prefix
	PreferClose              bool
	// Announcers are, for each load-balancer IP whose pool limits how
	// many nodes announce it, the nodes chosen to; nodes not among them
	// do not announce it. An address not here may be announced by any
	// node. Forwarding does not depend on it.
	Announcers map[netip.Addr][]string
	// Advertisements are, for each load-balancer IP of a pool with
	// several advertisements, the names of those that select the service
	// (BGPAdvertisement.Name); see NodeInfo.AdvertisementsOf.
	Advertisements map[netip.Addr][]string
	// OtherController: another load-balancer controller announces and
	// answers for the load-balancer IPs; the node only forwards them.
	OtherController bool
}

// ServicePort is one port of a service with the endpoints behind it.
type ServicePort struct {
	Name      string
	Protocol  Protocol
	Port      uint16
	NodePort  uint16
	Endpoints []Endpoint
}

// Endpoint is one backend of a service port, resolved to an address and port.
// A node holds a million of them at 100,000 services: 72 bytes each, the
// rarely set topology hints behind a pointer.
type Endpoint struct {
	Addr        netip.Addr
	NodeName    string
	Zone        string
	Hints       *Hints // nil: none
	Port        uint16
	Local       bool // runs on this node
	Ready       bool
	Serving     bool
	Terminating bool
}

// Hints are an endpoint's topology hints: the zones and the nodes it is
// meant for.
type Hints struct {
	Zones, Nodes []string
}

// NewHints are the hints of the zones and nodes given, nil for none.
func NewHints(zones, nodes []string) *Hints {
	if len(zones) == 0 && len(nodes) == 0 {
		return nil
	}
	return &Hints{Zones: zones, Nodes: nodes}
}

// HintZones and HintNodes are the endpoint's hints, nil without.
func (e Endpoint) HintZones() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

func (e Endpoint) HintNodes() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// AddrPort is the endpoint's destination after DNAT.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }
