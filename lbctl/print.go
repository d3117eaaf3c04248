package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// print writes objs in format. one: a NAME was asked for, so json and yaml
// show the object itself rather than a list of one.
func (a *app) print(k *kind, objs []object, format string, one, withNamespace bool) error {
	var out []byte
	var err error
	switch format {
	case "json":
		out, err = toJSON(k, objs, one)
	case "yaml":
		out, err = toYAML(k, objs, one)
	default:
		return a.printTable(k, objs, format == "wide", withNamespace)
	}
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(out)
	return err
}

// column is one table column: its header and how a resource fills it.
type column struct {
	header string
	value  func(object) string
}

// col adapts a column function written for one message type.
func col[T object](header string, value func(T) string) column {
	return column{header, func(o object) string { return value(o.(T)) }}
}

// columns are a kind's table columns, as get prints them.
func (a *app) columns(k *kind, wide, withNamespace bool) []column {
	var cols []column
	if withNamespace {
		cols = append(cols, column{"NAMESPACE", func(o object) string { return o.GetMetadata().GetNamespace() }})
	}
	cols = append(cols, column{"NAME", func(o object) string { return o.GetMetadata().GetName() }})
	cols = append(cols, k.columns...)
	cols = append(cols, column{"AGE", func(o object) string { return age(a.now(), o.GetMetadata().GetCreateTime()) }})
	if wide {
		cols = append(cols, k.wide...)
		cols = append(cols, column{"LABELS", func(o object) string { return labels(o.GetMetadata().GetLabels()) }})
	}
	return cols
}

func headers(cols []column) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.header
	}
	return out
}

func cells(cols []column, o object) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.value(o)
	}
	return out
}

func (a *app) printTable(k *kind, objs []object, wide, withNamespace bool) error {
	cols := a.columns(k, wide, withNamespace)
	t := &table{w: a.stdout}
	t.add(headers(cols)...)
	for _, o := range objs {
		t.add(cells(cols, o)...)
	}
	return t.flush()
}

// table aligns cells in columns three spaces apart, as kubectl does. It
// keeps its column widths across flushes, so that the rows get --watch
// prints one at a time line up under those before.
type table struct {
	w      io.Writer
	indent string // before every line: describe's tables sit under a title
	widths []int
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// flush writes the rows added since the last flush. The last cell of a
// row is not padded, so that lines end without blanks.
func (t *table) flush() error {
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		b.WriteString(t.indent)
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", t.widths[i]-utf8.RuneCountInString(c)+3))
			}
		}
		b.WriteByte('\n')
	}
	t.rows = nil
	_, err := io.WriteString(t.w, b.String())
	return err
}

var serviceColumns = []column{
	col("TYPE", func(s *weirv1.Service) string { return serviceType(s.GetSpec().GetType()) }),
	col("CLUSTER-IPS", func(s *weirv1.Service) string { return list(s.GetSpec().GetClusterIps()) }),
	col("EXTERNAL-IPS", func(s *weirv1.Service) string {
		return list(slices.Concat(s.GetSpec().GetExternalIps(), s.GetStatus().GetLoadBalancerIps()))
	}),
	col("PORTS", func(s *weirv1.Service) string {
		var ports []string
		for _, p := range s.GetSpec().GetPorts() {
			port := strconv.Itoa(int(p.GetPort()))
			if p.GetNodePort() != 0 {
				port += ":" + strconv.Itoa(int(p.GetNodePort()))
			}
			ports = append(ports, port+"/"+protocol(p.GetProtocol()))
		}
		return list(ports)
	}),
}

var serviceWide = []column{
	col("TRAFFIC-POLICY", func(s *weirv1.Service) string {
		return policy(s.GetSpec().GetExternalTrafficPolicy()) + "/" + policy(s.GetSpec().GetInternalTrafficPolicy())
	}),
	col("HEALTH-CHECK-PORT", func(s *weirv1.Service) string { return port(s.GetSpec().GetHealthCheckNodePort()) }),
}

