package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) describeCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "describe (service NAMESPACE/NAME | service NAME -n NAMESPACE | node NAME | pool NAME | peer NAME)",
		Short: "Show a service, a node, an address pool or a BGP peer in detail, with what the agents report of it",
		Long: `Show a service, a node, an address pool or a BGP peer in detail.

A service: its spec, its endpoints by node, and per node whether the agent
has programmed it, what its health check answers, and whether the node
receives external traffic, with the reason when not.

A node: its addresses and state, its agent (connected, versions, last
error, health answers) and the services with health checks on it.

An address pool: its addresses, which services it serves, how it is
advertised (L2, or each BGP advertisement with its selectors, peers and
attributes), the addresses services hold and how many are in use.

A BGP peer: every field of it, then per node the peer's node selector
picks, or whose agent reports a session with the peer's address, the
session as the agent reports it ("<no session reported>" when none).

-o json and -o yaml print one document: the resource (under "service",
"node", "addresspool" or "bgppeer"), then for a service its endpoint
slices ("endpoint_slices") and status ("status", the API's ServiceReport);
for a node its agent's status ("status", NodeStatus) and, per service with
a health check, what the node answers ("health_checks", ServiceReport's
per-node entries with the service's name); for a pool the services
holding its addresses ("services"); for a peer each node's status with
only its sessions with the peer ("sessions", NodeStatus).`,
		Example: `  lbctl describe service default/web
  lbctl describe svc web -n default
  lbctl describe node node1
  lbctl describe pool public
  lbctl describe peer tor-a
  lbctl describe svc web -o json`,
		Args:      cobra.ExactArgs(2),
		ValidArgs: []string{"services", "nodes", "pools", "peers"},
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := kindFor(args[0])
			if err != nil {
				return err
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			var describe func(context.Context, client, weirv1.StatusServiceClient, object, string) (string, error)
			switch k.name {
			case "Service":
				describe = a.describeService
			case "Node":
				describe = a.describeNode
			case "AddressPool":
				describe = a.describePool
			case "BgpPeer":
				describe = a.describePeer
			default:
				return usageErrorf("describe shows services, nodes, pools and peers, not %s", k.plural)
			}
			ns, name := a.namespace, args[1]
			if before, after, ok := strings.Cut(name, "/"); ok && k.namespaced {
				ns, name = before, after
			}
			c, st, err := a.clients()
			if err != nil {
				return err
			}
			obj, err := a.getOne(cmd.Context(), k, c, ns, name)
			if err != nil {
				return err
			}
			out, err := describe(cmd.Context(), c, st, obj, output)
			if err != nil {
				return plain(k, err)
			}
			_, err = io.WriteString(a.stdout, out)
			return err
		},
	}
	cmd.Flags().StringVarP(&a.namespace, "namespace", "n", "default", "namespace of the service (or NAMESPACE/NAME)")
	addOutputFlag(cmd, &output)
	return cmd
}

// describeDocument is describe's -o json|yaml: the resource under its
// kind's name, with every other part (each a proto message or a list of
// them) under its own key, field names as in the proto files.
func describeDocument(k *kind, o object, parts map[string]any, output string) (string, error) {
	obj, err := objectJSON(k, o)
	if err != nil {
		return "", err
	}
	doc := map[string]any{strings.ToLower(k.name): json.RawMessage(obj)}
	for key, part := range parts {
		raw, err := messagesJSON(part)
		if err != nil {
			return "", err
		}
		doc[key] = raw
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", err
	}
	if output == "yaml" {
		y, err := yaml.JSONToYAML(b)
		return string(y), err
	}
	return string(b) + "\n", nil
}

// messagesJSON is a proto message, or a list of them, as JSON.
func messagesJSON(part any) (json.RawMessage, error) {
	switch v := part.(type) {
	case proto.Message:
		return marshal.Marshal(v)
	case []proto.Message:
		items := []json.RawMessage{}
		for _, m := range v {
			b, err := marshal.Marshal(m)
			if err != nil {
				return nil, err
			}
			items = append(items, b)
		}
		return json.Marshal(items)
	}
	return nil, fmt.Errorf("describe: cannot print %T", part)
}

