// Package convert turns configurations into Weir's resources: a MetalLB
// configuration (its metallb.io custom resources) into Weir's address
// pools and BGP peers, saying what of it has no equivalent in Weir so that
// nothing is dropped silently (FromMetalLB); and Weir's pools and peers
// into its Kubernetes custom resources (CustomResources).
//
// MetalLB's objects map as follows:
//
//	IPAddressPool                  AddressPool (addresses; autoAssign false: manual_only)
//	BGPAdvertisement of a pool     the pool's bgp_advertisement
//	L2Advertisement of a pool      the pool's l2_advertisement
//	BGPPeer                        BgpPeer
//	Community                      resolved into the advertisements' communities
//
// A Weir pool is advertised one way, with one set of attributes; MetalLB
// lets several advertisements, of both kinds, select one pool. The first
// advertisement that selects a pool (in the input's order) is kept and
// every other is named in a Note.
package convert

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Note is one thing of the input that Weir does not do as MetalLB did.
type Note struct {
	Object string // "IPAddressPool/public"
	Field  string // "spec.avoidBuggyIPs"; "" for the whole object
	Says   string
}

func (n Note) String() string {
	if n.Field == "" {
		return n.Object + ": " + n.Says
	}
	return n.Object + " " + n.Field + ": " + n.Says
}

// Result is a converted configuration.
type Result struct {
	Pools []*weirv1.AddressPool
	Peers []*weirv1.BgpPeer
	Notes []Note
}

// selector is a Kubernetes label selector as MetalLB's objects carry it.
type selector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values,omitempty"`
	} `json:"matchExpressions,omitempty"`
}

// matches tells whether labels match s, and whether s could be read (an
// unknown operator cannot).
func (s selector) matches(labels map[string]string) (bool, error) {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false, nil
		}
	}
	for _, e := range s.MatchExpressions {
		v, has := labels[e.Key]
		switch e.Operator {
		case "In":
			if !has || !slices.Contains(e.Values, v) {
				return false, nil
			}
		case "NotIn":
			if has && slices.Contains(e.Values, v) {
				return false, nil
			}
		case "Exists":
			if !has {
				return false, nil
			}
		case "DoesNotExist":
			if has {
				return false, nil
			}
		default:
			return false, fmt.Errorf("unknown selector operator %q", e.Operator)
		}
	}
	return true, nil
}

type meta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type object struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   meta           `json:"metadata"`
	Spec       map[string]any `json:"spec"`
	raw        []byte         // the document, read again into its kind's spec
	parsed     any            // the spec, as its kind's type
}

type poolSpec struct {
	Addresses         []string `json:"addresses"`
	AutoAssign        *bool    `json:"autoAssign,omitempty"`
	AvoidBuggyIPs     bool     `json:"avoidBuggyIPs,omitempty"`
	ServiceAllocation *struct {
		Priority           int        `json:"priority,omitempty"`
		Namespaces         []string   `json:"namespaces,omitempty"`
		NamespaceSelectors []selector `json:"namespaceSelectors,omitempty"`
		ServiceSelectors   []selector `json:"serviceSelectors,omitempty"`
	} `json:"serviceAllocation,omitempty"`
}

type advertisementSpec struct {
	IPAddressPools         []string   `json:"ipAddressPools,omitempty"`
	IPAddressPoolSelectors []selector `json:"ipAddressPoolSelectors,omitempty"`
	NodeSelectors          []selector `json:"nodeSelectors,omitempty"`
	// BGP only.
	AggregationLength   *int32   `json:"aggregationLength,omitempty"`
	AggregationLengthV6 *int32   `json:"aggregationLengthV6,omitempty"`
	LocalPref           uint32   `json:"localPref,omitempty"`
	Communities         []string `json:"communities,omitempty"`
	Peers               []string `json:"peers,omitempty"`
	// L2 only.
	Interfaces []string `json:"interfaces,omitempty"`
}

type peerSpec struct {
	MyASN           uint32     `json:"myASN"`
	PeerASN         uint32     `json:"peerASN"`
	PeerAddress     string     `json:"peerAddress"`
	PeerPort        uint16     `json:"peerPort,omitempty"`
	HoldTime        string     `json:"holdTime,omitempty"`
	Password        string     `json:"password,omitempty"`
	NodeSelectors   []selector `json:"nodeSelectors,omitempty"`
	GracefulRestart bool       `json:"enableGracefulRestart,omitempty"`
}

