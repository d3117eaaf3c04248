package convert

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Fate is what becomes of a MetalLB field in Weir.
type Fate int

const (
	// Mapped: carried over whole, to the Weir field named.
	Mapped Fate = iota
	// Narrowed: carried over for some values only; a note says when not.
	Narrowed
	// Dropped: not carried over; a note says what to do instead in Weir.
	Dropped
	// Ignored: not configuration (the apiserver's bookkeeping, a status,
	// a namespace where Weir has none): nothing to carry over.
	Ignored
)

func (f Fate) String() string {
	return [...]string{"mapped", "narrowed", "dropped", "ignored"}[f]
}

// shape is the leaves a field has under its path, as path patterns: a
// key, "[]" for any list index, "*" for any map key.
type shape []string

var (
	scalar      = shape{""}
	list        = shape{"[]"}
	labels      = shape{".*"}
	anything    = shape{".**"}                                                                                                       // a subtree not read
	oneSelector = shape{".matchLabels.*", ".matchExpressions[].key", ".matchExpressions[].operator", ".matchExpressions[].values[]"} // metav1.LabelSelector
	selectors   = under("[]", oneSelector)
	secretRefs  = shape{".name", ".namespace"} // corev1.SecretReference
	aliases     = shape{"[].name", "[].value"} // MetalLB's CommunityAlias
	preferred   = append(shape{"[].weight"}, under("[].preference", oneSelector)...)
)

func under(prefix string, s shape) shape {
	out := make(shape, len(s))
	for i, leaf := range s {
		out[i] = prefix + leaf
	}
	return out
}

// A field is one field of a MetalLB kind, as MetalLB's API types declare
// it (metallb.io v1beta1 and v1beta2), and what Weir does with it.
type field struct {
	kind  string // "BGPPeer"; "" for a field of every kind
	path  string // "spec.nodeSelectors"
	shape shape
	fate  Fate
	weir  string // Mapped, Narrowed: the Weir field, and when not; Dropped: what to do instead; Ignored: why
}