func (a *app) describeService(ctx context.Context, c client, st weirv1.StatusServiceClient, o object, output string) (string, error) {
	svc := o.(*weirv1.Service)
	ns, name := svc.GetMetadata().GetNamespace(), svc.GetMetadata().GetName()
	endpointSlices, err := listEndpointSlices(ctx, c, &weirv1.ListEndpointSlicesRequest{Namespace: ns})
	if err != nil {
		return "", err
	}
	report, err := st.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: ns, Name: name})
	if err != nil {
		return "", err
	}
	statuses, err := nodeStatuses(ctx, st)
	if err != nil {
		return "", err
	}
	var mine []*weirv1.EndpointSlice
	for _, s := range endpointSlices {
		if s.GetServiceName() == name {
			mine = append(mine, s)
		}
	}
	if output != "table" {
		k, _ := kindFor("service")
		var docs []proto.Message
		for _, s := range mine {
			docs = append(docs, s)
		}
		return describeDocument(k, o, map[string]any{"endpoint_slices": docs, "status": report.GetStatus()}, output)
	}

	var b strings.Builder
	fields(&b, "", slices.Concat(a.metaFields(o), serviceFields(svc))...)
	servicePorts(&b, svc)
	serviceEndpoints(&b, mine)
	a.serviceNodes(&b, svc, report.GetStatus(), statuses)
	return b.String(), nil
}

// serviceFields is a service's spec and addresses, as field and value.
func serviceFields(svc *weirv1.Service) []string {
	spec := svc.GetSpec()
	external := policy(spec.GetExternalTrafficPolicy())
	if spec.GetHealthCheckNodePort() != 0 {
		external += fmt.Sprintf(" (health check node port %d)", spec.GetHealthCheckNodePort())
	}
	lbIPs := list(svc.GetStatus().GetLoadBalancerIps())
	if r := svc.GetStatus().GetAddressReason(); r != "" {
		lbIPs += fmt.Sprintf(" (%s: %s)", r, svc.GetStatus().GetAddressMessage()) // why Weir assigned none
	}
	var class []string // shown when the service has one, or is not Weir's
	if c := spec.GetLoadBalancerClass(); c != "" || svc.GetStatus().GetOtherController() {
		if c == "" {
			c = "<none>"
		}
		if svc.GetStatus().GetOtherController() {
			c += " (another controller's: Weir forwards its addresses, assigns and announces none)"
		}
		class = []string{"LoadBalancer Class", c}
	}
	affinity := "None"
	if spec.GetSessionAffinity() == weirv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP {
		affinity = fmt.Sprintf("ClientIP (timeout %ds)", spec.GetSessionAffinityTimeoutSeconds())
	}
	return slices.Concat([]string{
		"Type", serviceType(spec.GetType()),
		"Cluster IPs", list(spec.GetClusterIps()),
		"External IPs", list(spec.GetExternalIps()),
		"LoadBalancer IPs", lbIPs,
	}, class, []string{
		"LoadBalancer Source Ranges", list(spec.GetLoadBalancerSourceRanges()),
		"External Traffic Policy", external,
		"Internal Traffic Policy", policy(spec.GetInternalTrafficPolicy()),
		"Session Affinity", affinity,
	})
}

// servicePorts is a service's ports, and the fields that keep it from
// being programmed.
func servicePorts(b *strings.Builder, svc *weirv1.Service) {
	var ports [][]string
	for _, p := range svc.GetSpec().GetPorts() {
		ports = append(ports, []string{orNone(p.GetName()), strconv.Itoa(int(p.GetPort())), protocol(p.GetProtocol()),
			strconv.Itoa(int(cmp.Or(p.GetTargetPort(), p.GetPort()))), port(p.GetNodePort())})
	}
	section(b, "Ports", []string{"NAME", "PORT", "PROTOCOL", "TARGET PORT", "NODE PORT"}, ports)
	if cs := svc.GetStatus().GetConflicts(); len(cs) > 0 {
		var rows [][]string
		for _, c := range cs {
			rows = append(rows, []string{c.GetField(), c.GetMessage()})
		}
		b.WriteString("\n")
		section(b, "Not programmed", []string{"FIELD", "WHY"}, rows)
	}
}

