// Package v1alpha1 is Weir's Kubernetes API (group weir.dev): the address
// pools and BGP peers of the native API as custom resources
// (WeirAddressPool, WeirBGPPeer), for a cluster to declare with kubectl.
// The server mirrors them into its registry, where the native API's rules
// validate them, and writes back their status. The CustomResourceDefinitions in
// deploy/kubernetes/crds are generated from these types (make generate).
//
// +kubebuilder:object:generate=true
// +groupName=weir.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: "weir.dev", Version: "v1alpha1"}

// Every name of the kinds and resources (plural, singular, short name)
// begins with the product's, as Cilium's do (CiliumBGPPeerConfig):
// kubectl resolves a name without a group to one group silently, and
// MetalLB (addresspools, bgppeers) and Calico (bgppeers) install
// resources of the plain names in the same clusters. The short names are
// not the earlier CRDs' (wpool, wpeer) either: the apiserver establishes
// no CRD whose short name another of its group holds, and both are served
// while objects move from the old kinds to these.
const (
	AddressPoolKind = "WeirAddressPool"
	BGPPeerKind     = "WeirBGPPeer"
)

// The resources, as the dynamic client names them.
var (
	AddressPools = GroupVersion.WithResource("weiraddresspools")
	BGPPeers     = GroupVersion.WithResource("weirbgppeers")
)

// WeirAddressPool is a set of addresses Weir assigns to LoadBalancer Services
// of its class, and how the nodes announce them: over BGP (the default)
// or, with l2Advertisement, by answering ARP and NDP.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=weir,shortName=weirpool
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.mode`
// +kubebuilder:printcolumn:name="IPv4 In Use",type=integer,JSONPath=`.status.assignedIPv4`
// +kubebuilder:printcolumn:name="IPv4 Free",type=integer,JSONPath=`.status.availableIPv4`
// +kubebuilder:printcolumn:name="IPv6 In Use",type=integer,JSONPath=`.status.assignedIPv6`
// +kubebuilder:printcolumn:name="IPv6 Free",type=integer,JSONPath=`.status.availableIPv6`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type WeirAddressPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AddressPoolSpec   `json:"spec"`
	Status AddressPoolStatus `json:"status,omitempty"`
}

// AddressPoolSpec is what the pool holds and how it is announced.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.bgpAdvertisement) && has(self.l2Advertisement))",message="an L2 pool is announced over BGP too by its bgpAdvertisements (one with no field set: every node, no attribute), not by bgpAdvertisement"
// +kubebuilder:validation:XValidation:rule="!(has(self.bgpAdvertisements) && has(self.bgpAdvertisement))",message="bgpAdvertisements is exclusive with bgpAdvertisement"
type AddressPoolSpec struct {
	// Addresses are CIDRs ("203.0.113.0/28") or ranges of one family
	// ("203.0.113.10-203.0.113.20", "2001:db8::10-2001:db8::1f").
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=100
	// +kubebuilder:validation:XValidation:rule="self.all(a, isCIDR(a) || (a.split('-').size() == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()))",message="each address is a CIDR or a FIRST-LAST range of one family"
	// +listType=set
	Addresses []string `json:"addresses"`
	// AutoAssign false: only Services that ask for this pool (or one of
	// its addresses) get addresses from it. Default true.
	//
	// +optional
	AutoAssign *bool `json:"autoAssign,omitempty"`
	// BGPAdvertisement is what the nodes attach to the routes of the
	// pool's addresses.
	//
	// +optional
	BGPAdvertisement *BGPAdvertisement `json:"bgpAdvertisement,omitempty"`
	// L2Advertisement answers the pool's addresses by ARP and NDP, one
	// node at a time per address, instead of announcing them over BGP;
	// with bgpAdvertisements as well, the pool is announced both ways,
	// each by its own nodes.
	//
	// +optional
	L2Advertisement *L2Advertisement `json:"l2Advertisement,omitempty"`
	// ServiceAllocation gives the pool's addresses only to some Services,
	// and orders the pools a Service gets addresses from.
	//
	// +optional
	ServiceAllocation *ServiceAllocation `json:"serviceAllocation,omitempty"`
	// BGPAdvertisements are several ways of announcing the pool, each
	// through its nodeSelector's nodes for its serviceSelector's
	// Services; exclusive with bgpAdvertisement; beside l2Advertisement,
	// they announce the L2 pool over BGP too. Where several apply to
	// one prefix, the route carries the union of their communities and
	// the highest local preference, to the union of their peers.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	BGPAdvertisements []BGPAdvertisement `json:"bgpAdvertisements,omitempty"`
	// AvoidBuggyIPs: never give out an IPv4 address ending in .0 or .255.
	//
	// +optional
	AvoidBuggyIPs bool `json:"avoidBuggyIPs,omitempty"`
}

// ServiceAllocation scopes a pool to the Services of some namespaces, or
// with some labels; others get no address from it, not even one they ask
// for. A scoped pool that allows a Service is tried before the pools that
// are not scoped, in priority order.
type ServiceAllocation struct {
	// Priority: 1 is tried first, then 2, and so on; 0 means none (after
	// the others).
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	Priority int32 `json:"priority,omitempty"`
	// Namespaces whose Services the pool serves; empty: every one.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`
	// ServiceSelector: only Services with all these labels.
	//
	// +optional
	ServiceSelector map[string]string `json:"serviceSelector,omitempty"`
	// NamespaceSelector: only Services in namespaces with all these
	// labels.
	//
	// +optional
	NamespaceSelector map[string]string `json:"namespaceSelector,omitempty"`
}

