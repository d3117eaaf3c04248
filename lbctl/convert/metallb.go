// Package convert turns configurations into Weir's resources: a MetalLB
// configuration (its metallb.io custom resources) into Weir's address
// pools and BGP peers, saying what of it has no equivalent in Weir so that
// nothing is dropped silently (Convert); and Weir's pools and peers
// into its Kubernetes custom resources (CustomResources).
//
// MetalLB's objects map as follows:
//
//	IPAddressPool                  AddressPool (addresses; autoAssign false: manual_only)
//	BGPAdvertisements of a pool    the pool's bgp_advertisements, one each
//	L2Advertisement of a pool      the pool's l2_advertisement
//	BGPPeer                        BgpPeer
//	BFDProfile                     inlined into the peers that name it
//	Community                      resolved into the advertisements' communities
//
// A Weir pool is announced over BGP by any number of advertisements and
// answered over L2 by at most one, as MetalLB's pool selected by
// advertisements of both kinds is: every BGPAdvertisement that selects a
// pool is kept, and the first L2Advertisement (in the input's order);
// each later L2Advertisement, passed over, is named in a Note.
//
// Every field of MetalLB's kinds is in one table (metallbFields) with what
// Weir does with it; after an object is converted, each leaf of it that
// was neither carried over nor noted is noted from that table, or, not
// in it, named as a field MetalLB does not have. So nothing of the input
// is lost without a note, and the documentation's table is the same list.
//
// The input is read as kubectl reads it (documents, and Lists of objects
// as kubectl get -o yaml writes them), and strictly: a field of the wrong
// type, a mapping that says a key twice, or two objects of one kind with
// one name, is an error, not the last one winning. It is bounded (MaxInputBytes, MaxDocuments), and
// its conversion takes time in proportion to its size.
package convert

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Note is one thing of the input that Weir does not do as MetalLB did, or
// that is to be done by hand.
type Note struct {
	Object string // "IPAddressPool/public"
	Field  string // "spec.avoidBuggyIPs"; "" for the whole object
	Says   string
	// Fate is what became of the field (or object): Dropped and Narrowed
	// are losses (Result.Lossy); Mapped is carried over, with something
	// to do by hand; Ignored is input that is no MetalLB configuration.
	Fate Fate
	// whole: all of the object is left out, not only what Field names.
	whole bool
	// missed: a field the conversion should have carried over and did
	// not; the test corpus fails on it.
	missed bool
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
	// PasswordSecrets are the Secrets that hold peers' passwords, by the
	// peer's name, for custom resources (Options.CustomResources).
	PasswordSecrets map[string]SecretKeyRef
	Notes           []Note
	// carried is, by object ("IPAddressPool/public"), the paths of the
	// input carried over into the output, for the test corpus.
	carried map[string][]string
}

// Lossy tells whether some field or object of the input was not carried
// over whole.
func (r *Result) Lossy() bool {
	return slices.ContainsFunc(r.Notes, func(n Note) bool { return n.Fate == Dropped || n.Fate == Narrowed })
}

// SecretKeyRef is a key of a Secret in the server's namespace, as a
// WeirBGPPeer's passwordSecretRef names it.
type SecretKeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key,omitempty"`
}

// Options say what the conversion is for.
type Options struct {
	// CustomResources: the output is Weir's custom resources, where a
	// peer can name a Secret (MetalLB's passwordSecret) rather than hold
	// its password.
	CustomResources bool
	// Namespace is the server's, where it reads Secrets, with
	// CustomResources.
	Namespace string
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
	raw        map[string]any  // the whole object, as read
	doc        int             // its document's number in the input, from 1
	item       int             // its number in the document's List, from 1; 0: not in a List
	parsed     any             // the spec, as its kind's type
	carried    []string        // the paths of it carried over
	notes      []Note          // on it, in the order made
}

// ref names o in notes and errors: "IPAddressPool/public".
func (o *object) ref() string { return o.Kind + "/" + o.Metadata.Name }

// where names o in an error: "document 3 (IPAddressPool metallb-system/public)",
// "document 1, item 2 (...)" in a List.
func (o *object) where() string {
	name := o.Metadata.Name
	if o.Metadata.Namespace != "" {
		name = o.Metadata.Namespace + "/" + name
	}
	at := fmt.Sprintf("document %d", o.doc)
	if o.item > 0 {
		at += fmt.Sprintf(", item %d", o.item)
	}
	return fmt.Sprintf("%s (%s %s)", at, o.Kind, name)
}