// serviceEndpoints is the endpoints of a service's slices, sorted.
func serviceEndpoints(b *strings.Builder, endpointSlices []*weirv1.EndpointSlice) {
	var endpoints [][]string
	for _, s := range endpointSlices {
		var ports []string
		for _, p := range s.GetPorts() {
			ports = append(ports, strconv.Itoa(int(p.GetPort()))+"/"+protocol(p.GetProtocol()))
		}
		for _, e := range s.GetEndpoints() {
			ready, serving, terminating := conditions(e)
			endpoints = append(endpoints, []string{orNone(e.GetNodeName()), orNone(address(e)),
				list(ports), yesNo(ready), yesNo(serving), yesNo(terminating), orNone(e.GetZone())})
		}
	}
	slices.SortFunc(endpoints, func(x, y []string) int { return slices.Compare(x, y) })
	b.WriteString("\n")
	section(b, "Endpoints", []string{"NODE", "ADDRESS", "PORT(S)", "READY", "SERVING", "TERMINATING", "ZONE"}, endpoints)
}

// serviceNodeRows is a service across the nodes, row by row, gathered
// in one pass over the nodes' statuses.
type serviceNodeRows struct {
	nodes, announced, families [][]string
	errs, why                  []string
}

func (a *app) serviceNodeRows(report *weirv1.ServiceReport, statuses map[string]*weirv1.NodeStatus) serviceNodeRows {
	var r serviceNodeRows
	for _, n := range report.GetNodes() {
		if m := n.GetMessage(); m != "" {
			r.why = append(r.why, n.GetNode()+": "+m)
		}
		for _, f := range n.GetFamilies() {
			r.families = append(r.families, []string{n.GetNode(), string(nodewire.FamilyOf(f)), list(f.GetAddresses()),
				yesNo(f.GetReceivesExternalTraffic()), cmp.Or(f.GetReason(), "-")})
		}
		for _, an := range n.GetAnnouncements() {
			r.announced = append(r.announced, a.announcedRow(an, n.GetNode(), statuses[n.GetNode()]))
		}
		appliedSent, lag := versions(statuses[n.GetNode()])
		r.nodes = append(r.nodes, slices.Concat([]string{n.GetNode(), yesNo(n.GetProgrammed()), appliedSent, lag}, healthCells(n)))
		if e := n.GetHealth().GetHealthCheckError(); e != "" {
			r.errs = append(r.errs, n.GetNode()+": "+e)
		}
	}
	return r
}

// announcedRow is one prefix a node announces, with the node's sessions.
func (a *app) announcedRow(an *weirv1.BgpAnnouncement, node string, status *weirv1.NodeStatus) []string {
	weight := "-"
	if an.GetWeight() > 0 {
		weight = strconv.FormatUint(uint64(an.GetWeight()), 10)
	}
	sessions := bgpSessions(status.GetBgpSessions())
	if stale := a.staleSince(status); stale != "" {
		// What a node that is not connected announces is not known.
		sessions = stale
	}
	return []string{an.GetPrefix(), node, an.GetNextHop(), weight, sessions}
}