// metallbFields is every field of MetalLB's configuration kinds and what
// Weir does with each: the converter notes a Dropped one from here, the
// field table of the documentation is written from here
// (TestTheFieldTableIsCurrent), and a field of the input that is not here
// is named as unknown. A field's note is one sentence that says what to
// do instead.
var metallbFields = []field{
	{"", "apiVersion", scalar, Mapped, "metallb.io/v1beta1 or v1beta2 (either BGPPeer version)"},
	{"", "kind", scalar, Mapped, "decides what the object becomes"},
	{"", "metadata.name", scalar, Mapped, "`metadata.name`"},
	{"", "metadata.labels", labels, Mapped, "`metadata.labels` (a pool's labels are what `ipAddressPoolSelectors` select)"},
	{"", "metadata.namespace", scalar, Ignored, "Weir's pools and peers are cluster-wide; MetalLB reads one namespace"},
	{"", "metadata.annotations", anything, Ignored, "no annotation of MetalLB's objects configures it"},
	{"", "metadata.uid", scalar, Ignored, "the apiserver's"},
	{"", "metadata.resourceVersion", scalar, Ignored, "the apiserver's"},
	{"", "metadata.generation", scalar, Ignored, "the apiserver's"},
	{"", "metadata.creationTimestamp", scalar, Ignored, "the apiserver's"},
	{"", "metadata.managedFields", anything, Ignored, "the apiserver's"},
	{"", "metadata.selfLink", scalar, Ignored, "the apiserver's"},
	{"", "metadata.finalizers", list, Ignored, "the apiserver's"},
	{"", "metadata.ownerReferences", anything, Ignored, "the apiserver's"},
	{"", "status", anything, Ignored, "MetalLB's report, not configuration"},

	{"IPAddressPool", "spec.addresses", list, Mapped, "AddressPool `addresses`"},
	{"IPAddressPool", "spec.autoAssign", scalar, Mapped, "`autoAssign: false` is `manual_only: true` (`autoAssign: false` in the custom resource)"},
	{"IPAddressPool", "spec.avoidBuggyIPs", scalar, Mapped, "`avoid_buggy_ips`"},
	{"IPAddressPool", "spec.serviceAllocation.priority", scalar, Mapped, "`service_allocation.priority`"},
	{"IPAddressPool", "spec.serviceAllocation.namespaces", list, Mapped, "`service_allocation.namespaces`"},
	{"IPAddressPool", "spec.serviceAllocation.namespaceSelectors", selectors, Narrowed, "`service_allocation.namespace_selector` when it is one `matchLabels` (Kubernetes only: the gRPC API's namespaces have no labels); more is noted"},
	{"IPAddressPool", "spec.serviceAllocation.serviceSelectors", selectors, Narrowed, "`service_allocation.service_selector` when it is one `matchLabels`; more (several selectors, expressions) is noted"},

	{"BGPAdvertisement", "spec.ipAddressPools", list, Mapped, "the named pools get this advertisement"},
	{"BGPAdvertisement", "spec.ipAddressPoolSelectors", selectors, Mapped, "the pools whose labels match get this advertisement"},
	{"BGPAdvertisement", "spec.aggregationLength", scalar, Mapped, "`bgp_advertisement.aggregation_length` (`bgp_advertisements[]` when several advertisements or selectors)"},
	{"BGPAdvertisement", "spec.aggregationLengthV6", scalar, Mapped, "`bgp_advertisement.aggregation_length_v6` (or `bgp_advertisements[]`)"},
	{"BGPAdvertisement", "spec.localPref", scalar, Mapped, "`bgp_advertisement.local_preference` (or `bgp_advertisements[]`)"},
	{"BGPAdvertisement", "spec.communities", list, Narrowed, "`bgp_advertisement.communities` (or `bgp_advertisements[]`), a Community's name resolved to its value, large ones (`large:A:B:C`) as they are; a name no Community of the input defines is noted"},
	{"BGPAdvertisement", "spec.peers", list, Mapped, "`bgp_advertisement.peers` (or `bgp_advertisements[]`)"},
	{"BGPAdvertisement", "spec.nodeSelectors", selectors, Narrowed, "`bgp_advertisements[].node_selector`, one advertisement per `matchLabels` selector; a selector with expressions is noted and every node announces"},
	{"BGPAdvertisement", "spec.serviceSelectors", selectors, Narrowed, "`bgp_advertisements[].service_selector`, one advertisement per `matchLabels` selector; a selector with expressions is noted and every service is announced"},

	{"L2Advertisement", "spec.ipAddressPools", list, Mapped, "the named pools get this advertisement"},
	{"L2Advertisement", "spec.ipAddressPoolSelectors", selectors, Mapped, "the pools whose labels match get this advertisement"},
	{"L2Advertisement", "spec.interfaces", list, Mapped, "`l2_advertisement.interfaces`"},
	{"L2Advertisement", "spec.nodeSelectors", selectors, Narrowed, "`l2_advertisement.node_selector` when it is one `matchLabels`; more is noted and the pool is answered from every node"},
	{"L2Advertisement", "spec.serviceSelectors", selectors, Narrowed, "`l2_advertisement.service_selector` when it is one `matchLabels`; more is noted and every service is answered"},
	{"L2Advertisement", "spec.preferredNodeSelectors", preferred, Dropped, "Weir picks the answering node among the selected ones without preference: narrow nodeSelectors to the preferred nodes, or leave it to Weir"},

	{"BGPPeer", "spec.myASN", scalar, Mapped, "BgpPeer `my_asn` (unless localASN is given)"},
	{"BGPPeer", "spec.localASN", scalar, Mapped, "BgpPeer `my_asn`: Weir's nodes say a peer's own my_asn to it"},
	{"BGPPeer", "spec.peerASN", scalar, Mapped, "BgpPeer `asn`"},
	{"BGPPeer", "spec.dynamicASN", scalar, Mapped, "BgpPeer `dynamic_asn` (an \"external\" router that says the nodes' own AS is peered as internal)"},
	{"BGPPeer", "spec.peerAddress", scalar, Mapped, "BgpPeer `address`"},
	{"BGPPeer", "spec.interface", scalar, Mapped, "BgpPeer `interface`: the router is the interface's IPv6 link-local neighbour, IPv4 routes over an IPv6 next hop (RFC 8950)"},
	{"BGPPeer", "spec.sourceAddress", scalar, Mapped, "BgpPeer `source_address`"},
	{"BGPPeer", "spec.peerPort", scalar, Mapped, "BgpPeer `port`"},
	{"BGPPeer", "spec.holdTime", scalar, Narrowed, "BgpPeer `hold_time_seconds`, whole seconds; a value that is not a duration is noted"},
	{"BGPPeer", "spec.keepaliveTime", scalar, Narrowed, "BgpPeer `keepalive_seconds`, whole seconds; a value that is not a duration is noted"},
	{"BGPPeer", "spec.connectTime", scalar, Narrowed, "BgpPeer `connect_retry_seconds`, whole seconds; a value that is not a duration is noted"},
	{"BGPPeer", "spec.routerID", scalar, Dropped, "Weir's router ID is one per node, not per peer: the agent's --bgp-router-id (default: the node's first IPv4 address)"},
	{"BGPPeer", "spec.nodeSelectors", selectors, Narrowed, "BgpPeer `node_selector` when it is one `matchLabels`; more is noted and every node peers"},
	{"BGPPeer", "spec.password", scalar, Mapped, "BgpPeer `password` (with --to crds, a Secret the WeirBGPPeer's passwordSecretRef names)"},
	{"BGPPeer", "spec.passwordSecret", secretRefs, Narrowed, "with --to crds, the WeirBGPPeer's `passwordSecretRef` (key `password`; copy the Secret into the server's namespace); lbctl's BgpPeer takes the password itself, so without --to crds it is noted"},
	{"BGPPeer", "spec.bfdProfile", scalar, Narrowed, "BgpPeer `bfd`: the named BFDProfile's settings, inlined; a name no BFDProfile of the input has, and a peer with a `vrf` (Weir runs no BFD in a VRF), are noted"},
	{"BGPPeer", "spec.enableGracefulRestart", scalar, Mapped, "BgpPeer `graceful_restart`"},
	{"BGPPeer", "spec.ebgpMultiHop", scalar, Mapped, "BgpPeer `ebgp_multihop_ttl` 255 when true (FRR's ebgp-multihop without a count); lower it to the hops there are"},
	{"BGPPeer", "spec.vrf", scalar, Mapped, "BgpPeer `vrf`: the session is bound to the VRF device"},
	{"BGPPeer", "spec.disableMP", scalar, Dropped, "Weir's sessions carry both families on one session: make sure the router accepts that"},
	{"BGPPeer", "spec.dualStackAddressFamily", scalar, Narrowed, "true is what Weir does (both families on one session); false is noted"},

	{"Community", "spec.communities", aliases, Mapped, "resolved into the advertisements that name them"},

	{"BFDProfile", "spec.receiveInterval", scalar, Mapped, "BgpPeer `bfd.receive_interval_ms` of each peer that names the profile"},
	{"BFDProfile", "spec.transmitInterval", scalar, Mapped, "BgpPeer `bfd.transmit_interval_ms` of each peer that names the profile"},
	{"BFDProfile", "spec.detectMultiplier", scalar, Mapped, "BgpPeer `bfd.detect_multiplier` of each peer that names the profile"},
	{"BFDProfile", "spec.echoInterval", scalar, Narrowed, "Weir's BFD has no echo mode: noted when echoMode is on"},
	{"BFDProfile", "spec.echoMode", scalar, Narrowed, "Weir's BFD has no echo mode: false is what Weir does; true is noted (the control packets' intervals set the detection time)"},
	{"BFDProfile", "spec.passiveMode", scalar, Mapped, "BgpPeer `bfd.passive` of each peer that names the profile"},
	{"BFDProfile", "spec.minimumTtl", scalar, Narrowed, "BgpPeer `bfd.minimum_ttl` of each multi-hop peer that names the profile; a single-hop session takes TTL 255 only"},
}