type communitySpec struct {
	Communities []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"communities"`
}

// peerFields are BGPPeer fields Weir has no equivalent of, with what that
// means.
var peerFields = map[string]string{
	"sourceAddress":  "the node's address of the peer's family is used",
	"keepaliveTime":  "a third of the hold time is used",
	"connectTime":    "GoBGP's connect retry is used",
	"routerID":       "the node's address is the router ID",
	"ebgpMultiHop":   "sessions are single-hop",
	"bfdProfile":     "no BFD",
	"vrf":            "sessions are in the default VRF",
	"disableMP":      "every session carries both families",
	"dynamicASN":     "set asn to the peer's ASN",
	"passwordSecret": "Weir reads no Secrets: the password is to be set in the BgpPeer",
}

// FromMetalLB reads MetalLB's objects from a YAML stream (documents of kind
// IPAddressPool, BGPAdvertisement, L2Advertisement, BGPPeer, Community in
// the metallb.io group; others are named in a Note) and returns Weir's.
func FromMetalLB(data string) (*Result, error) {
	var objs []*object
	for i, doc := range yamldocs.Split(data) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		o := &object{raw: []byte(doc)}
		if err := yaml.Unmarshal(o.raw, o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		objs = append(objs, o)
	}
	r := &Result{}
	var pools, bgpAds, l2Ads, peers []*object
	communities := map[string]string{}
	for _, o := range objs {
		group, _, _ := strings.Cut(o.APIVersion, "/")
		ref := o.Kind + "/" + o.Metadata.Name
		if group != "metallb.io" {
			r.Notes = append(r.Notes, Note{Object: ref, Says: fmt.Sprintf("not a MetalLB object (%s): left out", o.APIVersion)})
			continue
		}
		var err error
		switch o.Kind {
		case "IPAddressPool":
			var s poolSpec
			err, o.parsed = spec(o, &s), &s
			pools = append(pools, o)
		case "BGPAdvertisement", "L2Advertisement":
			var s advertisementSpec
			err, o.parsed = spec(o, &s), &s
			if o.Kind == "BGPAdvertisement" {
				bgpAds = append(bgpAds, o)
			} else {
				l2Ads = append(l2Ads, o)
			}
		case "BGPPeer":
			var s peerSpec
			err, o.parsed = spec(o, &s), &s
			peers = append(peers, o)
		case "Community":
			var s communitySpec
			if err = spec(o, &s); err == nil {
				for _, c := range s.Communities {
					communities[c.Name] = c.Value
				}
			}
		default:
			r.Notes = append(r.Notes, Note{Object: ref, Says: "Weir has no equivalent: left out"})
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	for _, o := range pools {
		pool, notes, err := convertPool(o, bgpAds, l2Ads, communities)
		if err != nil {
			return nil, err
		}
		r.Pools = append(r.Pools, pool)
		r.Notes = append(r.Notes, notes...)
	}
	for _, o := range peers {
		peer, notes := convertPeer(o)
		r.Peers = append(r.Peers, peer)
		r.Notes = append(r.Notes, notes...)
	}
	// An advertisement that selects no pool says nothing.
	for _, ad := range slices.Concat(bgpAds, l2Ads) {
		used := false
		for _, p := range pools {
			ok, _ := selects(ad, p)
			used = used || ok
		}
		if !used {
			r.Notes = append(r.Notes, Note{Object: ad.Kind + "/" + ad.Metadata.Name, Says: "selects no IPAddressPool of the input: left out"})
		}
	}
	return r, nil
}

// spec reads the object's spec as its kind's type.
func spec(o *object, into any) error {
	var doc struct {
		Spec any `json:"spec"`
	}
	doc.Spec = into
	return yaml.Unmarshal(o.raw, &doc)
}

// stripComments drops comment lines, to tell an empty document.
func stripComments(doc string) string {
	var b strings.Builder
	for l := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// selects tells whether advertisement ad selects pool p: by name, by
// label selector, or (neither given) every pool.
func selects(ad, p *object) (bool, error) {
	s := ad.parsed.(*advertisementSpec)
	if len(s.IPAddressPools) == 0 && len(s.IPAddressPoolSelectors) == 0 {
		return true, nil
	}
	if slices.Contains(s.IPAddressPools, p.Metadata.Name) {
		return true, nil
	}
	for _, sel := range s.IPAddressPoolSelectors {
		ok, err := sel.matches(p.Metadata.Labels)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func convertPool(o *object, bgpAds, l2Ads []*object, communities map[string]string) (*weirv1.AddressPool, []Note, error) {
	s := o.parsed.(*poolSpec)
	ref := "IPAddressPool/" + o.Metadata.Name
	var notes []Note
	note := func(field, says string) { notes = append(notes, Note{Object: ref, Field: field, Says: says}) }
	pool := &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: o.Metadata.Name, Labels: o.Metadata.Labels}, Addresses: s.Addresses}
	if s.AutoAssign != nil && !*s.AutoAssign {
		pool.ManualOnly = true
	}
	if s.AvoidBuggyIPs {
		note("spec.avoidBuggyIPs", "Weir assigns every address of the range, .0 and .255 included: leave them out of the addresses")
	}
	if a := s.ServiceAllocation; a != nil {
		pool.ServiceAllocation = &weirv1.ServiceAllocation{Priority: int32(a.Priority), Namespaces: a.Namespaces}
		if len(a.NamespaceSelectors) > 0 {
			note("spec.serviceAllocation.namespaceSelectors", "Weir scopes a pool by namespace names, not namespace labels: left out, list the namespaces")
		}
		sel, ok := nodeSelector(a.ServiceSelectors)
		pool.ServiceAllocation.ServiceSelector = sel
		if !ok {
			note("spec.serviceAllocation.serviceSelectors", "Weir selects services by labels that must all match (matchLabels of one selector): left out")
		}
	}
	var mine []*object
	for _, ad := range slices.Concat(bgpAds, l2Ads) {
		ok, err := selects(ad, o)
		if err != nil {
			return nil, nil, fmt.Errorf("%s/%s: %w", ad.Kind, ad.Metadata.Name, err)
		}
		if ok {
			mine = append(mine, ad)
		}
	}
	if len(mine) == 0 {
		note("", "no advertisement selects it, so MetalLB assigns its addresses without announcing them; Weir announces every pool over BGP unless it is an L2 pool")
		return pool, notes, nil
	}
	for _, other := range mine[1:] {
		note("", fmt.Sprintf("%s/%s also selects it: Weir advertises a pool one way, with one set of attributes, and keeps %s/%s; split the pool to keep both", other.Kind, other.Metadata.Name, mine[0].Kind, mine[0].Metadata.Name))
	}
	ad := mine[0]
	as := ad.parsed.(*advertisementSpec)
	adRef := ad.Kind + "/" + ad.Metadata.Name
	selector, ok := nodeSelector(as.NodeSelectors)
	if ad.Kind == "L2Advertisement" {
		pool.L2Advertisement = &weirv1.L2Advertisement{Interfaces: as.Interfaces, NodeSelector: selector}
		if !ok {
			notes = append(notes, Note{Object: adRef, Field: "spec.nodeSelectors", Says: "Weir selects nodes by labels that must all match (matchLabels of one selector): the pool is answered from every node"})
		}
		return pool, notes, nil
	}
	bgp := &weirv1.BgpAdvertisement{LocalPreference: as.LocalPref, Peers: as.Peers}
	if l := as.AggregationLength; l != nil && *l != 32 {
		bgp.AggregationLength = uint32(*l)
	}
	if l := as.AggregationLengthV6; l != nil && *l != 128 {
		bgp.AggregationLengthV6 = uint32(*l)
	}
	for _, c := range as.Communities {
		value := c
		if v, named := communities[c]; named {
			value = v
		}
		if strings.HasPrefix(value, "large:") {
			notes = append(notes, Note{Object: adRef, Field: "spec.communities", Says: fmt.Sprintf("%s is a large community: Weir sends standard ones only, left out", c)})
			continue
		}
		if !strings.Contains(value, ":") {
			notes = append(notes, Note{Object: adRef, Field: "spec.communities", Says: fmt.Sprintf("%q names no Community of the input, left out", c)})
			continue
		}
		bgp.Communities = append(bgp.Communities, value)
	}
	if len(as.NodeSelectors) > 0 {
		notes = append(notes, Note{Object: adRef, Field: "spec.nodeSelectors", Says: "Weir chooses the announcing nodes per peer (the BgpPeer's node_selector) and by max_announcing_nodes, not per advertisement: every node peering announces the pool"})
	}
	pool.BgpAdvertisement = bgp
	return pool, notes, nil
}

// nodeSelector is the one matchLabels selector Weir can express; ok is
// false when sels say more (several selectors, or expressions).
func nodeSelector(sels []selector) (map[string]string, bool) {
	switch {
	case len(sels) == 0:
		return nil, true
	case len(sels) == 1 && len(sels[0].MatchExpressions) == 0:
		return maps.Clone(sels[0].MatchLabels), true
	}
	return nil, false
}

func convertPeer(o *object) (*weirv1.BgpPeer, []Note) {
	s := o.parsed.(*peerSpec)
	ref := "BGPPeer/" + o.Metadata.Name
	var notes []Note
	peer := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: o.Metadata.Name, Labels: o.Metadata.Labels},
		Address: s.PeerAddress, Asn: s.PeerASN, MyAsn: s.MyASN, Port: int32(s.PeerPort), Password: s.Password,
		GracefulRestart: s.GracefulRestart}
	if peer.Port == 179 {
		peer.Port = 0
	}
	if s.HoldTime != "" {
		d, err := time.ParseDuration(s.HoldTime)
		if err != nil {
			notes = append(notes, Note{Object: ref, Field: "spec.holdTime", Says: fmt.Sprintf("%q is not a duration: the default hold time is used", s.HoldTime)})
		} else {
			peer.HoldTimeSeconds = int32(d / time.Second)
		}
	}
	sel, ok := nodeSelector(s.NodeSelectors)
	peer.NodeSelector = sel
	if !ok {
		notes = append(notes, Note{Object: ref, Field: "spec.nodeSelectors", Says: "Weir selects nodes by labels that must all match (matchLabels of one selector): every node peers"})
	}
	for _, f := range slices.Sorted(maps.Keys(o.Spec)) {
		if says, ok := peerFields[f]; ok && says != "" {
			notes = append(notes, Note{Object: ref, Field: "spec." + f, Says: says})
		}
	}
	return peer, notes
}