// carry records paths of o as carried over into the output.
func (o *object) carry(paths ...string) { o.carried = append(o.carried, paths...) }

// note says something of o's field ("" for all of o).
func (o *object) note(field string, fate Fate, says string) {
	o.notes = append(o.notes, Note{Object: o.ref(), Field: field, Says: says, Fate: fate})
}

// seconds is o's duration field at path in whole seconds; a value that is
// no duration of 0 or more is noted, and 0 (Weir's default) is used.
func (o *object) seconds(path, value string) int32 {
	if value == "" {
		return 0
	}
	d, err := time.ParseDuration(value)
	if err != nil || d < 0 || d/time.Second > math.MaxInt32 {
		o.note(path, Narrowed, fmt.Sprintf("%q is not a duration: Weir's default is used", value))
		return 0
	}
	o.carry(path)
	return int32(d / time.Second)
}

// leftOut notes all of o as left out, saying why.
func (o *object) leftOut(fate Fate, says string) {
	o.notes = append(o.notes, Note{Object: o.ref(), Says: says, Fate: fate, whole: true})
}

// covered tells whether path of o is carried over or noted: it, or a
// field above it, or all of o.
func (o *object) covered(path string) bool {
	within := func(p string) bool {
		return path == p || strings.HasPrefix(path, p+".") || strings.HasPrefix(path, p+"[")
	}
	return slices.ContainsFunc(o.carried, within) || slices.ContainsFunc(o.notes, func(n Note) bool { return n.whole || (!n.missed && within(n.Field)) })
}

