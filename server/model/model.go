// Package model holds the cluster state the server aggregates: services,
// their endpoints and the nodes, whichever source declared them (the native
// API or Kubernetes). Sources translate into these types once, at their edge.
package model

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/internal/bgpcommunity"
	"github.com/weirlb/weir/internal/bgpnumbers"
	"github.com/weirlb/weir/internal/iprange"
)

// Meta names a resource and carries its version.
type Meta struct {
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels,omitempty"`
	// ResourceVersion is the store revision of the resource's last write.
	ResourceVersion uint64    `json:"resourceVersion"`
	CreateTime      time.Time `json:"createTime"`
	// Source is the one source that owns the resource.
	Source string `json:"source"`
}

// Key is "namespace/name", or just the name for a cluster-scoped resource.
func (m *Meta) Key() string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// GetMeta lets generic code reach the metadata of any resource.
func (m *Meta) GetMeta() *Meta { return m }

// Sources of cluster state.
const (
	SourceNative     = "native"
	SourceKubernetes = "kubernetes"
	// SourceFile is the server's --resources-file (pools and peers).
	SourceFile = "file"
)

// Object is any resource the server stores.
type Object interface {
	GetMeta() *Meta
}

type ServiceType string

const (
	ClusterIP    ServiceType = "ClusterIP"
	NodePort     ServiceType = "NodePort"
	LoadBalancer ServiceType = "LoadBalancer"
)

type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

type TrafficPolicy string

const (
	PolicyCluster TrafficPolicy = "Cluster"
	PolicyLocal   TrafficPolicy = "Local"
)

// DefaultSessionAffinityTimeout is Kubernetes' ClientIP affinity default.
const DefaultSessionAffinityTimeout = 10800 * time.Second

// Service mirrors a Kubernetes Service.
type Service struct {
	Meta
	Type        ServiceType   `json:"type"`
	ClusterIPs  []netip.Addr  `json:"clusterIPs"`
	ExternalIPs []netip.Addr  `json:"externalIPs,omitempty"`
	Ports       []ServicePort `json:"ports"`
	// SessionAffinityTimeout is zero without ClientIP affinity.
	SessionAffinityTimeout   time.Duration  `json:"sessionAffinityTimeout,omitempty"`
	ExternalTrafficPolicy    TrafficPolicy  `json:"externalTrafficPolicy"`
	InternalTrafficPolicy    TrafficPolicy  `json:"internalTrafficPolicy"`
	HealthCheckNodePort      int32          `json:"healthCheckNodePort,omitempty"`
	LoadBalancerSourceRanges []netip.Prefix `json:"loadBalancerSourceRanges,omitempty"`
	PreferClose              bool           `json:"preferClose,omitempty"`
	// LoadBalancerIPs is status.loadBalancer.ingress[].ip.
	LoadBalancerIPs []netip.Addr `json:"loadBalancerIPs,omitempty"`
	// RequestedLoadBalancerIPs are the addresses the service asks for.
	RequestedLoadBalancerIPs []netip.Addr `json:"requestedLoadBalancerIPs,omitempty"`
	AddressPool              string       `json:"addressPool,omitempty"`
	AllowSharedIP            string       `json:"allowSharedIP,omitempty"`
	// LoadBalancerClass is Kubernetes' spec.loadBalancerClass: the
	// controller that should handle the service's load-balancer
	// addresses.
	LoadBalancerClass string `json:"loadBalancerClass,omitempty"`
	// NamespaceLabels are the labels of the service's namespace, which
	// pools' namespace selectors select on (Kubernetes only: the native
	// API has no namespace objects).
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty"`
	// OtherController: another load-balancer controller handles this
	// LoadBalancer service (its class is not Weir's, or it has none and
	// Weir is not the cluster's default). Weir then assigns, announces
	// and answers none of its addresses and writes nothing to it; the
	// nodes forward its load-balancer IPs all the same, as kube-proxy
	// does for any controller's.
	OtherController bool `json:"otherController,omitempty"`
	// WeirStatusLeft (Kubernetes): the service is not Weir's (another
	// controller's, or no longer a LoadBalancer) but its status still
	// carries Weir's conditions, from when it was: the leader removes them.
	WeirStatusLeft bool `json:"weirStatusLeft,omitempty"`
	// AddressReason and AddressMessage say why no address could be
	// assigned (status).
	AddressReason  string `json:"addressReason,omitempty"`
	AddressMessage string `json:"addressMessage,omitempty"`
}