// kinds of MetalLB that are no configuration: what MetalLB reports.
var statusKinds = []string{"ConfigurationState", "ServiceBGPStatus", "ServiceL2Status"}

// A leaf is a path in an object: its keys, and list indexes.
type leaf []step

type step struct {
	key   string
	index int // a list's, when key is ""
}

func (l leaf) String() string {
	var b strings.Builder
	for i, s := range l {
		switch {
		case s.key == "":
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case i > 0:
			b.WriteString("." + s.key)
		default:
			b.WriteString(s.key)
		}
	}
	return b.String()
}

// leaves lists the paths of v's scalars and of its empty lists and
// mappings, in a stable order, with each one's value.
func leaves(v any) []struct {
	path  leaf
	value any
} {
	type item = struct {
		path  leaf
		value any
	}
	var out []item
	var walk func(p leaf, v any)
	walk = func(p leaf, v any) {
		switch v := v.(type) {
		case map[string]any:
			if len(v) == 0 {
				out = append(out, item{slices.Clone(p), v})
			}
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				walk(append(p, step{key: k}), v[k])
			}
		case []any:
			if len(v) == 0 {
				out = append(out, item{slices.Clone(p), v})
			}
			for i, e := range v {
				walk(append(p, step{index: i}), e)
			}
		default:
			out = append(out, item{slices.Clone(p), v})
		}
	}
	walk(nil, v)
	return out
}