// BGPAdvertisement is the pool's routes' attributes.
type BGPAdvertisement struct {
	// The rule below is bgpcommunity.Parse's, in CEL (a test holds the
	// two to the same verdict): numbers are bounded as numbers, since a
	// pattern cannot say 65535 readably.

	// Communities are standard communities "ASN:VALUE" (each 0-65535),
	// no-export, no-advertise, no-export-subconfed, no-peer, and large
	// communities "large:GLOBAL:LOCAL1:LOCAL2" (each 0-4294967295), in one
	// list; numbers are decimals without leading zero.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=38
	// +kubebuilder:validation:items:XValidation:rule="self in ['no-export', 'no-advertise', 'no-export-subconfed', 'no-peer'] || (self.matches('^(0|[1-9][0-9]{0,4}):(0|[1-9][0-9]{0,4})$') && self.split(':').all(n, int(n) <= 65535)) || (self.matches('^large:(0|[1-9][0-9]{0,9}):(0|[1-9][0-9]{0,9}):(0|[1-9][0-9]{0,9})$') && self.substring(6).split(':').all(n, int(n) <= 4294967295))",message="a community is ASN:VALUE (each 0-65535), large:GLOBAL:LOCAL1:LOCAL2 (each 0-4294967295), no-export, no-advertise, no-export-subconfed or no-peer"
	Communities []string `json:"communities,omitempty"`
	// LocalPreference is LOCAL_PREF for internal peers, 0-4294967295; 0
	// sends none.
	//
	// +optional
	// +kubebuilder:validation:Format=int64
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	LocalPreference uint32 `json:"localPreference,omitempty"`
	// Peers are the names of the WeirBGPPeers that hear the pool's routes;
	// empty: every peer.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Peers []string `json:"peers,omitempty"`
	// AggregationLength announces, for each IPv4 address, the prefix of
	// this length holding it; 0 means 32.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	AggregationLength int32 `json:"aggregationLength,omitempty"`
	// AggregationLengthV6 is the same for IPv6; 0 means 128.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=128
	AggregationLengthV6 int32 `json:"aggregationLengthV6,omitempty"`
	// MaxAnnouncingNodes limits the nodes announcing each address of an
	// externalTrafficPolicy Cluster Service; 0: every node.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxAnnouncingNodes int32 `json:"maxAnnouncingNodes,omitempty"`
	// NodeSelector (in bgpAdvertisements only): only nodes with all these
	// labels announce through this advertisement.
	//
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// ServiceSelector (in bgpAdvertisements only): only the addresses of
	// Services with all these labels; exclusive with the aggregation
	// lengths.
	//
	// +optional
	ServiceSelector map[string]string `json:"serviceSelector,omitempty"`
}

// L2Advertisement is where and by which nodes a pool is answered.
type L2Advertisement struct {
	// Interfaces are the node interfaces to answer on; empty: every
	// interface whose subnet holds the address.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=15
	// +kubebuilder:validation:items:Pattern=`^[^/\s:]+$`
	// +listType=set
	Interfaces []string `json:"interfaces,omitempty"`
	// NodeSelector: only nodes with all these labels answer.
	//
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// ServiceSelector: only the addresses of Services with all these
	// labels are answered.
	//
	// +optional
	ServiceSelector map[string]string `json:"serviceSelector,omitempty"`
}