var endpointSliceColumns = []column{
	col("SERVICE", func(s *weirv1.EndpointSlice) string { return s.GetServiceName() }),
	col("ENDPOINTS", func(s *weirv1.EndpointSlice) string {
		// Like kubectl's Endpoints: every endpoint with every port, first three shown.
		var all []string
		for _, e := range s.GetEndpoints() {
			addr := address(e)
			if len(s.GetPorts()) == 0 {
				all = append(all, addr)
			}
			for _, p := range s.GetPorts() {
				all = append(all, hostPort(addr, p.GetPort()))
			}
		}
		if len(all) > 3 {
			return strings.Join(all[:3], ",") + fmt.Sprintf(" + %d more...", len(all)-3)
		}
		return list(all)
	}),
	col("READY", func(s *weirv1.EndpointSlice) string {
		ready := 0
		for _, e := range s.GetEndpoints() {
			if r, _, _ := conditions(e); r {
				ready++
			}
		}
		return fmt.Sprintf("%d/%d", ready, len(s.GetEndpoints()))
	}),
}

var endpointSliceWide = []column{
	col("PORTS", func(s *weirv1.EndpointSlice) string {
		var ports []string
		for _, p := range s.GetPorts() {
			ports = append(ports, strconv.Itoa(int(p.GetPort()))+"/"+protocol(p.GetProtocol()))
		}
		return list(ports)
	}),
}

var poolColumns = []column{
	col("ADDRESSES", func(p *weirv1.AddressPool) string { return list(p.GetAddresses()) }),
	col("MODE", poolMode),
	col("AUTO-ASSIGN", func(p *weirv1.AddressPool) string {
		if p.GetManualOnly() {
			return "no"
		}
		return "yes"
	}),
}

// poolMode is how a pool's addresses reach the routers: "bgp", "l2", or
// "l2+bgp" for an L2 pool announced over BGP too (by its several
// advertisements).
func poolMode(p *weirv1.AddressPool) string {
	switch {
	case p.GetL2Advertisement() == nil:
		return "bgp"
	case len(p.GetBgpAdvertisements()) > 0:
		return "l2+bgp"
	}
	return "l2"
}

// several is what a column of the pool's one BGP advertisement shows for
// a pool with several (lbctl get pool NAME -o yaml lists them).
const several = "<several>"

var poolWide = []column{
	col("ADVERTISEMENTS", func(p *weirv1.AddressPool) string {
		switch {
		case len(p.GetBgpAdvertisements()) > 0:
			return strconv.Itoa(len(p.GetBgpAdvertisements()))
		case p.GetL2Advertisement() != nil:
			return "-"
		}
		return "1"
	}),
	col("AVOID-BUGGY-IPS", func(p *weirv1.AddressPool) string { return yesNo(p.GetAvoidBuggyIps()) }),
	col("PEERS", func(p *weirv1.AddressPool) string {
		if len(p.GetBgpAdvertisements()) > 0 {
			return several
		}
		if p.GetL2Advertisement() != nil {
			return "-"
		}
		if peers := p.GetBgpAdvertisement().GetPeers(); len(peers) > 0 {
			return list(peers)
		}
		return "all"
	}),
	col("INTERFACES", func(p *weirv1.AddressPool) string {
		switch l2 := p.GetL2Advertisement(); {
		case l2 == nil:
			return "-"
		case len(l2.GetInterfaces()) == 0:
			return "subnet"
		default:
			return list(l2.GetInterfaces())
		}
	}),
	col("AGGREGATION", func(p *weirv1.AddressPool) string {
		if len(p.GetBgpAdvertisements()) > 0 {
			return several
		}
		adv := p.GetBgpAdvertisement()
		return fmt.Sprintf("/%d,/%d", cmp.Or(adv.GetAggregationLength(), 32), cmp.Or(adv.GetAggregationLengthV6(), 128))
	}),
	col("LOCAL-PREF", func(p *weirv1.AddressPool) string {
		if len(p.GetBgpAdvertisements()) > 0 {
			return several
		}
		if lp := p.GetBgpAdvertisement().GetLocalPreference(); lp != 0 {
			return strconv.FormatUint(uint64(lp), 10)
		}
		return "<none>" // 0 sends no LOCAL_PREF
	}),
	col("COMMUNITIES", func(p *weirv1.AddressPool) string {
		if len(p.GetBgpAdvertisements()) > 0 {
			return several
		}
		return list(p.GetBgpAdvertisement().GetCommunities())
	}),
}

var serviceCIDRColumns = []column{
	col("CIDRS", func(c *weirv1.ServiceCidr) string { return list(c.GetCidrs()) }),
}