// pattern is a field's leaf as steps: a key, "[]" or "*" (any key) or
// "**" (anything below).
func pattern(path string) []string {
	path = strings.ReplaceAll(path, "[]", ".[]")
	return strings.Split(strings.TrimPrefix(path, "."), ".")
}

// fieldPatterns are the leaves of metallbFields as patterns, with their
// field, made once.
var fieldPatterns = func() (out []struct {
	pattern []string
	field   *field
}) {
	for i := range metallbFields {
		f := &metallbFields[i]
		for _, suffix := range f.shape {
			out = append(out, struct {
				pattern []string
				field   *field
			}{pattern(f.path + suffix), f})
		}
	}
	return out
}()

// fieldOf finds the field of kind that path is in. Without one, unknown
// is the shortest part of path that no field of kind has.
func fieldOf(kind string, path leaf) (f *field, unknown leaf) {
	longest := 0 // of path, the steps some field has
	for _, p := range fieldPatterns {
		if p.field.kind != "" && p.field.kind != kind {
			continue
		}
		n, whole := match(p.pattern, path)
		if whole {
			return p.field, nil
		}
		longest = max(longest, n)
	}
	return nil, path[:min(longest+1, len(path))]
}

// match says how many steps of path the pattern has, and whether path is
// in it whole: all its steps (an empty list or mapping may end early).
func match(pat []string, path leaf) (n int, whole bool) {
	for n = 0; n < len(path); n++ {
		if n == len(pat) {
			return n, false
		}
		s := path[n]
		switch p := pat[n]; {
		case p == "**":
			return len(path), true
		case p == "[]" && s.key == "":
		case p == "*" && s.key != "":
		case p == s.key:
		default:
			return n, false
		}
	}
	return n, true
}

// zero tells whether v is a value that says nothing: MetalLB's default
// for a field that is left out.
func zero(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case string:
		return v == ""
	case float64:
		return v == 0
	case map[string]any:
		return len(v) == 0
	case []any:
		return len(v) == 0
	}
	return false
}

// fieldTable is the documentation's table of every MetalLB field and
// what Weir does with it, one row a field.
func fieldTable() string {
	var b strings.Builder
	b.WriteString("| kind | MetalLB field | Weir |\n| --- | --- | --- |\n")
	for _, f := range metallbFields {
		kind := f.kind
		if kind == "" {
			kind = "every kind"
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s: %s |\n", kind, f.path, f.fate, f.weir)
	}
	for _, k := range statusKinds {
		fmt.Fprintf(&b, "| %s | | %s: MetalLB's report, not configuration |\n", k, Ignored)
	}
	return b.String()
}