// AddressPool is a set of addresses Weir assigns to LoadBalancer services.
type AddressPool struct {
	Meta
	Ranges     []AddressRange `json:"ranges"`
	ManualOnly bool           `json:"manualOnly,omitempty"`
	// BGP is what the nodes attach to the routes of the pool's addresses.
	BGP BGPAdvertisement `json:"bgp,omitzero"`
	// L2, when set, has the pool's addresses answered by ARP and NDP,
	// one node per address, instead of announced over BGP.
	L2 *L2Advertisement `json:"l2,omitempty"`
	// Allocation, when set, gives the pool's addresses only to some
	// services, and orders the pools a service may get addresses from.
	Allocation *ServiceAllocation `json:"allocation,omitempty"`
	// BGPAdvertisements, instead of BGP, are several advertisements,
	// each for the nodes and services its selectors select (see
	// Advertises).
	BGPAdvertisements []BGPAdvertisement `json:"bgpAdvertisements,omitempty"`
	// AvoidBuggyIPs: no IPv4 address ending in .0 or .255 is given out.
	AvoidBuggyIPs bool `json:"avoidBuggyIPs,omitempty"`
}

// ServiceAllocation scopes a pool to some services (MetalLB's
// serviceAllocation): those of Namespaces (any when empty) with all the
// labels of ServiceSelector. Such a pool is tried before the pools that
// are not scoped, in Priority order (1 first; 0 is no priority, last).
type ServiceAllocation struct {
	Priority        int               `json:"priority,omitempty"`
	Namespaces      []string          `json:"namespaces,omitempty"`
	ServiceSelector map[string]string `json:"serviceSelector,omitempty"`
	// NamespaceSelector: only services whose namespace has all these
	// labels (Service.NamespaceLabels).
	NamespaceSelector map[string]string `json:"namespaceSelector,omitempty"`
}

// Allows tells whether the pool may give svc addresses: always when it
// is not scoped.
func (p *AddressPool) Allows(svc *Service) bool {
	a := p.Allocation
	if a == nil {
		return true
	}
	return (len(a.Namespaces) == 0 || slices.Contains(a.Namespaces, svc.Namespace)) && selects(a.ServiceSelector, svc.Labels) &&
		selects(a.NamespaceSelector, svc.NamespaceLabels)
}

// Scope says, for a reason, whom a scoped pool is for.
func (a *ServiceAllocation) Scope() string {
	var parts []string
	if len(a.Namespaces) > 0 {
		parts = append(parts, "namespaces "+strings.Join(a.Namespaces, ", "))
	}
	if len(a.ServiceSelector) > 0 {
		parts = append(parts, "services labelled "+labelList(a.ServiceSelector))
	}
	if len(a.NamespaceSelector) > 0 {
		parts = append(parts, "namespaces labelled "+labelList(a.NamespaceSelector))
	}
	if len(parts) == 0 {
		return "every service"
	}
	return strings.Join(parts, " and ")
}

// L2Advertisement is where and by which nodes a pool's addresses are
// answered over L2.
type L2Advertisement struct {
	// Interfaces are the node interfaces to answer on; empty means those
	// whose subnets hold the address.
	Interfaces []string `json:"interfaces,omitempty"`
	// NodeSelector: only nodes with all these labels answer.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// ServiceSelector: only the addresses of services with all these
	// labels are answered.
	ServiceSelector map[string]string `json:"serviceSelector,omitempty"`
}

// Selects reports whether a node with these labels may answer.
func (a *L2Advertisement) Selects(labels map[string]string) bool {
	return selects(a.NodeSelector, labels)
}

// BGPAdvertisement is how a pool's addresses are announced.
type BGPAdvertisement struct {
	// Communities (ASN<<16 | VALUE) and LargeCommunities are the two
	// attributes BGP carries a route's communities in.
	Communities      []uint32             `json:"communities,omitempty"`
	LargeCommunities []bgpcommunity.Large `json:"largeCommunities,omitempty"`
	LocalPref        uint32               `json:"localPref,omitempty"`
	// Peers names the BGPPeers that hear the routes; empty means all.
	Peers []string `json:"peers,omitempty"`
	// AggregationLength and AggregationLengthV6 are the prefix lengths
	// announced for each address; 0 means the host prefix.
	AggregationLength   int `json:"aggregationLength,omitempty"`
	AggregationLengthV6 int `json:"aggregationLengthV6,omitempty"`
	// MaxAnnouncingNodes limits how many nodes announce each address of
	// a service with externalTrafficPolicy Cluster; 0 means every node.
	MaxAnnouncingNodes int `json:"maxAnnouncingNodes,omitempty"`
	// NodeSelector and ServiceSelector (in AddressPool.BGPAdvertisements
	// only): the nodes that announce through the advertisement, and the
	// services whose addresses they announce; empty selects all.
	NodeSelector    map[string]string `json:"nodeSelector,omitempty"`
	ServiceSelector map[string]string `json:"serviceSelector,omitempty"`
}