// serviceNodes is a service across the nodes: each node's programming and
// health check, who receives external traffic, then (where they apply)
// the pool's announcing nodes, L2, address families, BGP announcements and
// the load-balancer speakers.
func (a *app) serviceNodes(b *strings.Builder, svc *weirv1.Service, report *weirv1.ServiceReport, statuses map[string]*weirv1.NodeStatus) {
	r := a.serviceNodeRows(report, statuses)
	b.WriteString("\n")
	section(b, "Nodes", []string{"NODE", "PROGRAMMED", "APPLIED/SENT", "LAG", "HEALTH CHECK", "LOCAL READY", "EXTERNAL TRAFFIC", "REASON"}, r.nodes)
	for _, e := range r.errs {
		fmt.Fprintf(b, "  Health check error on %s\n", e)
	}
	for _, w := range r.why {
		fmt.Fprintf(b, "  Not receiving on %s\n", w)
	}
	fmt.Fprintf(b, "\nReceiving external traffic: %s\n", orNone(strings.Join(report.GetReceivingNodes(), ", ")))
	announcers(b, svc.GetStatus().GetAnnouncers())
	a.l2Addresses(b, report.GetL2Addresses())
	if len(r.families) > 0 {
		// Only where nodes run BGP speakers: each family of the
		// load-balancer IPs separately, as a router hears it.
		b.WriteString("\n")
		section(b, "External traffic by address family", []string{"NODE", "FAMILY", "ADDRESSES", "RECEIVES", "REASON"}, r.families)
	}
	if len(r.announced) > 0 {
		// Only where nodes run BGP speakers: each announced prefix, from
		// which node, with which next hop and weight, to how many of the
		// node's routers (established/configured).
		slices.SortFunc(r.announced, func(x, y []string) int { return slices.Compare(x, y) })
		b.WriteString("\n")
		section(b, "BGP announcements", []string{"PREFIX", "NODE", "NEXT HOP", "WEIGHT", "SESSIONS"}, r.announced)
	}
	if tier := a.speakerRows(report.GetSpeakers()); len(tier) > 0 {
		// Only with load-balancer speakers: each target node of each
		// prefix, whether the speaker announces it, and why not.
		b.WriteString("\n")
		section(b, "Load-balancer speakers", []string{"SPEAKER", "PREFIX", "NODE", "NEXT HOP", "WEIGHT", "ANNOUNCED", "PROBE", "REASON"}, tier)
	}
}

// announcers is, only where a pool limits its announcing nodes, the
// nodes chosen for each address, which alone announce it.
func announcers(b *strings.Builder, chosen []*weirv1.AddressAnnouncers) {
	if len(chosen) == 0 {
		return
	}
	var rows [][]string
	for _, c := range chosen {
		rows = append(rows, []string{c.GetAddress(), strconv.Itoa(len(c.GetNodes())), orNone(strings.Join(c.GetNodes(), ", "))})
	}
	b.WriteString("\n")
	section(b, "Announcing nodes (the pool's limit)", []string{"ADDRESS", "COUNT", "NODES"}, rows)
}

// l2Addresses is, only for addresses of L2 pools, the node that answers
// ARP and NDP, under which lease, and why the others may not.
func (a *app) l2Addresses(b *strings.Builder, l2 []*weirv1.L2AddressStatus) {
	if len(l2) == 0 {
		return
	}
	var rows [][]string
	var passed []string
	for _, s := range l2 {
		owner, epoch, since, chosen := "-", "-", "-", orNone(s.GetChosen())
		switch {
		case !s.GetDecided():
			owner, chosen = "unknown (the leader decides)", "unknown"
		case s.GetOwner() != "":
			owner, epoch, since = s.GetOwner(), strconv.FormatUint(s.GetEpoch(), 10), age(a.now(), s.GetSince())
		}
		rows = append(rows, []string{s.GetAddress(), owner, epoch, since, chosen, orNone(strings.Join(s.GetCandidates(), ", "))})
		for _, p := range s.GetPassedOver() {
			passed = append(passed, fmt.Sprintf("%s on %s: %s (%s)", p.GetNode(), s.GetAddress(), p.GetReason(), p.GetMessage()))
		}
	}
	b.WriteString("\n")
	section(b, "L2 (ARP and NDP)", []string{"ADDRESS", "OWNER", "EPOCH", "SINCE", "CHOSEN", "CANDIDATES"}, rows)
	for _, p := range passed {
		fmt.Fprintf(b, "  Passed over: %s\n", p)
	}
}