var peerWide = []column{
	col("GRACEFUL-RESTART", func(p *weirv1.BgpPeer) string { return yesNo(p.GetGracefulRestart()) }),
	col("MULTIHOP-TTL", func(p *weirv1.BgpPeer) string {
		if ttl := p.GetEbgpMultihopTtl(); ttl != 0 {
			return strconv.FormatUint(uint64(ttl), 10)
		}
		return "<none>" // directly connected
	}),
	col("SOURCE", func(p *weirv1.BgpPeer) string { return orNone(p.GetSourceAddress()) }),
	col("HOLD", func(p *weirv1.BgpPeer) string { return seconds(p.GetHoldTimeSeconds()) }),
	col("KEEPALIVE", func(p *weirv1.BgpPeer) string { return seconds(p.GetKeepaliveSeconds()) }),
	col("CONNECT-RETRY", func(p *weirv1.BgpPeer) string { return seconds(p.GetConnectRetrySeconds()) }),
	col("BFD", func(p *weirv1.BgpPeer) string { return bfdProfile(p.GetBfd()) }),
}

// bfdProfile is a peer's BFD as "100ms/100ms x3" (receive/transmit
// intervals and multiplier, defaults filled in), "passive" added;
// <none> without BFD.
func bfdProfile(b *weirv1.BfdProfile) string {
	if b == nil {
		return "<none>"
	}
	ms := func(v uint32) string { return strconv.Itoa(int(cmp.Or(v, 300))) + "ms" }
	out := fmt.Sprintf("%s/%s x%d", ms(b.GetReceiveIntervalMs()), ms(b.GetTransmitIntervalMs()), cmp.Or(b.GetDetectMultiplier(), 3))
	if b.GetPassive() {
		out += " passive"
	}
	if t := b.GetMinimumTtl(); t != 0 {
		out += fmt.Sprintf(" min-ttl %d", t)
	}
	return out
}

// seconds is a peer's timer; 0 leaves it to the speaker's default, which
// the API documents per field.
func seconds(s int32) string {
	if s == 0 {
		return "<default>"
	}
	return strconv.Itoa(int(s)) + "s"
}

var peerColumns = []column{
	col("ADDRESS", func(p *weirv1.BgpPeer) string {
		addr := p.GetAddress()
		switch {
		case addr == "" && p.GetInterface() != "":
			return p.GetInterface() + " (unnumbered)"
		case p.GetInterface() != "":
			addr += "%" + p.GetInterface() // as ping and ip(8) write a link-local address
		}
		if p.GetPort() != 0 {
			return net.JoinHostPort(addr, strconv.Itoa(int(p.GetPort())))
		}
		return addr
	}),
	col("ASN", func(p *weirv1.BgpPeer) string {
		if d := p.GetDynamicAsn(); d != "" {
			return d
		}
		return strconv.FormatUint(uint64(p.GetAsn()), 10)
	}),
	col("MY-ASN", func(p *weirv1.BgpPeer) string { return strconv.FormatUint(uint64(p.GetMyAsn()), 10) }),
	col("NODES", func(p *weirv1.BgpPeer) string {
		if len(p.GetNodeSelector()) == 0 {
			return "all"
		}
		return labels(p.GetNodeSelector())
	}),
}

var nodeColumns = []column{
	col("ADDRESSES", func(n *weirv1.Node) string { return list(n.GetAddresses()) }),
	col("ZONE", func(n *weirv1.Node) string { return orNone(n.GetZone()) }),
	col("POD-CIDRS", func(n *weirv1.Node) string { return list(n.GetPodCidrs()) }),
	col("STATUS", func(n *weirv1.Node) string {
		// As kubectl's "Ready,SchedulingDisabled" for a cordoned node.
		status := "Ready"
		if n.GetDeleting() {
			status = "Deleting"
		}
		if n.GetDrained() {
			status += ",Drained"
		}
		return status
	}),
}

// address is an endpoint's first address, the only one used, as by kube-proxy.
func address(e *weirv1.Endpoint) string {
	if len(e.GetAddresses()) == 0 {
		return ""
	}
	return e.GetAddresses()[0]
}

// conditions reads an endpoint's conditions as Kubernetes does: an unset
// ready or serving means true, an unset terminating false.
func conditions(e *weirv1.Endpoint) (ready, serving, terminating bool) {
	c := e.GetConditions()
	return c == nil || c.Ready == nil || c.GetReady(), c == nil || c.Serving == nil || c.GetServing(), c.GetTerminating()
}