// AddressPoolStatus is what the server made of the pool.
type AddressPoolStatus struct {
	// Mode is how the pool is announced: BGP, L2, or L2+BGP (both).
	//
	// +optional
	Mode string `json:"mode,omitempty"`
	// AssignedIPv4 and AssignedIPv6 count the pool's addresses assigned
	// to Services; AvailableIPv4 and AvailableIPv6 those left (at most
	// 2^63-1).
	//
	// +optional
	AssignedIPv4 int64 `json:"assignedIPv4"`
	// +optional
	AvailableIPv4 int64 `json:"availableIPv4"`
	// +optional
	AssignedIPv6 int64 `json:"assignedIPv6"`
	// +optional
	AvailableIPv6 int64 `json:"availableIPv6"`
	// Conditions: Accepted is True when the server took the pool as it
	// is, False with its reason (another pool overlaps it, a field the
	// server refuses) when not; the pool then assigns nothing.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WeirAddressPoolList is a list of WeirAddressPools.
//
// +kubebuilder:object:root=true
type WeirAddressPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WeirAddressPool `json:"items"`
}

// WeirBGPPeer is a router the nodes' BGP speakers peer with.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=weir,shortName=weirpeer
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Interface",type=string,JSONPath=`.spec.interface`
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.spec.asn`
// +kubebuilder:printcolumn:name="My ASN",type=integer,JSONPath=`.spec.myASN`
// +kubebuilder:printcolumn:name="Sessions",type=integer,JSONPath=`.status.sessions`
// +kubebuilder:printcolumn:name="Established",type=integer,JSONPath=`.status.established`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Multihop TTL",type=integer,JSONPath=`.spec.ebgpMultihopTTL`,priority=1
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceAddress`,priority=1
// +kubebuilder:printcolumn:name="BFD RX",type=integer,JSONPath=`.spec.bfd.receiveInterval`,priority=1
// +kubebuilder:printcolumn:name="Dynamic ASN",type=string,JSONPath=`.spec.dynamicASN`,priority=1
// +kubebuilder:printcolumn:name="VRF",type=string,JSONPath=`.spec.vrf`,priority=1
type WeirBGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BGPPeerSpec   `json:"spec"`
	Status BGPPeerStatus `json:"status,omitempty"`
}