func (a *app) speakerRows(speakers []*weirv1.SpeakerServicePaths) [][]string {
	var rows [][]string
	for _, sp := range speakers {
		for _, p := range sp.GetPaths() {
			weight := "-"
			if p.GetWeight() > 0 {
				weight = strconv.FormatUint(uint64(p.GetWeight()), 10)
			}
			announced := yesNo(p.GetAnnounced())
			if sp.GetGoneSince() != nil {
				// What a speaker that left announces is not known.
				announced = "unknown (speaker gone " + a.ago(sp.GetGoneSince()) + ", last reported " + announced + ")"
			}
			rows = append(rows, []string{sp.GetSpeaker(), p.GetPrefix(), p.GetNode(), p.GetNextHop(), weight,
				announced, cmp.Or(p.GetProbe(), "-"), cmp.Or(p.GetReason(), "-")})
		}
	}
	return rows
}

func (a *app) describeNode(ctx context.Context, c client, st weirv1.StatusServiceClient, o object, output string) (string, error) {
	node := o.(*weirv1.Node)
	name := node.GetMetadata().GetName()
	statuses, err := nodeStatuses(ctx, st)
	if err != nil {
		return "", err
	}
	services, err := listServices(ctx, c, &weirv1.ListServicesRequest{})
	if err != nil {
		return "", err
	}
	// Only a service's report tells what the node answers for it.
	var checks [][]string
	var checkStatuses []proto.Message
	for _, s := range services {
		hc := s.GetSpec().GetHealthCheckNodePort()
		if hc == 0 {
			continue
		}
		m := s.GetMetadata()
		report, err := st.GetServiceStatus(ctx, &weirv1.GetServiceStatusRequest{Namespace: m.GetNamespace(), Name: m.GetName()})
		if err != nil {
			return "", err
		}
		for _, n := range report.GetStatus().GetNodes() {
			if n.GetNode() == name {
				checks = append(checks, slices.Concat([]string{m.GetNamespace() + "/" + m.GetName(), port(hc)}, healthCells(n)))
				checkStatuses = append(checkStatuses, &weirv1.ServiceReport{Namespace: m.GetNamespace(), Name: m.GetName(),
					Nodes: []*weirv1.ServiceNodeStatus{n}})
			}
		}
	}
	if output != "table" {
		status := statuses[name]
		if status == nil {
			status = &weirv1.NodeStatus{Name: name}
		}
		k, _ := kindFor("node")
		return describeDocument(k, o, map[string]any{"status": status, "health_checks": checkStatuses}, output)
	}

	n := statuses[name]
	var b strings.Builder
	fields(&b, "", slices.Concat(a.metaFields(o), []string{
		"Addresses", list(node.GetAddresses()),
		"Zone", orNone(node.GetZone()),
		"Pod CIDRs", list(node.GetPodCidrs()),
		"Deleting", yesNo(node.GetDeleting()),
		"Drained", yesNo(node.GetDrained()),
	}, a.drainFields(node, n.GetDrain()))...)
	appliedSent, lag := versions(n)
	lastError := "<none>"
	if n.GetLastError() != "" {
		lastError = fmt.Sprintf("version %d: %s", n.GetLastErrorVersion(), n.GetLastError())
	}
	lastSync, latency := "-", "-"
	if d := n.GetLastSyncDuration().AsDuration(); d > 0 {
		lastSync = d.Round(time.Microsecond).String()
	}
	if d := n.GetProgrammingLatency().AsDuration(); d > 0 {
		latency = d.Round(time.Microsecond).String()
	}
	b.WriteString("Agent:\n")
	fields(&b, "  ",
		"Connected", yesNo(n.GetConnected()),
		"Last Seen", a.ago(n.GetLastSeen()),
		"Applied/Sent", appliedSent,
		"Lag", lag,
		"Last Error", lastError,
		"Healthz", code(n.GetHealth().GetHealthzCode()),
		"Livez", code(n.GetHealth().GetLivezCode()),
		"Last Sync Duration", lastSync,
		"Programming Latency", latency,
		"Version", cmp.Or(n.GetAgentVersion(), "-"),
		"Certificate Expires", a.expires(n.GetCertificateNotAfter()),
	)
	b.WriteString("\n")
	section(&b, "Services with health checks", []string{"SERVICE", "PORT", "HEALTH CHECK", "LOCAL READY", "EXTERNAL TRAFFIC", "REASON"}, checks)
	if sessions := n.GetBgpSessions(); len(sessions) > 0 {
		// Only nodes that run a BGP speaker have this section.
		var rows [][]string
		for _, s := range sessions {
			rows = append(rows, a.sessionCells(s, n))
		}
		b.WriteString("\n")
		section(&b, "BGP sessions", sessionHeader, rows)
	}
	if m := n.GetMovedConnections(); m != nil {
		// Only nodes that pass moved connections on have this section.
		b.WriteString("\nMoved Connections:\n")
		changed := a.ago(m.GetChangedAt())
		if stale := a.staleSince(n); stale != "" {
			changed += ", agent " + stale
		}
		fields(&b, "  ",
			"Next Node", orNone(m.GetNextNode()),
			"Not Answering", list(m.GetNotAnswering()),
			"Passed On", fmt.Sprintf("%s, %s", plural(m.GetPassedPackets(), "packet"), plural(m.GetPassedConnections(), "connection")),
			"Taken From Peers", takenByHops(m.GetTakenPacketsByHops()),
			"Unowned", plural(m.GetUnownedPackets(), "packet")+" (round the ring: refused)",
			"Last Change", changed,
		)
	}
	return b.String(), nil
}

