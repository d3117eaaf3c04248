package registry

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/weirlb/weir/internal/iprange"
	"github.com/weirlb/weir/server/model"
)

// ServiceRules are the allocation rules Kubernetes' apiserver enforces on
// services, which Weir enforces for the native API, where no apiserver
// stands in front of it.
type ServiceRules struct {
	// NodePorts is the range node ports and health-check node ports come
	// from (the apiserver's --service-node-port-range).
	NodePorts PortRange
	// ReservedPorts are ports Weir itself listens on, on every node: never
	// a node port or a health-check node port, whatever the range says.
	ReservedPorts map[int32]string
	// ExternalIPCIDRs are where external IPs may come from; none by
	// default, as Kubernetes' DenyServiceExternalIPs admission recommends:
	// an external IP takes traffic for an address on every node.
	ExternalIPCIDRs []netip.Prefix
	// ServiceRanges are where a native service's cluster IPs come from,
	// besides the ServiceCidr resources (the apiserver's
	// --service-cluster-ip-range). The Kubernetes source's services were
	// checked by their apiserver.
	ServiceRanges []netip.Prefix
	// ServerAddrs are the server's own addresses: no service range may
	// hold one, or every node would drop its connections to the server.
	ServerAddrs []netip.Addr
}

// DefaultServiceRules are Kubernetes' defaults and the ports of Weir's
// agent and server.
func DefaultServiceRules() ServiceRules {
	return ServiceRules{
		NodePorts: PortRange{30000, 32767},
		ReservedPorts: map[int32]string{
			179:   "BGP",
			7443:  "weir-server",
			7444:  "weir-server's metrics",
			10249: "weir-agent's metrics",
			10256: "weir-agent's /healthz",
		},
		ServiceRanges: DefaultServiceRanges(),
	}
}

// DefaultServiceRanges are kubeadm's IPv4 service range and Weir's IPv6
// one.
func DefaultServiceRanges() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/108")}
}

// PortRange is an inclusive range of ports.
type PortRange struct{ First, Last int32 }

