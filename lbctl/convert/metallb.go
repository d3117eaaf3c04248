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
//
// The input is read as kubectl reads it, and strictly: a mapping that says
// a key twice, or two objects of one kind with one name, is an error, not
// the last one winning. It is bounded (MaxInputBytes, MaxDocuments), and
// its conversion takes time in proportion to its size.
package convert

import (
	"encoding/json"
	"errors"
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

// check says what of s cannot be read: an unknown operator.
func (s selector) check() error {
	for _, e := range s.MatchExpressions {
		switch e.Operator {
		case "In", "NotIn", "Exists", "DoesNotExist":
		default:
			return fmt.Errorf("unknown selector operator %q", e.Operator)
		}
	}
	return nil
}

// matches tells whether labels match s, a selector check passed.
func (s selector) matches(labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, has := labels[e.Key]
		switch e.Operator {
		case "In":
			if !has || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if has && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !has {
				return false
			}
		case "DoesNotExist":
			if has {
				return false
			}
		}
	}
	return true
}

type meta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type object struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   meta            `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
	doc        int             // its document's number in the input, from 1
	parsed     any             // the spec, as its kind's type
}

// ref names o in notes and errors: "IPAddressPool/public".
func (o *object) ref() string { return o.Kind + "/" + o.Metadata.Name }

// where names o in an error: "document 3 (IPAddressPool metallb-system/public)".
func (o *object) where() string {
	name := o.Metadata.Name
	if o.Metadata.Namespace != "" {
		name = o.Metadata.Namespace + "/" + name
	}
	return fmt.Sprintf("document %d (%s %s)", o.doc, o.Kind, name)
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

// check says what of s cannot be read: a pool selector's unknown operator.
func (s *advertisementSpec) check() error {
	for i, sel := range s.IPAddressPoolSelectors {
		if err := sel.check(); err != nil {
			return fmt.Errorf("spec.ipAddressPoolSelectors[%d]: %w", i, err)
		}
	}
	return nil
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

// MaxInputBytes bounds the input FromMetalLB takes: 32 MiB, a thousand
// times a large MetalLB configuration. The conversion holds a few times
// its input in memory; read the input through an io.LimitReader so that
// no more than this is read.
const MaxInputBytes = 32 << 20

// MaxDocuments bounds the input's documents (blank ones aside), counted
// before any is read.
const MaxDocuments = 100_000

// ErrTooLarge is the error of an input past MaxInputBytes or MaxDocuments.
var ErrTooLarge = errors.New("too large for a MetalLB configuration")

// FromMetalLB reads MetalLB's objects from a YAML stream (documents of kind
// IPAddressPool, BGPAdvertisement, L2Advertisement, BGPPeer, Community in
// the metallb.io group; others are named in a Note) and returns Weir's.
func FromMetalLB(data string) (*Result, error) {
	if len(data) > MaxInputBytes {
		return nil, fmt.Errorf("%d bytes, more than %d MiB: %w", len(data), MaxInputBytes>>20, ErrTooLarge)
	}
	objs, err := readObjects(data)
	if err != nil {
		return nil, err
	}
	r := &Result{}
	in, err := r.parseObjects(objs)
	if err != nil {
		return nil, err
	}
	ads := indexAdvertisements(slices.Concat(in.bgpAds, in.l2Ads))
	used := make([]bool, len(ads.all))
	for _, o := range in.pools {
		mine := ads.selecting(o)
		for _, ad := range mine {
			used[ad] = true
		}
		pool, notes := convertPool(o, ads.pick(mine), in.communities)
		r.Pools = append(r.Pools, pool)
		r.Notes = append(r.Notes, notes...)
	}
	for _, o := range in.peers {
		peer, notes := convertPeer(o)
		r.Peers = append(r.Peers, peer)
		r.Notes = append(r.Notes, notes...)
	}
	// An advertisement that selects no pool says nothing.
	for i, ad := range ads.all {
		if !used[i] {
			r.Notes = append(r.Notes, Note{Object: ad.ref(), Says: "selects no IPAddressPool of the input: left out"})
		}
	}
	return r, nil
}

// metallbInput is the input's MetalLB objects by kind, their specs parsed,
// and the communities the Community objects define.
type metallbInput struct {
	pools, bgpAds, l2Ads, peers []*object
	communities                 map[string]string  // a community's name: its value
	definedBy                   map[string]*object // a community's name: the Community that defines it
}

// parseObjects parses the MetalLB objects of the input, in order, and
// notes the objects it leaves out.
func (r *Result) parseObjects(objs []*object) (*metallbInput, error) {
	in := &metallbInput{communities: map[string]string{}, definedBy: map[string]*object{}}
	// MetalLB reads its objects from one namespace, an advertisement names
	// its pools without one and Weir's pools and peers have none: a name
	// is one object of a kind.
	named := map[string]*object{}
	for _, o := range objs {
		group, _, _ := strings.Cut(o.APIVersion, "/")
		if group != "metallb.io" {
			r.Notes = append(r.Notes, Note{Object: o.ref(), Says: fmt.Sprintf("not a MetalLB object (%s): left out", o.APIVersion)})
			continue
		}
		if first, ok := named[o.ref()]; ok {
			return nil, fmt.Errorf("%s: the kind and name of %s: which one is meant?", o.where(), first.where())
		}
		named[o.ref()] = o
		known, err := in.add(o)
		if !known {
			r.Notes = append(r.Notes, Note{Object: o.ref(), Says: "Weir has no equivalent: left out"})
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.where(), err)
		}
	}
	return in, nil
}

// add parses o's spec as its kind's and files it; known is false for a
// kind Weir has no equivalent of.
func (in *metallbInput) add(o *object) (known bool, err error) {
	switch o.Kind {
	case "IPAddressPool":
		var s poolSpec
		err, o.parsed = spec(o, &s), &s
		in.pools = append(in.pools, o)
	case "BGPAdvertisement", "L2Advertisement":
		var s advertisementSpec
		if err, o.parsed = spec(o, &s), &s; err == nil {
			err = s.check()
		}
		if o.Kind == "BGPAdvertisement" {
			in.bgpAds = append(in.bgpAds, o)
		} else {
			in.l2Ads = append(in.l2Ads, o)
		}
	case "BGPPeer":
		var s peerSpec
		err, o.parsed = spec(o, &s), &s
		in.peers = append(in.peers, o)
	case "Community":
		var s communitySpec
		err = spec(o, &s)
		for _, c := range s.Communities {
			if first, ok := in.definedBy[c.Name]; ok && err == nil {
				err = fmt.Errorf("spec.communities: %q is defined by %s too: which value is meant?", c.Name, first.where())
			}
			in.communities[c.Name], in.definedBy[c.Name] = c.Value, o
		}
	default:
		return false, nil
	}
	return true, err
}

// readObjects reads the objects of a YAML stream, strictly as kubectl
// reads them: a key said twice in a mapping is a mistake (which one was
// meant?), not the last one winning.
func readObjects(data string) ([]*object, error) {
	docs := yamldocs.Split(data)
	count := 0
	for _, doc := range docs {
		if strings.TrimSpace(doc) != "" {
			count++
		}
	}
	if count > MaxDocuments {
		return nil, fmt.Errorf("%d documents, more than %d: %w", count, MaxDocuments, ErrTooLarge)
	}
	var objs []*object
	line := 1 // of the input, where the document starts
	for _, doc := range docs {
		start, n := line, len(objs)+1
		line += strings.Count(doc, "\n") // Split keeps every line break
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, inputLines(doc, start, err))
		}
		if string(j) == "null" { // only comments, or nothing
			continue
		}
		o := &object{doc: n}
		if err := json.Unmarshal(j, o); err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		objs = append(objs, o)
	}
	return objs, nil
}

// inputLines is err, the YAML reader's error of doc, with the lines of
// the input rather than of the document (doc starts on the input's line
// start), on one line: the document is read again after as many empty
// lines, so the reader itself says where.
func inputLines(doc string, start int, err error) error {
	if _, again := yaml.YAMLToJSONStrict([]byte(strings.Repeat("\n", start-1) + doc)); again != nil {
		err = again
	}
	return oneLine{err}
}

// oneLine is an error whose text is on one line ("yaml: unmarshal errors:
// line 9: key \"addresses\" already set in map").
type oneLine struct{ error }

func (e oneLine) Error() string { return strings.Join(strings.Fields(e.error.Error()), " ") }
func (e oneLine) Unwrap() error { return e.error }

// spec reads the object's spec as its kind's type.
func spec(o *object, into any) error {
	if len(o.Spec) == 0 {
		return nil
	}
	if err := json.Unmarshal(o.Spec, into); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	return nil
}

// advertisements are the input's BGP and L2 advertisements, indexed by
// what they select, so that a pool finds its own without reading every
// one: a conversion's time grows with its input, not with pools times
// advertisements.
type advertisements struct {
	all      []*object        // BGP ones, then L2 ones, each in the input's order
	byName   map[string][]int // of all, those that name a pool, by its name
	bySelect []int            // of all, those with pool selectors
	forAll   []int            // of all, those that name and select nothing: every pool
}

func indexAdvertisements(all []*object) *advertisements {
	a := &advertisements{all: all, byName: map[string][]int{}}
	for i, ad := range all {
		s := ad.parsed.(*advertisementSpec)
		for _, p := range s.IPAddressPools {
			a.byName[p] = append(a.byName[p], i)
		}
		if len(s.IPAddressPoolSelectors) > 0 {
			a.bySelect = append(a.bySelect, i)
		}
		if len(s.IPAddressPools) == 0 && len(s.IPAddressPoolSelectors) == 0 {
			a.forAll = append(a.forAll, i)
		}
	}
	return a
}

// selecting lists the advertisements that select pool p, in order: by
// name, by a label selector, or (neither given) every pool.
func (a *advertisements) selecting(p *object) []int {
	mine := slices.Concat(a.byName[p.Metadata.Name], a.forAll)
	for _, i := range a.bySelect {
		sels := a.all[i].parsed.(*advertisementSpec).IPAddressPoolSelectors
		if slices.ContainsFunc(sels, func(s selector) bool { return s.matches(p.Metadata.Labels) }) {
			mine = append(mine, i)
		}
	}
	slices.Sort(mine)
	return slices.Compact(mine)
}

// pick is the advertisements of indexes.
func (a *advertisements) pick(indexes []int) []*object {
	out := make([]*object, len(indexes))
	for i, ad := range indexes {
		out[i] = a.all[ad]
	}
	return out
}

// convertPool is pool o, advertised by mine (those that select it, in
// order).
func convertPool(o *object, mine []*object, communities map[string]string) (*weirv1.AddressPool, []Note) {
	s := o.parsed.(*poolSpec)
	ref := o.ref()
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
	if len(mine) == 0 {
		note("", "no advertisement selects it, so MetalLB assigns its addresses without announcing them; Weir announces every pool over BGP unless it is an L2 pool")
		return pool, notes
	}
	for _, other := range mine[1:] {
		note("", fmt.Sprintf("%s also selects it: Weir advertises a pool one way, with one set of attributes, and keeps %s; split the pool to keep both", other.ref(), mine[0].ref()))
	}
	ad := mine[0]
	as := ad.parsed.(*advertisementSpec)
	adRef := ad.ref()
	selector, ok := nodeSelector(as.NodeSelectors)
	if ad.Kind == "L2Advertisement" {
		pool.L2Advertisement = &weirv1.L2Advertisement{Interfaces: as.Interfaces, NodeSelector: selector}
		if !ok {
			notes = append(notes, Note{Object: adRef, Field: "spec.nodeSelectors", Says: "Weir selects nodes by labels that must all match (matchLabels of one selector): the pool is answered from every node"})
		}
		return pool, notes
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
	return pool, notes
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
	ref := o.ref()
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
	var given map[string]json.RawMessage
	json.Unmarshal(o.Spec, &given) // read as a peerSpec already: an object, or nothing
	for _, f := range slices.Sorted(maps.Keys(given)) {
		if says, ok := peerFields[f]; ok && says != "" {
			notes = append(notes, Note{Object: ref, Field: "spec." + f, Says: says})
		}
	}
	return peer, notes
}