// sessionHeader heads the cells of sessionCells.
var sessionHeader = []string{"PEER", "ASN", "STATE", "UP", "BFD", "FAMILIES", "LAST ERROR"}

// sessionCells are one BGP session of node n's speaker; a session of an
// agent that is not connected is shown as last reported, its state unknown.
func (a *app) sessionCells(s *weirv1.BgpSession, n *weirv1.NodeStatus) []string {
	up := "-"
	if s.GetEstablishedSince() != nil {
		up = age(a.now(), s.GetEstablishedSince())
	}
	state := string(nodewire.StateOf(s))
	if stale := a.staleSince(n); stale != "" {
		state, up = stale+" (last reported "+state+")", "-"
	}
	return []string{s.GetPeerAddress(), strconv.FormatUint(uint64(s.GetPeerAsn()), 10), state, up, cmp.Or(s.GetBfdState(), "-"),
		families(s.GetFamilies()), orNone(s.GetLastError())}
}

// plural is "1 packet", "2 packets".
func plural(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.FormatUint(n, 10) + " " + what + "s"
}

// takenByHops is "9 packets (1 hop: 5, 2: 4, 3: 0, 4+: 0)".
func takenByHops(byHops []uint64) string {
	var total uint64
	var parts []string
	for i, n := range byHops {
		total += n
		hops := strconv.Itoa(i + 1)
		if i == len(byHops)-1 {
			hops += "+"
		}
		if i == 0 {
			hops += " hop"
		}
		parts = append(parts, hops+": "+strconv.FormatUint(n, 10))
	}
	if len(parts) == 0 {
		return plural(0, "packet")
	}
	return plural(total, "packet") + " (" + strings.Join(parts, ", ") + ")"
}

// drainFields are a drained node's deadline and what it still serves, as
// its agent last counted; none for a node that is not drained.
func (a *app) drainFields(node *weirv1.Node, d *weirv1.DrainStatus) []string {
	if !node.GetDrained() {
		return nil
	}
	deadline := "<none>"
	if ts := node.GetDrainDeadline(); ts != nil {
		deadline = a.when(ts, "passed")
	}
	left := "<unknown>"
	if d.GetCountedAt() != nil {
		left = fmt.Sprintf("%d (counted %s)", d.GetConnectionsLeft(), a.ago(d.GetCountedAt()))
		if ended := d.GetEndedAtDeadline(); ended > 0 {
			left += fmt.Sprintf(", %d ended at the deadline", ended)
		}
	}
	return []string{"Drain Deadline", deadline, "Connections Left", left}
}