func (r PortRange) Contains(p int32) bool { return r.First <= p && p <= r.Last }
func (r PortRange) String() string        { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// ParsePortRange reads "30000-32767".
func ParsePortRange(s string) (PortRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseInt(a, 10, 32)
	last, err2 := strconv.ParseInt(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || first < 1 || last > 65535 || first > last {
		return PortRange{}, fmt.Errorf("%q is not a port range (FIRST-LAST, within 1-65535)", s)
	}
	return PortRange{int32(first), int32(last)}, nil
}

// ClaimField is the field of a service a claim is made in.
type ClaimField int

const (
	ClusterIPs          ClaimField = iota // spec.cluster_ips
	ExternalIPs                           // spec.external_ips
	LoadBalancerIPs                       // status.load_balancer_ips
	NodePort                              // spec.ports[].node_port
	HealthCheckNodePort                   // spec.health_check_node_port
)

// path is the field's path for the value at index i.
func (f ClaimField) path(i int) string {
	switch f {
	case ClusterIPs:
		return fmt.Sprintf("spec.cluster_ips[%d]", i)
	case ExternalIPs:
		return fmt.Sprintf("spec.external_ips[%d]", i)
	case LoadBalancerIPs:
		return fmt.Sprintf("status.load_balancer_ips[%d]", i)
	case NodePort:
		return fmt.Sprintf("spec.ports[%d].node_port", i)
	}
	return "spec.health_check_node_port"
}

// use is what a claim in the field is to its service, for another
// service's messages.
func (f ClaimField) use() string {
	switch f {
	case ClusterIPs:
		return "the cluster IP"
	case ExternalIPs:
		return "a frontend (spec.external_ips)"
	case LoadBalancerIPs:
		return "a frontend (status.load_balancer_ips)"
	case NodePort:
		return "a node port"
	}
	return "the health-check node port"
}

// kind is how a claim in the field clashes with others.
func (f ClaimField) kind() claimKind {
	switch f {
	case ClusterIPs:
		return clusterAddr
	case ExternalIPs, LoadBalancerIPs:
		return frontend
	}
	return nodePort
}

// A Claim is one thing a service takes that no other service may: a whole
// address (its cluster IPs), an address, protocol and port (external and
// load-balancer IPs), or a node port (any protocol: node ports and
// health-check node ports share one space, as in Kubernetes' allocator).
type Claim struct {
	Field ClaimField
	// Index is the value's place in its field: the address's, or the
	// port's in spec.ports for a node port (0 for the health-check one).
	Index    int
	Addr     netip.Addr     // none for a node port
	Protocol model.Protocol // a frontend's
	Port     int32          // a frontend's port, or the node port
}

// Path is where the service says it: "spec.external_ips[0]".
func (c Claim) Path() string { return c.Field.path(c.Index) }

type claimKind int

const (
	clusterAddr claimKind = iota
	frontend
	nodePort
)

func claimsOf(s *model.Service) []Claim {
	var out []Claim
	for i, a := range s.ClusterIPs {
		out = append(out, Claim{Field: ClusterIPs, Index: i, Addr: a})
	}
	for _, p := range s.Ports {
		for i, a := range s.ExternalIPs {
			out = append(out, Claim{Field: ExternalIPs, Index: i, Addr: a, Protocol: p.Protocol, Port: p.Port})
		}
		for i, a := range s.LoadBalancerIPs {
			out = append(out, Claim{Field: LoadBalancerIPs, Index: i, Addr: a, Protocol: p.Protocol, Port: p.Port})
		}
	}
	for i, p := range s.Ports {
		if p.NodePort != 0 {
			out = append(out, Claim{Field: NodePort, Index: i, Port: p.NodePort})
		}
	}
	if s.HealthCheckNodePort != 0 {
		out = append(out, Claim{Field: HealthCheckNodePort, Port: s.HealthCheckNodePort})
	}
	return out
}

// clashes says whether two services' claims cannot both hold.
func clashes(a, b Claim) bool {
	ak, bk := a.Field.kind(), b.Field.kind()
	switch {
	case ak == nodePort || bk == nodePort:
		return ak == bk && a.Port == b.Port
	case a.Addr != b.Addr:
		return false
	case ak == clusterAddr || bk == clusterAddr:
		return true // a cluster IP is its service's on every port
	default:
		return a.Protocol == b.Protocol && a.Port == b.Port
	}
}

func (c Claim) String() string {
	switch c.Field.kind() {
	case clusterAddr:
		return c.Addr.String()
	case frontend:
		return fmt.Sprintf("%s %s/%d", c.Addr, c.Protocol, c.Port)
	}
	return strconv.Itoa(int(c.Port))
}

// wins says whether a's claim holds against b's (of another service):
// a cluster IP over any other use of its address, else the older service
// (by creation time, then key), so every node and every restart decides
// alike.
func wins(a *model.Service, ca Claim, b *model.Service, cb Claim) bool {
	if (ca.Field == ClusterIPs) != (cb.Field == ClusterIPs) {
		return ca.Field == ClusterIPs
	}
	return Precedes(a, b)
}

// Conflict is a claim of a service the nodes do not program, and why:
// another service holds it, or a rule refuses it. Field and Message
// render it for status, Events and errors.
type Conflict struct {
	Claim Claim
	// Holder is the service that holds the claim ("namespace/name") and
	// Held its claim; Holder is "" when a rule refuses the claim.
	Holder string
	Held   Claim
	// Rule says why the rules refuse the claim.
	Rule string
}

// Field is where the service says what is not programmed:
// "spec.external_ips[0]".
func (c Conflict) Field() string { return c.Claim.Path() }

// Message says why it is not programmed.
func (c Conflict) Message() string {
	if c.Holder == "" {
		return c.Rule
	}
	return fmt.Sprintf("%s is %s of service %s", c.Claim, c.Held.Field.use(), c.Holder)
}

// String is the conflict as one line: "FIELD: MESSAGE".
func (c Conflict) String() string { return c.Field() + ": " + c.Message() }

// refused is a conflict of a claim a rule refuses.
func refused(c Claim, why string) Conflict { return Conflict{Claim: c, Rule: why} }

// claimIndex finds the services that may share a claim with another.
type claimIndex struct {
	byAddr map[netip.Addr]map[string]bool
	byPort map[int32]map[string]bool
}

func (x *claimIndex) update(key string, old, now *model.Service) {
	if x.byAddr == nil {
		x.byAddr, x.byPort = map[netip.Addr]map[string]bool{}, map[int32]map[string]bool{}
	}
	if old != nil {
		for _, c := range claimsOf(old) {
			x.remove(key, c)
		}
	}
	if now != nil {
		for _, c := range claimsOf(now) {
			if c.Field.kind() == nodePort {
				add(x.byPort, c.Port, key)
			} else {
				add(x.byAddr, c.Addr, key)
			}
		}
	}
}

func (x *claimIndex) remove(key string, c Claim) {
	if c.Field.kind() == nodePort {
		if m := x.byPort[c.Port]; m != nil {
			delete(m, key)
			if len(m) == 0 {
				delete(x.byPort, c.Port)
			}
		}
		return
	}
	if m := x.byAddr[c.Addr]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(x.byAddr, c.Addr)
		}
	}
}