// IsZero reports whether the advertisement is the default one: host
// prefixes with no attributes, to every peer.
func (a BGPAdvertisement) IsZero() bool {
	return len(a.Communities) == 0 && len(a.LargeCommunities) == 0 && a.LocalPref == 0 && len(a.Peers) == 0 && a.AggregationLength == 0 && a.AggregationLengthV6 == 0 &&
		a.MaxAnnouncingNodes == 0 && len(a.NodeSelector) == 0 && len(a.ServiceSelector) == 0
}

// AddCommunity adds c to the attribute BGP carries its kind in.
func (a *BGPAdvertisement) AddCommunity(c bgpcommunity.Community) {
	if c.IsLarge {
		a.LargeCommunities = append(a.LargeCommunities, c.Large)
	} else {
		a.Communities = append(a.Communities, c.Standard)
	}
}

// CommunityList writes the communities as bgpcommunity.Parse reads them:
// the standard ones, then the large ones.
func (a BGPAdvertisement) CommunityList() []string {
	var out []string
	for _, c := range a.Communities {
		out = append(out, bgpcommunity.FormatStandard(c))
	}
	for _, c := range a.LargeCommunities {
		out = append(out, c.String())
	}
	return out
}

// Prefixes are the fewest CIDRs that make up the range, in order.
func (r AddressRange) Prefixes() []netip.Prefix { return iprange.Prefixes(r.First, r.Last) }

// AddressRange is the addresses from First to Last, both included.
type AddressRange struct {
	First netip.Addr `json:"first"`
	Last  netip.Addr `json:"last"`
}

// Contains reports whether a is in the range.
func (r AddressRange) Contains(a netip.Addr) bool {
	return a.Is4() == r.First.Is4() && a.Compare(r.First) >= 0 && a.Compare(r.Last) <= 0
}

// ParseAddressRange reads "a.b.c.d/n" or "first-last".
func ParseAddressRange(s string) (AddressRange, error) {
	if first, last, ok := strings.Cut(s, "-"); ok {
		f, err1 := netip.ParseAddr(strings.TrimSpace(first))
		l, err2 := netip.ParseAddr(strings.TrimSpace(last))
		if err1 != nil || err2 != nil || f.Is4() != l.Is4() || f.Compare(l) > 0 {
			return AddressRange{}, fmt.Errorf("%q is not a range (first-last, same family, first <= last)", s)
		}
		return AddressRange{f, l}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return AddressRange{}, fmt.Errorf("%q is neither a CIDR nor a first-last range", s)
	}
	p = p.Masked()
	return AddressRange{p.Addr(), iprange.Last(p)}, nil
}

// String renders the range the way it parses.
func (r AddressRange) String() string { return r.First.String() + "-" + r.Last.String() }

type ServicePort struct {
	Name       string   `json:"name,omitempty"`
	Protocol   Protocol `json:"protocol"`
	Port       int32    `json:"port"`
	TargetPort int32    `json:"targetPort"`
	NodePort   int32    `json:"nodePort,omitempty"`
}

// EndpointSlice mirrors a discovery.k8s.io/v1 EndpointSlice.
type EndpointSlice struct {
	Meta
	ServiceName string         `json:"serviceName"`
	Endpoints   []Endpoint     `json:"endpoints"`
	Ports       []EndpointPort `json:"ports,omitempty"`
}

// ServiceKey is the key of the service the slice belongs to.
func (s *EndpointSlice) ServiceKey() string { return s.Namespace + "/" + s.ServiceName }

// Endpoint conditions follow Kubernetes: nil Ready or Serving means true,
// nil Terminating means false.
type Endpoint struct {
	Addresses   []netip.Addr `json:"addresses"`
	Ready       *bool        `json:"ready,omitempty"`
	Serving     *bool        `json:"serving,omitempty"`
	Terminating *bool        `json:"terminating,omitempty"`
	NodeName    string       `json:"nodeName,omitempty"`
	Zone        string       `json:"zone,omitempty"`
	HintZones   []string     `json:"hintZones,omitempty"`
	HintNodes   []string     `json:"hintNodes,omitempty"`
}

func (e *Endpoint) IsReady() bool       { return e.Ready == nil || *e.Ready }
func (e *Endpoint) IsServing() bool     { return e.Serving == nil || *e.Serving }
func (e *Endpoint) IsTerminating() bool { return e.Terminating != nil && *e.Terminating }

type EndpointPort struct {
	Name     string   `json:"name,omitempty"`
	Protocol Protocol `json:"protocol"`
	Port     int32    `json:"port"`
}