// metaFields are the fields every resource's page starts with.
func (a *app) metaFields(o object) []string {
	m := o.GetMetadata()
	out := []string{"Name", m.GetName()}
	if m.GetNamespace() != "" {
		out = append(out, "Namespace", m.GetNamespace())
	}
	return append(out, "Labels", labels(m.GetLabels()), "Source", orNone(m.GetSource()), "Created", a.ago(m.GetCreateTime()))
}

// fields writes "Key:  value" lines with the values aligned; kv alternates
// keys and values.
func fields(b *strings.Builder, indent string, kv ...string) {
	t := &table{w: b, indent: indent}
	for i := 0; i < len(kv); i += 2 {
		t.add(kv[i]+":", kv[i+1])
	}
	_ = t.flush() // a strings.Builder takes every write
}

// section writes a titled table indented under its title, or
// "Title:  <none>" when it has no rows.
func section(b *strings.Builder, title string, header []string, rows [][]string) {
	if len(rows) == 0 {
		fmt.Fprintf(b, "%s:  <none>\n", title)
		return
	}
	fmt.Fprintf(b, "%s:\n", title)
	t := &table{w: b, indent: "  "}
	t.add(header...)
	for _, r := range rows {
		t.add(r...)
	}
	_ = t.flush()
}

// families is a session per address family: "ipv4 sent 2 accepted 0;
// ipv6 not negotiated".
func families(fs []*weirv1.BgpFamily) string {
	var out []string
	for _, f := range fs {
		name := string(nodewire.FamilyOf(f))
		if !f.GetNegotiated() {
			out = append(out, name+" not negotiated")
			continue
		}
		out = append(out, fmt.Sprintf("%s sent %d accepted %d", name, f.GetSent(), f.GetAccepted()))
	}
	return orNone(strings.Join(out, "; "))
}

// staleSince says, for a node whose agent is not connected, that what it
// last reported is no longer known to hold ("unknown (agent gone 5s ago)");
// "" for a connected node.
func (a *app) staleSince(n *weirv1.NodeStatus) string {
	if n == nil || n.GetConnected() {
		return ""
	}
	if n.GetLastSeen() == nil {
		return "unknown (never connected)"
	}
	return "unknown (agent gone " + a.ago(n.GetLastSeen()) + ")"
}

// nodeStatuses are the agents' statuses by node name.
func nodeStatuses(ctx context.Context, st weirv1.StatusServiceClient) (map[string]*weirv1.NodeStatus, error) {
	statuses, err := listNodeStatuses(ctx, st)
	if err != nil {
		return nil, err
	}
	out := map[string]*weirv1.NodeStatus{}
	for _, n := range statuses {
		out[n.GetName()] = n
	}
	return out, nil
}

// versions is a node's "applied/sent" state versions and the lag between
// them; "-" for a node that was never sent anything.
func versions(n *weirv1.NodeStatus) (appliedSent, lag string) {
	applied, sent := n.GetAppliedVersion(), n.GetSentVersion()
	if sent == 0 {
		return "-", "-"
	}
	return fmt.Sprintf("%d/%d", applied, sent), strconv.FormatUint(sent-min(applied, sent), 10)
}

// healthCells are one service on one node: what its health check answers
// (200, 503, error, or - without one), its local ready endpoints, whether
// the node receives external traffic for it and, when not, why.
func healthCells(n *weirv1.ServiceNodeStatus) []string {
	h := n.GetHealth()
	check, ready := "-", "-"
	if h != nil {
		ready = strconv.Itoa(int(h.GetLocalReady()))
		switch {
		case h.GetHealthCheckError() != "":
			check = "error"
		case h.GetHealthCheckNodePort() != 0:
			check = code(h.GetHealthCheckCode())
		}
	}
	return []string{check, ready, yesNo(n.GetReceivesExternalTraffic()), cmp.Or(n.GetReason(), "-")}
}

// code is an HTTP status code, or - when there is none yet.
func code(c int32) string {
	if c == 0 {
		return "-"
	}
	return strconv.Itoa(int(c))
}