func add[K comparable](m map[K]map[string]bool, k K, key string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	m[k][key] = true
}

// neighbours lists the other services whose claims share an address or a
// node port with s's, by key.
func (x *claimIndex) neighbours(s *model.Service) []string {
	seen := map[string]bool{}
	for _, c := range claimsOf(s) {
		var m map[string]bool
		if c.Field.kind() == nodePort {
			m = x.byPort[c.Port]
		} else {
			m = x.byAddr[c.Addr]
		}
		for k := range m {
			seen[k] = true
		}
	}
	delete(seen, s.Key())
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ruleBreaches lists what of s the rules refuse. A Kubernetes service's
// node ports come from the apiserver's own range, so only the reserved
// ports apply to them.
func (r *Registry) ruleBreaches(s *model.Service) []Conflict {
	var out []Conflict
	for _, c := range claimsOf(s) {
		if c.Field.kind() != nodePort {
			continue
		}
		if what, ok := r.rules.ReservedPorts[c.Port]; ok {
			out = append(out, refused(c, fmt.Sprintf("port %d is %s on every node", c.Port, what)))
		} else if s.Source != model.SourceKubernetes && !r.rules.NodePorts.Contains(c.Port) {
			out = append(out, refused(c, fmt.Sprintf("%d is outside the node-port range %s", c.Port, r.rules.NodePorts)))
		}
	}
	if s.Source != model.SourceKubernetes {
		ranges := r.serviceRanges()
		for i, a := range s.ClusterIPs {
			if why := clusterIPBreach(ranges, a); why != "" {
				out = append(out, refused(Claim{Field: ClusterIPs, Index: i, Addr: a}, why))
			}
		}
	}
	for i, a := range s.ExternalIPs {
		if why := r.frontendBreach(s, a, false); why != "" {
			out = append(out, refused(Claim{Field: ExternalIPs, Index: i, Addr: a}, why))
		}
	}
	for i, a := range s.LoadBalancerIPs {
		if why := r.frontendBreach(s, a, true); why != "" {
			out = append(out, refused(Claim{Field: LoadBalancerIPs, Index: i, Addr: a}, why))
		}
	}
	return dedupeConflicts(out)
}

// clusterIPBreach says why a native service may not have a as a cluster
// IP ("" when it may): it comes from a service range, and is none of the
// addresses a range gives to no service.
func clusterIPBreach(ranges []netip.Prefix, a netip.Addr) string {
	if slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return iprange.ServiceAddr(p, a) }) {
		return ""
	}
	for _, p := range ranges {
		if what := iprange.ReservedServiceAddr(p, a); what != "" {
			return fmt.Sprintf("%s is %s of the service range %s, which no service is given", a, what, p)
		}
	}
	return fmt.Sprintf("%s is outside the service ranges %v (weir-server --service-cluster-ip-range, and the ServiceCidr resources)", a, ranges)
}