// list joins values with commas; <none> when there are none.
func list(xs []string) string {
	return orNone(strings.Join(xs, ","))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func labels(m map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return list(out)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// ago is age for a moment in the past, or <never>.
func (a *app) ago(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "<never>"
	}
	return age(a.now(), ts) + " ago"
}

// expires says when a certificate ends: "in 29d (2026-12-24T10:00:00Z)",
// "EXPIRED 3h ago (...)", or "-" when there is none (plain text).
func (a *app) expires(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return a.when(ts, "EXPIRED")
}

// when says when a time comes, "in 9m (2026-12-24T10:00:00Z)", or, with
// past the word for it, when it went: "EXPIRED 3h ago (...)".
func (a *app) when(ts *timestamppb.Timestamp, past string) string {
	at := ts.AsTime().UTC().Format(time.RFC3339)
	if now := a.now(); ts.AsTime().Before(now) {
		return past + " " + age(now, ts) + " ago (" + at + ")"
	}
	return "in " + age(ts.AsTime(), timestamppb.New(a.now())) + " (" + at + ")"
}

func port(p int32) string {
	if p == 0 {
		return "<none>"
	}
	return strconv.Itoa(int(p))
}

func hostPort(addr string, port int32) string {
	if strings.Contains(addr, ":") {
		return "[" + addr + "]:" + strconv.Itoa(int(port))
	}
	return addr + ":" + strconv.Itoa(int(port))
}

// The enum spellings below are kubectl's; UNSPECIFIED reads as the API's default.

func serviceType(t weirv1.ServiceType) string {
	switch t {
	case weirv1.ServiceType_SERVICE_TYPE_NODE_PORT:
		return "NodePort"
	case weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER:
		return "LoadBalancer"
	}
	return "ClusterIP"
}

func protocol(p weirv1.Protocol) string {
	if p == weirv1.Protocol_PROTOCOL_UNSPECIFIED {
		return "TCP"
	}
	return strings.TrimPrefix(p.String(), "PROTOCOL_")
}

func policy(p weirv1.TrafficPolicy) string {
	if p == weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		return "Local"
	}
	return "Cluster"
}

// age is kubectl's short form of how long ago ts was.
func age(now time.Time, ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "<unknown>"
	}
	d := max(now.Sub(ts.AsTime()), 0) // a client clock behind the server's reads as 0s
	switch {
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	case d < 2*365*24*time.Hour:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	return fmt.Sprintf("%dy", int(d.Hours()/24/365))
}

// marshal spells fields as in the proto files, the spelling apply reads.
var marshal = protojson.MarshalOptions{UseProtoNames: true}

// objectJSON is one resource as protojson with a leading kind field.
func objectJSON(k *kind, o object) ([]byte, error) {
	b, err := marshal.Marshal(o)
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; compact it so the splice
	// below sees exactly "{" and the rest.
	var body bytes.Buffer
	if err := json.Compact(&body, b); err != nil {
		return nil, err
	}
	rest := body.Bytes()[1:]
	out := []byte(`{"kind":"` + k.name + `"`)
	if len(rest) > 1 {
		out = append(out, ',')
	}
	return append(out, rest...), nil
}

func toJSON(k *kind, objs []object, one bool) ([]byte, error) {
	var items [][]byte
	for _, o := range objs {
		b, err := objectJSON(k, o)
		if err != nil {
			return nil, err
		}
		items = append(items, b)
	}
	var raw []byte
	if one && len(items) == 1 {
		raw = items[0]
	} else {
		raw = slices.Concat([]byte(`{"items":[`), bytes.Join(items, []byte(",")), []byte("]}"))
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// objectYAML is one resource as YAML with kind first. JSONToYAML sorts
// keys, so kind is written ahead of the converted body rather than in it.
func objectYAML(k *kind, o object) (string, error) {
	b, err := marshal.Marshal(o)
	if err != nil {
		return "", err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return "", err
	}
	out := "kind: " + k.name + "\n"
	if body := string(y); body != "{}\n" {
		out += body
	}
	return out, nil
}

func toYAML(k *kind, objs []object, one bool) ([]byte, error) {
	var items []string
	for _, o := range objs {
		y, err := objectYAML(k, o)
		if err != nil {
			return nil, err
		}
		items = append(items, y)
	}
	if one && len(items) == 1 {
		return []byte(items[0]), nil
	}
	if len(items) == 0 {
		return []byte("items: []\n"), nil
	}
	var out strings.Builder
	out.WriteString("items:\n")
	for _, y := range items {
		// A list item: "- " before the first line, two spaces before the rest.
		out.WriteString("- " + strings.ReplaceAll(strings.TrimSuffix(y, "\n"), "\n", "\n  ") + "\n")
	}
	return []byte(out.String()), nil
}