// account notes every leaf of o that the conversion neither carried
// over nor noted: a field Weir drops, with what to do instead; a field
// MetalLB does not have, by its path. Nothing of the input is lost
// without a note.
func (o *object) account() {
	if slices.ContainsFunc(o.notes, func(n Note) bool { return n.whole }) {
		return
	}
	for _, l := range leaves(o.raw) {
		path := l.path.String()
		// A field MetalLB does not have is named even inside one carried
		// over: a misspelt matchLabels is not what MetalLB read.
		f, unknown := fieldOf(o.Kind, l.path)
		if f == nil {
			if u := unknown.String(); !slices.ContainsFunc(o.notes, func(n Note) bool { return n.Field == u }) {
				o.note(u, Dropped, fmt.Sprintf("not a field of MetalLB's %s: left out (a misspelling?)", o.Kind))
			}
			continue
		}
		switch {
		case o.covered(path), f.fate == Ignored:
		case f.fate == Dropped && zero(l.value):
			o.carry(path) // MetalLB's default, which is Weir's
		case f.fate == Dropped:
			o.note(f.path, Dropped, f.weir)
		default:
			o.notes = append(o.notes, Note{Object: o.ref(), Field: path, Fate: Dropped, missed: true,
				Says: "not carried over (this converter does not read it yet): set its Weir equivalent by hand"})
		}
	}
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
	ServiceSelectors       []selector `json:"serviceSelectors,omitempty"`
	// BGP only.
	AggregationLength   *int32   `json:"aggregationLength,omitempty"`
	AggregationLengthV6 *int32   `json:"aggregationLengthV6,omitempty"`
	LocalPref           uint32   `json:"localPref,omitempty"`
	Communities         []string `json:"communities,omitempty"`
	Peers               []string `json:"peers,omitempty"`
	// L2 only.
	Interfaces             []string `json:"interfaces,omitempty"`
	PreferredNodeSelectors []struct {
		Weight     int32    `json:"weight"`
		Preference selector `json:"preference"`
	} `json:"preferredNodeSelectors,omitempty"`
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

// peerSpec is a BGPPeer's spec, v1beta1 or v1beta2 (v1beta2 is v1beta1
// and more).
type peerSpec struct {
	MyASN                  uint32     `json:"myASN"`
	LocalASN               uint32     `json:"localASN,omitempty"`
	PeerASN                uint32     `json:"peerASN"`
	DynamicASN             string     `json:"dynamicASN,omitempty"`
	PeerAddress            string     `json:"peerAddress"`
	Interface              string     `json:"interface,omitempty"`
	VRF                    string     `json:"vrf,omitempty"`
	PeerPort               uint16     `json:"peerPort,omitempty"`
	HoldTime               string     `json:"holdTime,omitempty"`
	KeepaliveTime          string     `json:"keepaliveTime,omitempty"`
	ConnectTime            string     `json:"connectTime,omitempty"`
	EBGPMultiHop           bool       `json:"ebgpMultiHop,omitempty"`
	SourceAddress          string     `json:"sourceAddress,omitempty"`
	Password               string     `json:"password,omitempty"`
	PasswordSecret         *secretRef `json:"passwordSecret,omitempty"`
	NodeSelectors          []selector `json:"nodeSelectors,omitempty"`
	GracefulRestart        bool       `json:"enableGracefulRestart,omitempty"`
	DualStackAddressFamily *bool      `json:"dualStackAddressFamily,omitempty"`
	BFDProfile             string     `json:"bfdProfile,omitempty"`
}

// bfdProfileSpec is MetalLB's BFDProfile; intervals in milliseconds.
type bfdProfileSpec struct {
	ReceiveInterval  *uint32 `json:"receiveInterval,omitempty"`
	TransmitInterval *uint32 `json:"transmitInterval,omitempty"`
	DetectMultiplier *uint32 `json:"detectMultiplier,omitempty"`
	EchoInterval     *uint32 `json:"echoInterval,omitempty"`
	EchoMode         bool    `json:"echoMode,omitempty"`
	PassiveMode      bool    `json:"passiveMode,omitempty"`
	MinimumTTL       *uint32 `json:"minimumTtl,omitempty"`
}

// secretRef is a Kubernetes SecretReference.
type secretRef struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

type communitySpec struct {
	Communities []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"communities"`
}

// MaxInputBytes bounds the input FromMetalLB takes: 32 MiB, a thousand
// times a large MetalLB configuration. The conversion holds a few times
// its input in memory; read the input through an io.LimitReader so that
// no more than this is read.
const MaxInputBytes = 32 << 20

// MaxDocuments bounds the input's documents (blank ones aside), counted
// before any is read, and the objects in them (a List's items each).
const MaxDocuments = 100_000

// ErrTooLarge is the error of an input past MaxInputBytes or MaxDocuments.
var ErrTooLarge = errors.New("too large for a MetalLB configuration")

// FromMetalLB converts for lbctl's documents: Convert with no options.
func FromMetalLB(data string) (*Result, error) { return Convert(data, Options{}) }

// Convert reads MetalLB's objects from a YAML stream (documents, or Lists
// of objects as kubectl get -o yaml writes them, of kind IPAddressPool,
// BGPAdvertisement, L2Advertisement, BGPPeer, Community, BFDProfile in
// the metallb.io group; others are named in a Note) and returns Weir's.
// Every field of the input is carried over or named in a Note.
func Convert(data string, opts Options) (*Result, error) {
	if len(data) > MaxInputBytes {
		return nil, fmt.Errorf("%d bytes, more than %d MiB: %w", len(data), MaxInputBytes>>20, ErrTooLarge)
	}
	objs, err := readObjects(data)
	if err != nil {
		return nil, err
	}
	r := &Result{carried: map[string][]string{}}
	in, err := parseObjects(objs)
	if err != nil {
		return nil, err
	}
	ads := indexAdvertisements(slices.Concat(in.bgpAds, in.l2Ads))
	picked := make([]bool, len(ads.all))
	passedOver := make([]*object, len(ads.all)) // a pool that another advertisement's is
	for _, o := range in.pools {
		kept, passed := ads.keep(ads.selecting(o))
		for _, i := range kept {
			picked[i] = true
		}
		for _, i := range passed {
			passedOver[i] = cmp.Or(passedOver[i], o)
		}
		r.Pools = append(r.Pools, convertPool(o, ads.pick(kept), ads.pick(passed), in.communities, opts))
	}
	for _, o := range in.peers {
		if peer := r.convertPeer(o, opts, in.bfdProfiles); peer != nil {
			r.Peers = append(r.Peers, peer)
		}
	}
	for i, ad := range ads.all {
		if !picked[i] {
			says := "selects no IPAddressPool of the input: left out"
			if p := passedOver[i]; p != nil {
				says = fmt.Sprintf("Weir answers a pool over L2 with one advertisement, and %s (with any other pool this selects) as another L2Advertisement says: left out; give the services this one is for a pool of their own", p.ref())
			}
			ad.leftOut(Dropped, says)
		}
	}
	for _, o := range objs {
		if o.raw != nil {
			o.account()
		}
		r.Notes = append(r.Notes, o.notes...)
		r.carried[o.ref()] = append(r.carried[o.ref()], o.carried...)
	}
	return r, nil
}

// metallbInput is the input's MetalLB objects by kind, their specs parsed,
// and the communities the Community objects define.
type metallbInput struct {
	pools, bgpAds, l2Ads, peers []*object
	communities                 map[string]string  // a community's name: its value
	definedBy                   map[string]*object // a community's name: the Community that defines it
	bfdProfiles                 map[string]*weirv1.BfdProfile
}

// parseObjects parses the MetalLB objects of the input, in order, and
// notes the objects it leaves out.
func parseObjects(objs []*object) (*metallbInput, error) {
	in := &metallbInput{communities: map[string]string{}, definedBy: map[string]*object{}, bfdProfiles: map[string]*weirv1.BfdProfile{}}
	// MetalLB reads its objects from one namespace, an advertisement names
	// its pools without one and Weir's pools and peers have none: a name
	// is one object of a kind.
	named := map[string]*object{}
	for _, o := range objs {
		group, _, _ := strings.Cut(o.APIVersion, "/")
		if group != "metallb.io" {
			notForeign(o)
			continue
		}
		if first, ok := named[o.ref()]; ok {
			return nil, fmt.Errorf("%s: the kind and name of %s: which one is meant?", o.where(), first.where())
		}
		named[o.ref()] = o
		o.carry("apiVersion", "kind", "metadata.name", "metadata.labels")
		if err := in.add(o); err != nil {
			return nil, fmt.Errorf("%s: %w", o.where(), err)
		}
	}
	return in, nil
}

// notForeign notes an object that is not MetalLB's: left out, all of it.
// MetalLB's configuration from before its custom resources (a ConfigMap)
// is named as such, with the way to convert it.
func notForeign(o *object) {
	data, _ := o.raw["data"].(map[string]any)
	if config, ok := data["config"].(string); o.Kind == "ConfigMap" && ok && strings.Contains(config, "address-pools") {
		o.leftOut(Dropped, "MetalLB's configuration of before its custom resources (v0.13): convert it to them first (MetalLB's configmaptocrs), then convert those")
		return
	}
	o.leftOut(Ignored, fmt.Sprintf("not a MetalLB object (%s): left out", o.APIVersion))
}

// add parses o's spec as its kind's and files it.
func (in *metallbInput) add(o *object) error {
	switch o.Kind {
	case "IPAddressPool":
		var s poolSpec
		o.parsed = &s
		in.pools = append(in.pools, o)
		return spec(o, &s)
	case "BGPAdvertisement", "L2Advertisement":
		var s advertisementSpec
		o.parsed = &s
		if o.Kind == "BGPAdvertisement" {
			in.bgpAds = append(in.bgpAds, o)
		} else {
			in.l2Ads = append(in.l2Ads, o)
		}
		if err := spec(o, &s); err != nil {
			return err
		}
		return s.check()
	case "BGPPeer":
		var s peerSpec
		o.parsed = &s
		in.peers = append(in.peers, o)
		return spec(o, &s)
	case "Community":
		var s communitySpec
		if err := spec(o, &s); err != nil {
			return err
		}
		for _, c := range s.Communities {
			if first, ok := in.definedBy[c.Name]; ok {
				return fmt.Errorf("spec.communities: %q is defined by %s too: which value is meant?", c.Name, first.where())
			}
			in.communities[c.Name], in.definedBy[c.Name] = c.Value, o
		}
		// A Community is its names' values, resolved where named.
		o.carry("spec.communities")
	case "BFDProfile":
		var s bfdProfileSpec
		if err := spec(o, &s); err != nil {
			return err
		}
		// A profile is its settings, inlined into the peers that name it.
		b := &weirv1.BfdProfile{Passive: s.PassiveMode}
		for _, f := range []struct {
			path string
			from *uint32
			to   *uint32
		}{{"spec.receiveInterval", s.ReceiveInterval, &b.ReceiveIntervalMs}, {"spec.transmitInterval", s.TransmitInterval, &b.TransmitIntervalMs},
			{"spec.detectMultiplier", s.DetectMultiplier, &b.DetectMultiplier}, {"spec.minimumTtl", s.MinimumTTL, &b.MinimumTtl}} {
			if f.from != nil {
				*f.to = *f.from
			}
		}
		o.carry("spec.receiveInterval", "spec.transmitInterval", "spec.detectMultiplier", "spec.minimumTtl", "spec.passiveMode")
		if s.EchoMode {
			o.note("spec.echoMode", Dropped, "Weir's BFD has no echo mode: the control packets' intervals set the detection time")
		} else {
			o.carry("spec.echoMode")
		}
		if s.EchoInterval != nil && s.EchoMode {
			o.note("spec.echoInterval", Dropped, "Weir's BFD has no echo mode")
		} else {
			o.carry("spec.echoInterval")
		}
		in.bfdProfiles[o.Metadata.Name] = b
	default:
		if slices.Contains(statusKinds, o.Kind) {
			o.leftOut(Ignored, "MetalLB's report, not configuration: left out")
		} else {
			o.leftOut(Dropped, "Weir has no equivalent: left out")
		}
	}
	return nil
}

// readObjects reads the objects of a YAML stream, strictly as kubectl
// reads them: a key said twice in a mapping is a mistake (which one was
// meant?), not the last one winning. A List (kind List, or a kind's
// list such as IPAddressPoolList: what kubectl get -o yaml writes) is
// its items, in order.
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
	n := 0    // the document's number
	for _, doc := range docs {
		start := line
		line += strings.Count(doc, "\n") // Split keeps every line break
		n++
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, inputLines(doc, start, err))
		}
		if string(j) == "null" { // only comments, or nothing
			n--
			continue
		}
		var raw map[string]any
		if err := json.Unmarshal(j, &raw); err != nil {
			return nil, fmt.Errorf("document %d: not an object: %w", n, err)
		}
		items, isList := raw["items"].([]any)
		kind, _ := raw["kind"].(string)
		if !isList || !strings.HasSuffix(kind, "List") {
			o, err := newObject(raw, n, 0)
			if err != nil {
				return nil, err
			}
			objs = append(objs, o)
			continue
		}
		for i, item := range items {
			raw, ok := item.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("document %d: items[%d]: not an object", n, i)
			}
			o, err := newObject(raw, n, i+1)
			if err != nil {
				return nil, err
			}
			objs = append(objs, o)
		}
		if len(objs) > MaxDocuments {
			return nil, fmt.Errorf("more than %d objects: %w", MaxDocuments, ErrTooLarge)
		}
	}
	return objs, nil
}

// newObject reads an object's kind and metadata from raw.
func newObject(raw map[string]any, doc, item int) (*object, error) {
	o := &object{raw: raw, doc: doc, item: item}
	at := fmt.Sprintf("document %d", doc)
	if item > 0 {
		at += fmt.Sprintf(", item %d", item)
	}
	j, err := json.Marshal(raw)
	if err == nil {
		err = json.Unmarshal(j, o)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	return o, nil
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

// spec reads the object's spec as its kind's type. A field of the wrong
// type is an error; a field the type does not have is noted (account).
func spec(o *object, into any) error {
	if len(o.Spec) == 0 || string(o.Spec) == "null" {
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

// keep splits the advertisements of a pool (mine, in order) into those
// Weir keeps and those it passes over: a pool is announced over BGP by
// every BGPAdvertisement and answered over L2 by one advertisement, the
// first L2Advertisement; the later ones are passed over.
func (a *advertisements) keep(mine []int) (kept, passed []int) {
	l2 := false
	for _, i := range mine {
		switch {
		case a.all[i].Kind == "BGPAdvertisement":
			kept = append(kept, i)
		case !l2:
			kept, l2 = append(kept, i), true
		default:
			passed = append(passed, i)
		}
	}
	return kept, passed
}

// pick is the advertisements of indexes.
func (a *advertisements) pick(indexes []int) []*object {
	out := make([]*object, len(indexes))
	for i, ad := range indexes {
		out[i] = a.all[ad]
	}
	return out
}

// convertPool is pool o, advertised by kept (advertisements.keep): each
// BGPAdvertisement its own Weir advertisement, and at most one
// L2Advertisement; passed, the other L2Advertisements that select it,
// are noted (Weir answers a pool over L2 by one advertisement). A pool
// with both is answered over L2 and announced over BGP, each by its own
// nodes.
func convertPool(o *object, kept, passed []*object, communities map[string]string, opts Options) *weirv1.AddressPool {
	s := o.parsed.(*poolSpec)
	pool := &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: o.Metadata.Name, Labels: o.Metadata.Labels}, Addresses: s.Addresses,
		AvoidBuggyIps: s.AvoidBuggyIPs}
	o.carry("spec.addresses", "spec.autoAssign", "spec.avoidBuggyIPs")
	if s.AutoAssign != nil && !*s.AutoAssign {
		pool.ManualOnly = true
	}
	if a := s.ServiceAllocation; a != nil {
		pool.ServiceAllocation = &weirv1.ServiceAllocation{Priority: int32(a.Priority), Namespaces: a.Namespaces}
		o.carry("spec.serviceAllocation.priority", "spec.serviceAllocation.namespaces")
		if sel, ok := oneMatchLabels(a.ServiceSelectors); ok {
			pool.ServiceAllocation.ServiceSelector = sel
			o.carry("spec.serviceAllocation.serviceSelectors")
		} else {
			o.note("spec.serviceAllocation.serviceSelectors", Narrowed, "Weir selects services by labels that must all match (matchLabels of one selector): left out, so the pool is for every service")
		}
		switch sel, ok := oneMatchLabels(a.NamespaceSelectors); {
		case !ok:
			o.note("spec.serviceAllocation.namespaceSelectors", Narrowed, "Weir selects namespaces by labels that must all match (matchLabels of one selector): left out, so the pool is for every namespace")
		case len(sel) > 0 && !opts.CustomResources:
			// lbctl apply would refuse it: namespaces registered through
			// the API have no labels.
			o.note("spec.serviceAllocation.namespaceSelectors", Narrowed, "namespace labels select only in Kubernetes: convert with --to crds to keep it as namespaceSelector, or list the namespaces in namespaces")
		default:
			pool.ServiceAllocation.NamespaceSelector = sel
			o.carry("spec.serviceAllocation.namespaceSelectors")
		}
	}
	if len(kept) == 0 {
		// Said of the pool as a whole, though nothing of it is lost.
		o.note("", Narrowed, "no advertisement selects it, so MetalLB assigns its addresses without announcing them; Weir announces every pool over BGP unless it is an L2 pool")
		return pool
	}
	var bgp []*weirv1.BgpAdvertisement
	var l2 *object
	for _, ad := range kept {
		if ad.Kind == "L2Advertisement" {
			l2, pool.L2Advertisement = ad, convertL2(ad)
			continue
		}
		bgp = append(bgp, convertBGP(ad, communities)...)
	}
	for _, other := range passed {
		o.note("", Narrowed, fmt.Sprintf("%s also selects it: Weir answers a pool over L2 with one advertisement, and keeps %s; split the pool to keep both", other.ref(), l2.ref()))
	}
	// An L2 pool is announced over BGP too by its several advertisements
	// only; a pool of one advertisement for every node and service has it
	// as its one.
	if len(bgp) == 1 && len(bgp[0].GetNodeSelector()) == 0 && len(bgp[0].GetServiceSelector()) == 0 && pool.L2Advertisement == nil {
		pool.BgpAdvertisement = bgp[0]
	} else {
		pool.BgpAdvertisements = bgp
	}
	return pool
}

// convertL2 is L2Advertisement ad in Weir's terms.
func convertL2(ad *object) *weirv1.L2Advertisement {
	as := ad.parsed.(*advertisementSpec)
	ad.carry("spec.ipAddressPools", "spec.ipAddressPoolSelectors", "spec.interfaces")
	l2 := &weirv1.L2Advertisement{Interfaces: as.Interfaces}
	if sel, ok := oneMatchLabels(as.NodeSelectors); ok {
		l2.NodeSelector = sel
		ad.carry("spec.nodeSelectors")
	} else {
		ad.note("spec.nodeSelectors", Narrowed, "Weir selects nodes by labels that must all match (matchLabels of one selector): the pool is answered from every node")
	}
	if sel, ok := oneMatchLabels(as.ServiceSelectors); ok {
		l2.ServiceSelector = sel
		ad.carry("spec.serviceSelectors")
	} else {
		ad.note("spec.serviceSelectors", Narrowed, "Weir selects services by labels that must all match (matchLabels of one selector): the pool is answered for every service")
	}
	return l2
}

// convertBGP is BGPAdvertisement ad as Weir advertisements: one for each
// of its node selectors and service selectors together (MetalLB's
// selectors of one list select what any of them does; advertisements
// that apply twice to a prefix add nothing, see
// datapath.CombineAdvertisements).
func convertBGP(ad *object, communities map[string]string) []*weirv1.BgpAdvertisement {
	as := ad.parsed.(*advertisementSpec)
	bgp := &weirv1.BgpAdvertisement{LocalPreference: as.LocalPref, Peers: as.Peers}
	ad.carry("spec.ipAddressPools", "spec.ipAddressPoolSelectors", "spec.localPref", "spec.peers", "spec.aggregationLength", "spec.aggregationLengthV6")
	if l := as.AggregationLength; l != nil && *l != 32 {
		bgp.AggregationLength = uint32(*l)
	}
	if l := as.AggregationLengthV6; l != nil && *l != 128 {
		bgp.AggregationLengthV6 = uint32(*l)
	}
	for i, c := range as.Communities {
		value := c
		if v, named := communities[c]; named {
			value = v
		}
		// A value has a colon (64512:100, large:64512:1:2); a name of a
		// Community, none.
		field := fmt.Sprintf("spec.communities[%d]", i)
		if !strings.Contains(value, ":") && !ad.covered(field) {
			ad.note(field, Narrowed, fmt.Sprintf("%q names no Community of the input: left out", c))
			continue
		}
		bgp.Communities = append(bgp.Communities, value)
		ad.carry(field)
	}
	nodes, ok := eachMatchLabels(as.NodeSelectors)
	if ok {
		ad.carry("spec.nodeSelectors")
	} else {
		ad.note("spec.nodeSelectors", Narrowed, "Weir selects nodes by labels that must all match (matchLabels): a selector with matchExpressions is left out, so every node announces through it")
	}
	services, ok := eachMatchLabels(as.ServiceSelectors)
	if ok {
		ad.carry("spec.serviceSelectors")
	} else {
		ad.note("spec.serviceSelectors", Narrowed, "Weir selects services by labels that must all match (matchLabels): a selector with matchExpressions is left out, so every service is announced through it")
	}
	var out []*weirv1.BgpAdvertisement
	for _, n := range nodes {
		for _, sv := range services {
			one := proto.CloneOf(bgp)
			one.NodeSelector, one.ServiceSelector = n, sv
			out = append(out, one)
		}
	}
	return out
}

// eachMatchLabels is each selector of sels as matchLabels, or one nil (every
// object) for none; ok is false when one has expressions, and then the
// result is one nil too.
func eachMatchLabels(sels []selector) ([]map[string]string, bool) {
	if len(sels) == 0 {
		return []map[string]string{nil}, true
	}
	var out []map[string]string
	for _, s := range sels {
		if len(s.MatchExpressions) > 0 {
			return []map[string]string{nil}, false
		}
		out = append(out, maps.Clone(s.MatchLabels))
	}
	return out, true
}

// oneMatchLabels is the one matchLabels selector Weir can express; ok is
// false when sels say more (several selectors, or expressions).
func oneMatchLabels(sels []selector) (map[string]string, bool) {
	switch {
	case len(sels) == 0:
		return nil, true
	case len(sels) == 1 && len(sels[0].MatchExpressions) == 0:
		return maps.Clone(sels[0].MatchLabels), true
	}
	return nil, false
}

// convertPeer is BGPPeer o as a BgpPeer, or nil (and a note) when Weir
// cannot make its session.
func (r *Result) convertPeer(o *object, opts Options, bfdProfiles map[string]*weirv1.BfdProfile) *weirv1.BgpPeer {
	s := o.parsed.(*peerSpec)
	peer := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: o.Metadata.Name, Labels: o.Metadata.Labels},
		Address: s.PeerAddress, Asn: s.PeerASN, MyAsn: s.MyASN, Port: int32(s.PeerPort), Password: s.Password,
		GracefulRestart: s.GracefulRestart, SourceAddress: s.SourceAddress,
		Interface: s.Interface, DynamicAsn: s.DynamicASN, Vrf: s.VRF}
	o.carry("spec.interface", "spec.dynamicASN", "spec.vrf")
	o.carry("spec.peerAddress", "spec.peerASN", "spec.myASN", "spec.peerPort", "spec.password", "spec.enableGracefulRestart",
		"spec.sourceAddress", "spec.ebgpMultiHop")
	if s.EBGPMultiHop {
		// What MetalLB's FRR mode configures: ebgp-multihop without a
		// count, FRR's 255.
		peer.EbgpMultihopTtl = 255
	}
	if s.LocalASN != 0 {
		// MetalLB's myASN is the node's router's; localASN what it says
		// to this peer: Weir's my_asn is per peer.
		peer.MyAsn = s.LocalASN
		o.carry("spec.localASN")
	}
	if peer.Port == 179 {
		peer.Port = 0
	}
	peer.HoldTimeSeconds = o.seconds("spec.holdTime", s.HoldTime)
	peer.KeepaliveSeconds = o.seconds("spec.keepaliveTime", s.KeepaliveTime)
	peer.ConnectRetrySeconds = o.seconds("spec.connectTime", s.ConnectTime)
	if sel, ok := oneMatchLabels(s.NodeSelectors); ok {
		peer.NodeSelector = sel
		o.carry("spec.nodeSelectors")
	} else {
		o.note("spec.nodeSelectors", Narrowed, "Weir selects nodes by labels that must all match (matchLabels of one selector): every node peers")
	}
	if d := s.DualStackAddressFamily; d != nil {
		if *d {
			o.carry("spec.dualStackAddressFamily")
		} else {
			o.note("spec.dualStackAddressFamily", Narrowed, "false: Weir's sessions carry both families on one session; make sure the router accepts that")
		}
	}
	if name := s.BFDProfile; name != "" {
		b, ok := bfdProfiles[name]
		switch {
		case ok && peer.GetVrf() != "":
			o.note("spec.bfdProfile", Narrowed, fmt.Sprintf("Weir runs no BFD in a VRF (vrf %q): the peer has none, its hold time alone finds a dead router", peer.GetVrf()))
		case ok:
			peer.Bfd = proto.Clone(b).(*weirv1.BfdProfile)
			if b.GetMinimumTtl() != 0 && peer.GetEbgpMultihopTtl() == 0 {
				// Weir checks the TTL only of multi-hop sessions; a
				// single-hop one takes 255 alone.
				peer.Bfd.MinimumTtl = 0
			}
			o.carry("spec.bfdProfile")
		default:
			o.note("spec.bfdProfile", Dropped, fmt.Sprintf("no BFDProfile %q in the input: the peer has no BFD; add it to the export", name))
		}
	}
	if ref := s.PasswordSecret; ref != nil && ref.Name != "" {
		r.passwordSecret(o, *ref, opts)
	} else {
		o.carry("spec.passwordSecret") // names no Secret: no password
	}
	return peer
}

// passwordSecret carries MetalLB's passwordSecret of peer o into the
// custom resources' passwordSecretRef, or notes it.
func (r *Result) passwordSecret(o *object, ref secretRef, opts Options) {
	s := o.parsed.(*peerSpec)
	switch {
	case s.Password != "":
		o.note("spec.passwordSecret", Dropped, "password is given too, and is what Weir uses")
	case !opts.CustomResources:
		o.note("spec.passwordSecret", Dropped, fmt.Sprintf("lbctl's BgpPeer holds its password: set password to Secret %s's key password, or convert with --to crds", ref.Name))
	default:
		if r.PasswordSecrets == nil {
			r.PasswordSecrets = map[string]SecretKeyRef{}
		}
		// MetalLB's Secret is of type kubernetes.io/basic-auth, the
		// password under the key "password".
		r.PasswordSecrets[o.Metadata.Name] = SecretKeyRef{Name: ref.Name, Key: "password"}
		o.carry("spec.passwordSecret")
		ns := cmp.Or(ref.Namespace, o.Metadata.Namespace, "metallb-system")
		if ns != opts.Namespace {
			o.note("spec.passwordSecret", Mapped, fmt.Sprintf("Weir reads the password from Secret %s/%s: copy %s/%s there", opts.Namespace, ref.Name, ns, ref.Name))
		}
	}
}