// frontendBreach says why the rules refuse a as an external IP of s or
// (loadBalancer) a load-balancer IP; "" when they do not. Either takes
// the address's traffic to the service's ports on every node, so neither
// is ever the server's or a node's own address (CVE-2020-8554's capture).
// External IPs come from the allowed CIDRs. A load-balancer IP lies
// outside the service ranges; a native service's comes from an address
// pool or the allowed CIDRs, while a Kubernetes service's status is the
// cluster's to bound (whoever may write it there), as kube-proxy takes it.
func (r *Registry) frontendBreach(s *model.Service, a netip.Addr, loadBalancer bool) string {
	if why := r.reserved(loadBalancer).Why(a); why != "" {
		return why
	}
	allowed := slices.ContainsFunc(r.rules.ExternalIPCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
	switch {
	case !loadBalancer && !allowed:
		return fmt.Sprintf("%s is not an allowed external IP; %s", a, r.allowedExternalIPs())
	case loadBalancer && s.Source != model.SourceKubernetes && !allowed && !r.inPool(a):
		return fmt.Sprintf("%s is in no address pool, and not an allowed external IP (%s)", a, r.allowedExternalIPs())
	}
	return ""
}

// Reserved are the addresses no service's frontend may be, whatever pool
// or allowed CIDR holds them.
type Reserved struct {
	// hostOf names the host an address is of ("weir-server", "node n1").
	hostOf func(netip.Addr) string
	// ranges are the service ranges, where no load-balancer IP lies
	// (none for external IPs).
	ranges []netip.Prefix
}

// Why says why a is reserved, "" when it is not.
func (x Reserved) Why(a netip.Addr) string {
	if host := x.hostOf(a); host != "" {
		return fmt.Sprintf("%s is an address of %s: every node would send that host's traffic on the service's ports to the service", a, host)
	}
	if i := slices.IndexFunc(x.ranges, func(p netip.Prefix) bool { return p.Contains(a) }); i >= 0 {
		return fmt.Sprintf("%s is in the service range %s, where cluster IPs come from", a, x.ranges[i])
	}
	return ""
}

// reserved is Reserved for load-balancer IPs, or for external IPs, as the
// registry holds it now. Called with mu held.
func (r *Registry) reserved(loadBalancer bool) Reserved {
	x := Reserved{hostOf: r.hostOf}
	if loadBalancer {
		x.ranges = r.serviceRanges()
	}
	return x
}

// LoadBalancerReserved is what no load-balancer IP may be, as of this view
// and kept after it: what an allocator leaves out of its pools.
func (v View) LoadBalancerReserved() Reserved {
	hosts := make(map[netip.Addr]string, len(v.r.nodeAddrs)+len(v.r.rules.ServerAddrs))
	for a := range v.r.nodeAddrs {
		hosts[a] = v.r.hostOf(a)
	}
	for _, a := range v.r.rules.ServerAddrs {
		hosts[a] = v.r.hostOf(a)
	}
	return Reserved{hostOf: func(a netip.Addr) string { return hosts[a] }, ranges: v.r.serviceRanges()}
}

// allowedExternalIPs says where external IPs may come from.
func (r *Registry) allowedExternalIPs() string {
	if len(r.rules.ExternalIPCIDRs) == 0 {
		return "none are allowed (weir-server --allowed-external-ip-cidrs)"
	}
	return fmt.Sprintf("allowed: %v", r.rules.ExternalIPCIDRs)
}

// hostOf names the host a is an address of ("weir-server", "node n1"),
// "" when none.
func (r *Registry) hostOf(a netip.Addr) string {
	if slices.Contains(r.rules.ServerAddrs, a) {
		return "weir-server"
	}
	if names := r.nodeAddrs[a]; len(names) > 0 {
		return "node " + slices.Min(slices.Collect(maps.Keys(names)))
	}
	return ""
}

// inPool says whether an address pool holds a.
func (r *Registry) inPool(a netip.Addr) bool {
	for _, p := range r.Pools.items {
		if slices.ContainsFunc(p.Ranges, func(rg model.AddressRange) bool { return rg.Contains(a) }) {
			return true
		}
	}
	return false
}

// conflicts lists s's claims that another service holds: all of them when
// taken wins false (a write to refuse), else only those the other wins.
func (r *Registry) conflicts(s *model.Service, lostOnly bool) []Conflict {
	var out []Conflict
	mine := claimsOf(s)
	for _, key := range r.claimIndex.neighbours(s) {
		other := r.Services.items[key]
		if other == nil {
			continue
		}
		theirs := claimsOf(other)
		for _, c := range mine {
			for _, o := range theirs {
				if !clashes(c, o) || (lostOnly && wins(s, c, other, o)) {
					continue
				}
				out = append(out, Conflict{Claim: c, Holder: key, Held: o})
			}
		}
	}
	return dedupeConflicts(out)
}

func dedupeConflicts(cs []Conflict) []Conflict {
	slices.SortFunc(cs, func(a, b Conflict) int {
		return cmp.Or(cmp.Compare(a.Field(), b.Field()), cmp.Compare(a.Message(), b.Message()))
	})
	return slices.CompactFunc(cs, func(a, b Conflict) bool { return a.Claim.Field == b.Claim.Field && a.Claim.Index == b.Claim.Index })
}

// checkServiceClaims refuses a native write that breaks a rule or takes
// what another service holds. A Kubernetes service is not refused (the
// cluster has it whatever Weir says): what it loses is left out of what
// the nodes program and shown in its status (View.ServiceConflicts).
func (r *Registry) checkServiceClaims(s *model.Service) error {
	if s.Source == model.SourceKubernetes {
		return nil
	}
	// Within the service: its health-check port is not one of its node ports.
	for i, p := range s.Ports {
		if s.HealthCheckNodePort != 0 && p.NodePort == s.HealthCheckNodePort {
			return &model.FieldError{Field: "spec.health_check_node_port", Reason: fmt.Sprintf("%d is spec.ports[%d].node_port of the same service", p.NodePort, i)}
		}
	}
	if bad := r.ruleBreaches(s); len(bad) > 0 {
		return &model.FieldError{Field: bad[0].Field(), Reason: bad[0].Message()}
	}
	if taken := r.conflicts(s, false); len(taken) > 0 {
		return fmt.Errorf("%w: %s", ErrInUse, taken[0])
	}
	return nil
}

// ServiceConflicts lists what of a service the nodes do not program: what
// breaks a rule, and claims an older service (or a cluster IP) holds.
func (v View) ServiceConflicts(s *model.Service) []Conflict {
	return dedupeConflicts(append(v.r.ruleBreaches(s), v.r.conflicts(s, true)...))
}

// serviceRanges are the ranges cluster IPs come from: the server's and
// every ServiceCidr resource's.
func (r *Registry) serviceRanges() []netip.Prefix {
	out := slices.Clone(r.rules.ServiceRanges)
	for _, c := range r.ServiceCIDRs.items {
		out = append(out, c.CIDRs...)
	}
	return out
}

// checkServiceCIDRClear refuses a service range that holds a node's
// address, overlaps its pod CIDRs, or holds the server's own address:
// every node drops new connections to a range's free addresses. A native
// range holding a load-balancer IP is refused too (no load-balancer IP
// lies in a service range); a Kubernetes one is the cluster's, and the
// address is what the nodes leave out.
func (r *Registry) checkServiceCIDRClear(c *model.ServiceCIDR) error {
	for i, p := range c.CIDRs {
		field := fmt.Sprintf("cidrs[%d]", i)
		for _, a := range r.rules.ServerAddrs {
			if p.Contains(a) {
				return &model.FieldError{Field: field, Reason: fmt.Sprintf("%s holds %s, an address of weir-server", p, a)}
			}
		}
		for _, n := range r.Nodes.items {
			if err := rangeClearOfNode(field, p, n); err != nil {
				return err
			}
		}
		if c.Source == model.SourceKubernetes {
			continue // the cluster's range stands; the address is not programmed
		}
		for _, key := range slices.Sorted(maps.Keys(r.loadBalancers)) {
			for _, a := range r.Services.items[key].LoadBalancerIPs {
				if p.Contains(a) {
					return &model.FieldError{Field: field, Reason: fmt.Sprintf("%s holds %s, a load-balancer IP of service %s", p, a, key)}
				}
			}
		}
	}
	return nil
}

// checkNodeClear refuses a native node with an address or a pod CIDR in
// a service range, or with an address a service has as an external or
// load-balancer IP (a Kubernetes node is the cluster's: its agents never
// drop their own addresses whatever the ranges say, and a service's
// frontend on its address is what the nodes leave out).
func (r *Registry) checkNodeClear(n *model.Node) error {
	if n.Source == model.SourceKubernetes {
		return nil
	}
	for _, p := range r.serviceRanges() {
		if err := rangeClearOfNode("", p, n); err != nil {
			return err
		}
	}
	for i, a := range n.Addresses {
		for _, key := range slices.Sorted(maps.Keys(r.claimIndex.byAddr[a])) {
			for _, c := range claimsOf(r.Services.items[key]) {
				if c.Field.kind() == frontend && c.Addr == a {
					return &model.FieldError{Field: fmt.Sprintf("addresses[%d]", i), Reason: fmt.Sprintf("%s is %s of service %s", a, c.Field.use(), key)}
				}
			}
		}
	}
	return nil
}

// rangeClearOfNode says how p takes one of n's addresses or pod CIDRs,
// naming field when it is the range's (else the node's).
func rangeClearOfNode(field string, p netip.Prefix, n *model.Node) error {
	for i, a := range n.Addresses {
		if p.Contains(a) {
			f := cmp.Or(field, fmt.Sprintf("addresses[%d]", i))
			return &model.FieldError{Field: f, Reason: fmt.Sprintf("service range %s holds %s, an address of node %s", p, a, n.Name)}
		}
	}
	for i, pc := range n.PodCIDRs {
		if p.Overlaps(pc) {
			f := cmp.Or(field, fmt.Sprintf("pod_cidrs[%d]", i))
			return &model.FieldError{Field: f, Reason: fmt.Sprintf("service range %s overlaps %s, a pod CIDR of node %s", p, pc, n.Name)}
		}
	}
	return nil
}