// Node is a machine that runs an agent.
type Node struct {
	Meta
	Addresses []netip.Addr   `json:"addresses"`
	Zone      string         `json:"zone,omitempty"`
	PodCIDRs  []netip.Prefix `json:"podCIDRs,omitempty"`
	Deleting  bool           `json:"deleting,omitempty"`
	// Drained is set by an operator, apart from the node's source; it is
	// kept by the registry, not in the node's own record.
	Drained bool `json:"-"`
	// DrainDeadline, kept beside Drained, is when the drained node ends
	// the external connections it still serves; zero: it serves them
	// until they end.
	DrainDeadline time.Time `json:"-"`
}

// LabelExcludeFromLoadBalancers is Kubernetes' node label (any value)
// that keeps a node out of every external load balancer's targets.
const LabelExcludeFromLoadBalancers = "node.kubernetes.io/exclude-from-external-load-balancers"

// Excluded tells whether the node carries LabelExcludeFromLoadBalancers:
// it forwards what reaches it, but Weir sends it no external traffic
// (no announcement, no L2 answer, no load-balancer-tier target).
func (n *Node) Excluded() bool {
	_, ok := n.Labels[LabelExcludeFromLoadBalancers]
	return ok
}

// Aside is what keeps a node out of every service's external traffic
// apart from its agent's state: an operator's drain, or the node's
// exclusion label.
type Aside struct {
	Drained, Excluded bool
}

// ServiceCIDR is a range cluster IPs are allocated from (Kubernetes'
// networking.k8s.io ServiceCIDR): the nodes drop new connections to its
// addresses that no service holds, instead of routing them out.
type ServiceCIDR struct {
	Meta
	CIDRs []netip.Prefix `json:"cidrs"`
}

// BGPPeer is an upstream router the nodes' speakers peer with.
type BGPPeer struct {
	Meta
	Address      netip.Addr        `json:"address"`
	ASN          uint32            `json:"asn"`
	MyASN        uint32            `json:"myASN"`
	Port         int32             `json:"port,omitempty"`
	HoldTime     time.Duration     `json:"holdTime,omitempty"`
	Password     string            `json:"password,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// GracefulRestart offers RFC 4724 graceful restart to the router.
	GracefulRestart bool `json:"gracefulRestart,omitempty"`
	// EBGPMultihopTTL is the TTL of the session's packets for a router
	// beyond the node's link; 0 means directly connected (TTL 1).
	EBGPMultihopTTL uint32 `json:"ebgpMultihopTTL,omitempty"`
	// SourceAddress is the node's address the session is made from; the
	// zero Addr lets the kernel choose.
	SourceAddress netip.Addr `json:"sourceAddress,omitzero"`
	// Keepalive is the time between keepalives; 0 means a third of the
	// hold time.
	Keepalive time.Duration `json:"keepalive,omitempty"`
	// ConnectRetry is the time between attempts to open the session; 0
	// means the node speaker's default (1 s).
	ConnectRetry time.Duration `json:"connectRetry,omitempty"`
	// BFD runs a BFD session with the router; nil for none.
	BFD *bfd.Profile `json:"bfd,omitempty"`
	// Interface is the node's interface the router is on: with no
	// Address the router is its one IPv6 link-local neighbour
	// (unnumbered), with a link-local Address it is that address's zone.
	// Address itself never carries a zone.
	Interface string `json:"interface,omitempty"`
	// DynamicASN stands for ASN (then 0): the router's AS by its relation
	// to the node's own.
	DynamicASN bgpnumbers.DynamicASN `json:"dynamicASN,omitempty"`
	// VRF is the device the session is bound to; "" for the default
	// routing table.
	VRF string `json:"vrf,omitempty"`
}

// LinkLocal reports whether the peer is reached over an IPv6 link-local
// address on Interface, by address or unnumbered.
func (p *BGPPeer) LinkLocal() bool { return p.Interface != "" }

// Selects reports whether the peer applies to a node with these labels.
func (p *BGPPeer) Selects(labels map[string]string) bool { return selects(p.NodeSelector, labels) }

// selects reports whether labels hold every label of selector.
// labelList writes labels "k1=v1,k2=v2", keys in order.
func labelList(labels map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, k+"="+labels[k])
	}
	return strings.Join(out, ",")
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// PoolOf is the pool among pools whose ranges hold a, or nil.
func PoolOf(pools []*AddressPool, a netip.Addr) *AddressPool {
	for _, p := range pools {
		if slices.ContainsFunc(p.Ranges, func(r AddressRange) bool { return r.Contains(a) }) {
			return p
		}
	}
	return nil
}