// BGPPeerSpec is the router and the session.
//
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveSeconds) || self.keepaliveSeconds < (has(self.holdTimeSeconds) && self.holdTimeSeconds != 0 ? self.holdTimeSeconds : 90)",message="less than the hold time (holdTimeSeconds, 90 when 0)",fieldPath=".keepaliveSeconds"
// +kubebuilder:validation:XValidation:rule="!has(self.sourceAddress) || !has(self.address) || !isIP(self.address) || !isIP(self.sourceAddress) || ip(self.sourceAddress).family() == ip(self.address).family()",message="of the address family of spec.address",fieldPath=".sourceAddress"
// +kubebuilder:validation:XValidation:rule="has(self.address) || has(self.interface)",message="address, or interface for an unnumbered peer"
// +kubebuilder:validation:XValidation:rule="has(self.asn) != has(self.dynamicASN)",message="one of asn and dynamicASN",fieldPath=".asn"
// +kubebuilder:validation:XValidation:rule="!has(self.bfd) || !has(self.vrf) || size(self.vrf) == 0",message="no BFD in a VRF: take bfd off or peer outside the VRF",fieldPath=".bfd"
type BGPPeerSpec struct {
	// Address is the router's address; empty with Interface for an
	// unnumbered peer. An IPv6 link-local address (fe80::/10) is written
	// without a zone, its interface in Interface.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="self == '' || isIP(self)",message="an IPv4 or IPv6 address"
	Address string `json:"address,omitempty"`
	// Interface is the node's interface the router is on: with no address
	// the router is its one IPv6 link-local neighbour (unnumbered); with
	// a link-local address, the link it is on.
	//
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.@-]{1,15}$`
	Interface string `json:"interface,omitempty"`
	// ASN is the router's AS; or DynamicASN.
	//
	// +optional
	ASN ASN `json:"asn,omitempty"`
	// DynamicASN stands for ASN: "internal" (the nodes' own AS) or
	// "external" (the AS the router's OPEN says).
	//
	// +optional
	// +kubebuilder:validation:Enum=internal;external
	DynamicASN string `json:"dynamicASN,omitempty"`
	// VRF is a Linux VRF device the session is bound to; empty means the
	// default routing table.
	//
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.@-]{1,15}$`
	VRF string `json:"vrf,omitempty"`
	// MyASN is the nodes' own AS in this session.
	MyASN ASN `json:"myASN"`
	// Port is the router's port; 0 means 179.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// HoldTimeSeconds is the BGP hold time; 0 means 90, else 3-65535.
	//
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == 0 || (self >= 3 && self <= 65535)",message="0, or 3 to 65535 seconds"
	HoldTimeSeconds int32 `json:"holdTimeSeconds,omitempty"`
	// PasswordSecretRef names the key of a Secret, in the server's
	// namespace, that holds the TCP MD5 password; none: no password.
	//
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`
	// NodeSelector: only nodes with all these labels peer.
	//
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// GracefulRestart offers graceful restart (RFC 4724).
	//
	// +optional
	GracefulRestart bool `json:"gracefulRestart,omitempty"`
	// EBGPMultihopTTL is the TTL of the session's packets, 1-255, for a
	// router beyond the node's link (a route reflector, a spine behind a
	// routed hop); 0 means directly connected (TTL 1).
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	EBGPMultihopTTL int32 `json:"ebgpMultihopTTL,omitempty"`
	// SourceAddress is the node's address the session is made from (its
	// loopback, which the router names with update-source), of
	// spec.address's family; empty: the kernel's choice.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="an IPv4 or IPv6 address"
	SourceAddress string `json:"sourceAddress,omitempty"`
	// KeepaliveSeconds is the time between keepalives; 0 means a third of
	// the hold time. Less than the hold time.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65534
	KeepaliveSeconds int32 `json:"keepaliveSeconds,omitempty"`
	// ConnectRetrySeconds is the time between attempts to open the
	// session while it is down; 0 means 1.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	ConnectRetrySeconds int32 `json:"connectRetrySeconds,omitempty"`
	// BFD runs BFD (RFC 5880) with the router: when it finds the router
	// gone, the node closes the session at once rather than at the hold
	// time. Single hop, or multi-hop with ebgpMultihopTTL above 1.
	//
	// +optional
	BFD *BFDProfile `json:"bfd,omitempty"`
}

// BFDProfile is how a BFD session runs (MetalLB's BFDProfile, without
// echo mode); 0 means the default of each field.
//
// +kubebuilder:validation:XValidation:rule="!has(self.receiveInterval) || self.receiveInterval == 0 || (self.receiveInterval >= 10 && self.receiveInterval <= 60000)",message="0 (300) or 10-60000 milliseconds",fieldPath=".receiveInterval"
// +kubebuilder:validation:XValidation:rule="!has(self.transmitInterval) || self.transmitInterval == 0 || (self.transmitInterval >= 10 && self.transmitInterval <= 60000)",message="0 (300) or 10-60000 milliseconds",fieldPath=".transmitInterval"
// +kubebuilder:validation:XValidation:rule="!has(self.detectMultiplier) || self.detectMultiplier != 1",message="0 (3) or 2-255: 1 would take the session down at the first lost packet",fieldPath=".detectMultiplier"
type BFDProfile struct {
	// ReceiveInterval is the least interval, in milliseconds, between
	// the router's packets the node accepts; 0 means 300.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=60000
	ReceiveInterval int32 `json:"receiveInterval,omitempty"`
	// TransmitInterval is the interval, in milliseconds, between the
	// node's packets it would like; 0 means 300.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=60000
	TransmitInterval int32 `json:"transmitInterval,omitempty"`
	// DetectMultiplier is the packets missed before the session is down;
	// 0 means 3.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	DetectMultiplier int32 `json:"detectMultiplier,omitempty"`
	// PassiveMode sends nothing until the router has spoken.
	//
	// +optional
	PassiveMode bool `json:"passiveMode,omitempty"`
	// MinimumTTL is, for a multi-hop session, the lowest TTL the router's
	// packets may arrive with; 0 means 254.
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	MinimumTTL int32 `json:"minimumTtl,omitempty"`
}

// ASN is an AS number, 1-4294967295 (4-byte ASNs, RFC 6793; 0 is
// reserved by RFC 7607), and not AS_TRANS. controller-gen would say
// int32 for a uint32, which the apiserver enforces, so the format is
// given.
//
// +kubebuilder:validation:Format=int64
// +kubebuilder:validation:Minimum=1
// +kubebuilder:validation:Maximum=4294967295
// +kubebuilder:validation:XValidation:rule="self != 23456",message="23456 is AS_TRANS (RFC 6793), the stand-in for a 4-byte ASN, not an AS of its own"
type ASN uint32

// SecretKeyRef is a key of a Secret in the server's namespace.
type SecretKeyRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key defaults to "password".
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// BGPPeerStatus is what the nodes report of the sessions.
type BGPPeerStatus struct {
	// Sessions counts the nodes that peer with the router, Established
	// those whose session is established.
	//
	// +optional
	Sessions int32 `json:"sessions"`
	// +optional
	Established int32 `json:"established"`
	// Conditions: Accepted, as for WeirAddressPool (a missing password
	// Secret leaves it False).
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WeirBGPPeerList is a list of WeirBGPPeers.
//
// +kubebuilder:object:root=true
type WeirBGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WeirBGPPeer `json:"items"`
}

// AddToScheme registers the types.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &WeirAddressPool{}, &WeirAddressPoolList{}, &WeirBGPPeer{}, &WeirBGPPeerList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
