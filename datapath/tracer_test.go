package datapath

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// The tracer walks a new connection's first packet through the rules of a
// fake table the way the kernel would: every base chain of each hook it
// crosses, in priority order, rule by rule, evaluating the matches against
// the sets and maps and following jump, goto, return and the verdict maps.
// It knows nothing of Weir's layout; it reads only the rules, so a broken
// rule shows up as a wrong verdict. It understands the nftables grammar
// the datapath writes (and fails the test on anything else).

// packet is the first packet of a new connection, or, with midFlow, a
// later packet of an established TCP connection.
type packet struct {
	src   netip.Addr
	iif   string // input interface; "" for the node's own traffic (output hook)
	proto string // tcp, udp, sctp; icmp, icmpv6: an echo request
	dst   netip.AddrPort
	mark  uint32 // the socket's mark, for the node's own traffic
	// midFlow: a TCP packet without SYN. held: this node DNAT'ed the
	// connection, to heldBy (its entry says so; NAT chains are not
	// run, and the destination is heldBy from the NAT hook's priority
	// on, as conntrack rewrites it there). entered: the node has an entry for it already (confirmed),
	// without DNAT, from an earlier packet it passed on. ttl: as it
	// arrives (0: 64).
	midFlow, entered bool
	heldBy           netip.AddrPort
	ttl              int
	// invalid: conntrack found the packet out of its connection's
	// window, and it has no entry at all.
	invalid bool
	// icmpID is an echo request's identifier.
	icmpID int
}

// verdict is where a new connection ends up.
type verdict struct {
	Rejected  bool
	Dropped   bool
	Endpoints []string // every endpoint the random choice can pick, by slot
	// Slots is, for a choice by the flow's hash into a flow table, how
	// many slots each endpoint holds; Endpoints then lists each once, in
	// order.
	Slots map[string]int
	// Masqueraded is the endpoints (of Endpoints) whose connection leaves
	// with the node's address as its source.
	Masqueraded []string
	// PassedOn: the packet leaves, unchanged but for its TTL (PassedTTL),
	// marked for the next node of the ring of moved connections.
	PassedOn  bool
	PassedTTL int
	// Counted is the named counters the packet went through.
	Counted []string
	// EchoIDSet is the identifier a rule gave an echo request (0: none
	// did).
	EchoIDSet int
}

// The node the tracer runs on: its own addresses ("fib type local"), and
// the interfaces its pods and the outside world arrive on.
var (
	nodeLocalAddrs = []netip.Addr{nodeAddr, netip.MustParseAddr("2001:db8::11"), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	podInterface   = "cbr0"
	uplink         = "eth0"
	podNetworks    = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}
)

// trace follows a new connection from src to dst and reports where it is
// sent; src arrives on the pod bridge when it is a pod address, from the
// node itself when it is one of the node's addresses, else on the uplink.
// The masquerading is left out: the tests that check it use traceFlow.
func trace(t *testing.T, fake *knftables.Fake, src netip.Addr, proto string, dst netip.AddrPort) verdict {
	t.Helper()
	v := traceFlow(t, fake, packet{src: src, iif: interfaceOf(src), proto: proto, dst: dst})
	v.Masqueraded = nil
	return v
}

func interfaceOf(src netip.Addr) string {
	if slices.Contains(nodeLocalAddrs, src) {
		return ""
	}
	for _, p := range podNetworks {
		if p.Contains(src) {
			return podInterface
		}
	}
	return uplink
}

// traceFlow follows pkt through the table. A random choice (numgen) forks
// the walk: it is walked once for each value.
func traceFlow(t *testing.T, fake *knftables.Fake, pkt packet) verdict {
	t.Helper()
	v, _ := traceRemembering(t, fake, pkt, nil)
	return v
}

// memory is what earlier connections left in the table's dynamic sets
// ("update @set { ip saddr }"), by set.
type memory map[string][]value

// traceAffinity traces a first connection from src to dst and then, for
// each endpoint it may be sent to, a second one from the same client with
// what the first left in the dynamic sets: it returns, per endpoint of the
// first, the endpoints the second may reach.
func traceAffinity(t *testing.T, fake *knftables.Fake, src netip.Addr, proto string, dst netip.AddrPort) map[string][]string {
	t.Helper()
	pkt := packet{src: src, iif: interfaceOf(src), proto: proto, dst: dst}
	first, left := traceRemembering(t, fake, pkt, nil)
	out := map[string][]string{}
	for i, ep := range first.Endpoints {
		again, _ := traceRemembering(t, fake, pkt, left[i])
		out[ep] = again.Endpoints
	}
	return out
}

// traceRemembering is traceFlow with the dynamic sets holding remembered;
// it also returns what each walk that reached an endpoint added to them,
// in the order of the verdict's endpoints.
func traceRemembering(t *testing.T, fake *knftables.Fake, pkt packet, remembered memory) (verdict, []memory) {
	t.Helper()
	var left []memory
	// The rules' "ip"/"ip6" selectors check the table's family.
	if pkt.src.Is4() != pkt.dst.Addr().Is4() {
		t.Fatalf("trace %s -> %s: families differ", pkt.src, pkt.dst)
	}
	var v verdict
	choices, hashed := 1, false
	for choice := 0; choice < choices; choice++ {
		w := &walker{t: t, tbl: fake.Table, pkt: pkt, choice: choice, dst: pkt.dst, mark: pkt.mark, remembered: remembered, added: memory{}, ttl: cmp.Or(pkt.ttl, 64), icmpID: pkt.icmpID}
		w.run()
		if choice == 0 {
			choices = max(w.choices, 1)
			hashed = w.hashed
			v.Rejected, v.Dropped = w.end == endReject, w.end == endDrop
			v.Counted = w.counted
			if w.icmpIDSet {
				v.EchoIDSet = w.icmpID
			}
			if w.mark&DefaultFlowMark != 0 && w.end == endPass {
				v.PassedOn, v.PassedTTL = true, w.ttl
			}
		} else if (w.end == endReject) != v.Rejected || (w.end == endDrop) != v.Dropped {
			t.Fatalf("trace %s -> %s: random choice %d ends %v, choice 0 did not", pkt.src, pkt.dst, choice, w.end)
		}
		if w.dst != pkt.dst {
			v.Endpoints = append(v.Endpoints, w.dst.String())
			left = append(left, w.added)
			if w.masqueraded {
				v.Masqueraded = append(v.Masqueraded, w.dst.String())
			}
		} else if w.masqueraded {
			t.Fatalf("trace %s -> %s: masqueraded without DNAT", pkt.src, pkt.dst)
		}
	}
	if hashed {
		v.Slots = map[string]int{}
		for _, e := range v.Endpoints {
			v.Slots[e]++
		}
		v.Endpoints = slices.Sorted(maps.Keys(v.Slots))
		slices.Sort(v.Masqueraded)
		v.Masqueraded = slices.Compact(v.Masqueraded)
	}
	return v, left
}

type end int

const (
	endPass   end = iota // through every hook
	endDrop              // dropped
	endReject            // rejected
	endLocal             // delivered to the node itself
)

func (e end) String() string { return [...]string{"pass", "drop", "reject", "local"}[e] }

// outcome of a chain: continue after the jump (or return), or a final
// verdict for the hook (accept) or the packet (drop).
type outcome int

const (
	next outcome = iota
	accept
	drop
)

type walker struct {
	t           *testing.T
	tbl         *knftables.FakeTable
	pkt         packet
	dst         netip.AddrPort // after DNAT
	mark        uint32
	masqueraded bool
	rejected    bool
	choice      int  // the value every "numgen random" or "jhash" gives in this walk
	hashed      bool // the walk met a jhash
	choices     int  // the largest modulus seen
	end         end
	depth       int
	// remembered is what earlier connections left in dynamic sets; added
	// is what this walk adds ("update").
	remembered, added memory
	// trail is every rule that matched or led on, for failure messages.
	trail []string
	// ttl is the packet's TTL as the rules set it; counted, the named
	// counters the walk went through.
	ttl     int
	counted []string
	// icmpID is the echo request's identifier as the rules set it;
	// icmpIDSet whether one did.
	icmpID    int
	icmpIDSet bool
}

// run crosses the hooks: prerouting, then input or forward (decided after
// DNAT), then postrouting; the node's own packets start at output.
func (w *walker) run() {
	hooks := []knftables.BaseChainHook{knftables.PreroutingHook}
	if w.pkt.iif == "" {
		hooks = []knftables.BaseChainHook{knftables.OutputHook}
	}
	for len(hooks) > 0 {
		hook := hooks[0]
		hooks = hooks[1:]
		if !w.runHook(hook) {
			return
		}
		switch hook {
		case knftables.PreroutingHook:
			if w.isLocal(w.dst.Addr()) {
				hooks = append(hooks, knftables.InputHook)
			} else {
				hooks = append(hooks, knftables.ForwardHook, knftables.PostroutingHook)
			}
		case knftables.OutputHook:
			if !w.isLocal(w.dst.Addr()) {
				hooks = append(hooks, knftables.PostroutingHook)
			}
		case knftables.InputHook:
			w.end = endLocal
		}
	}
}

// runHook runs the table's base chains of hook in priority order; false
// when the packet went no further.
func (w *walker) runHook(hook knftables.BaseChainHook) bool {
	var chains []*knftables.FakeChain
	for _, c := range w.tbl.Chains {
		// The NAT chains see only a connection's first packet.
		if c.Hook != nil && *c.Hook == hook && !(*c.Type == knftables.NATType && (w.pkt.midFlow && w.pkt.heldBy.IsValid() || w.pkt.entered || w.pkt.invalid)) {
			chains = append(chains, c)
		}
	}
	slices.SortFunc(chains, func(a, b *knftables.FakeChain) int {
		return cmp.Compare(w.priority(*a.Priority), w.priority(*b.Priority))
	})
	// A held connection's packet takes its endpoint as destination at
	// the NAT hook's priority, whether or not a NAT chain runs.
	translate := func() {
		if w.pkt.heldBy.IsValid() && (hook == knftables.PreroutingHook || hook == knftables.OutputHook) {
			w.dst = w.pkt.heldBy
		}
	}
	for _, c := range chains {
		if w.priority(*c.Priority) >= w.priority(knftables.DNATPriority) {
			translate()
		}
		if w.runChain(c.Name) == drop {
			w.end = endDrop
			if w.rejected {
				w.end = endReject
			}
			return false
		}
	}
	translate()
	return true
}

// priority is the number of a base chain's priority ("dstnat", "filter - 10", "-110").
func (w *walker) priority(p knftables.BaseChainPriority) int {
	named := map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}
	f := strings.Fields(string(p))
	n, ok := named[f[0]]
	if !ok {
		var err error
		if n, err = strconv.Atoi(f[0]); err != nil {
			w.t.Fatalf("chain priority %q", p)
		}
	}
	if len(f) == 3 {
		d, err := strconv.Atoi(f[2])
		if err != nil || (f[1] != "+" && f[1] != "-") {
			w.t.Fatalf("chain priority %q", p)
		}
		if f[1] == "-" {
			d = -d
		}
		n += d
	}
	return n
}

func (w *walker) runChain(name string) outcome {
	c := w.tbl.Chains[name]
	if c == nil {
		w.t.Fatalf("jump to missing chain %q", name)
	}
	if w.depth++; w.depth > 16 {
		w.t.Fatalf("chain %q: jumps nest too deep", name)
	}
	defer func() { w.depth-- }()
	for _, r := range c.Rules {
		if o, final := w.runRule(name, r.Rule); final {
			return o
		}
	}
	return next
}

// runRule evaluates one rule: its matches left to right, then its
// statements; final says the chain ends here with the outcome.
func (w *walker) runRule(chain, rule string) (o outcome, final bool) {
	r := &ruleReader{w: w, chain: chain, rule: rule, toks: strings.Fields(rule)}
	for !r.done() {
		switch tok := r.peek(); tok {
		case "return":
			return next, true
		case "drop":
			return drop, true
		case "accept":
			return accept, true
		case "reject":
			r.take()
			if r.peek() == "with" {
				r.take()
				r.take()
				r.take()
			}
			w.rejected = true
			return drop, true
		case "jump", "goto":
			r.take()
			target := r.take()
			w.trail = append(w.trail, chain+": "+rule)
			o := w.runChain(target)
			if tok == "goto" || o != next {
				return o, true
			}
		case "masquerade":
			r.take()
			if r.peek() == "fully-random" {
				r.take()
			}
			w.masqueraded = true
			return accept, true
		case "dnat":
			w.trail = append(w.trail, chain+": "+rule)
			r.dnat()
			return accept, true
		case "update":
			// "update @set { selectors }": the connection's key goes
			// into the dynamic set, for the connections after it.
			r.take()
			set, ok := strings.CutPrefix(r.take(), "@")
			if !ok || w.tbl.Sets[set] == nil {
				r.fail("update of no set")
			}
			in := &ruleReader{w: w, chain: chain, rule: rule, toks: r.inline()}
			w.added[set] = append(w.added[set], in.expression()...)
			if !in.done() {
				in.fail("update key %q", strings.Join(in.toks, " "))
			}
			w.trail = append(w.trail, chain+": "+rule)
		case "counter":
			r.take()
			if r.peek() == "name" {
				r.take()
				name, err := strconv.Unquote(r.take())
				if err != nil || w.tbl.Counters[name] == nil {
					r.fail("counter %q is not the table's", name)
				}
				w.counted = append(w.counted, name)
			}
		default:
			if r.ttlStatement() {
				continue
			}
			if r.markStatement() {
				continue
			}
			if r.icmpIDStatement() {
				continue
			}
			vals := r.expression()
			if r.peek() == "vmap" {
				r.take()
				v, ok := r.lookupMap(vals)
				if !ok {
					continue
				}
				w.trail = append(w.trail, chain+": "+rule+" -> "+v)
				rv := &ruleReader{w: w, chain: chain, rule: v, toks: strings.Fields(v)}
				switch verb := rv.take(); verb {
				case "drop":
					return drop, true
				case "accept":
					return accept, true
				case "goto", "jump":
					o := w.runChain(rv.take())
					if verb == "goto" || o != next {
						return o, true
					}
				default:
					r.fail("verdict %q", v)
				}
				continue
			}
			if !r.match(vals) {
				return next, false
			}
		}
	}
	return next, false
}

// ruleReader reads the tokens of one rule.
type ruleReader struct {
	w     *walker
	chain string
	rule  string
	toks  []string
}

func (r *ruleReader) fail(format string, args ...any) {
	r.w.t.Helper()
	r.w.t.Fatalf("chain %s, rule %q: %s\nthe packet's way here:\n  %s", r.chain, r.rule, fmt.Sprintf(format, args...), strings.Join(r.w.trail, "\n  "))
}

func (r *ruleReader) done() bool { return len(r.toks) == 0 }

func (r *ruleReader) peek() string {
	if r.done() {
		return ""
	}
	return r.toks[0]
}

func (r *ruleReader) take() string {
	if r.done() {
		r.fail("ends early")
	}
	t := r.toks[0]
	r.toks = r.toks[1:]
	return t
}

func (r *ruleReader) expect(tok string) {
	if got := r.take(); got != tok {
		r.fail("%q where %q belongs", got, tok)
	}
}

// inline reads "{ ... }" and returns what is inside.
func (r *ruleReader) inline() []string {
	r.expect("{")
	var in []string
	for {
		t := r.take()
		if t == "}" {
			return in
		}
		in = append(in, t)
	}
}

// value is what one selector read from the packet.
type value struct {
	s    string
	addr netip.Addr // when the selector reads an address
	// absent: the packet has nothing to read, and the rule does not
	// match whatever it compares with.
	absent bool
}

// expression reads selectors joined by "." and returns their values.
func (r *ruleReader) expression() []value {
	var vals []value
	for {
		vals = append(vals, r.selector())
		if r.peek() != "." {
			return vals
		}
		r.take()
	}
}

func (r *ruleReader) selector() value {
	w, p := r.w, r.w.pkt
	addr := func(a netip.Addr) value { return value{s: a.String(), addr: a} }
	switch tok := r.take(); tok {
	case "ip", "ip6":
		if (tok == "ip") != p.src.Is4() {
			r.fail("%s in a table of the other family", tok)
		}
		switch r.take() {
		case "saddr":
			return addr(p.src)
		case "daddr":
			return addr(w.dst.Addr())
		case "ttl", "hoplimit":
			return value{s: strconv.Itoa(w.ttl)}
		}
	case "meta":
		switch r.take() {
		case "l4proto":
			return value{s: p.proto}
		case "mark":
			m := w.mark
			if r.peek() == "&" {
				r.take()
				m &= r.number(r.take())
			}
			return value{s: strconv.FormatUint(uint64(m), 10)}
		}
	case "th", "tcp", "udp", "sctp":
		if tok == "tcp" && r.peek() == "flags" {
			// The first packet of a connection is a SYN.
			r.take()
			r.expect("&")
			r.expect("syn")
			if p.proto != "tcp" {
				return value{s: "no tcp header"}
			}
			if p.midFlow {
				return value{s: "0"}
			}
			return value{s: "syn"}
		}
		field := r.take()
		if field != "dport" && field != "sport" {
			r.fail("%q where \"dport\" or \"sport\" belongs", field)
		}
		if tok != "th" && tok != p.proto {
			return value{s: "no " + tok + " header"}
		}
		if field == "sport" {
			return value{s: "client port"} // not modelled: only hashed
		}
		return value{s: strconv.Itoa(int(w.dst.Port()))}
	case "ct":
		if p.invalid {
			// No entry: only "ct state invalid" reads anything; any
			// other ct expression ends the rule.
			if r.take() == "state" {
				return value{s: "invalid"}
			}
			return value{absent: true}
		}
		switch r.take() {
		case "state":
			if p.midFlow && p.heldBy.IsValid() {
				return value{s: "established"}
			}
			return value{s: "new"}
		case "direction":
			return value{s: "original"}
		case "status":
			// The one status bit the rule tests, set or not.
			bit := r.peek()
			if bit == "!" || bit == "==" || bit == "!=" {
				bit = r.toks[1]
			}
			set := false
			switch bit {
			case "dnat":
				set = w.dst != p.dst || p.heldBy.IsValid()
			case "confirmed":
				set = p.entered || p.heldBy.IsValid()
			default:
				r.fail("ct status %s", bit)
			}
			if set {
				return value{s: bit}
			}
			return value{s: "none"}
		}
	case "icmp", "icmpv6":
		field := r.take()
		if p.proto != tok {
			return value{s: "no " + tok + " header"}
		}
		switch field {
		case "type":
			return value{s: "echo-request"}
		case "id":
			return value{s: strconv.Itoa(w.icmpID)}
		}
		r.fail("%s %s", tok, field)
	case "iifname":
		return value{s: p.iif}
	case "fib":
		var a netip.Addr
		switch r.take() {
		case "saddr":
			a = p.src
		case "daddr":
			a = w.dst.Addr()
		default:
			r.fail("fib of what")
		}
		r.expect("type")
		if w.isLocal(a) {
			return value{s: "local"}
		}
		return value{s: "unicast"}
	case "jhash":
		// A hash the walk does not compute: each of its values is a
		// choice, as numgen's are (that every node chooses alike is
		// TestMovedUDPFlowsKeepTheirEndpoint's, with real packets).
		w.hashed = true
		r.expression()
		r.expect("mod")
		n := int(r.number(r.take()))
		r.expect("seed")
		r.number(r.take())
		w.choices = max(w.choices, n)
		if w.choice >= n {
			r.fail("hashed choice %d of %d", w.choice, n)
		}
		return value{s: strconv.Itoa(w.choice)}
	case "numgen":
		r.expect("random")
		r.expect("mod")
		n := int(r.number(r.take()))
		w.choices = max(w.choices, n)
		if w.choice >= n {
			r.fail("random choice %d of %d", w.choice, n)
		}
		return value{s: strconv.Itoa(w.choice)}
	}
	r.fail("unknown selector before %q", r.peek())
	return value{}
}

func (r *ruleReader) number(s string) uint32 {
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		r.fail("number %q", s)
	}
	return uint32(n)
}

// match reads what vals are compared with and says whether they match.
func (r *ruleReader) match(vals []value) bool {
	negate := false
	switch r.peek() {
	case "==":
		r.take()
	case "!=", "!":
		r.take()
		negate = true
	case "<=", ">=", "<", ">":
		op := r.take()
		n := r.number(r.take())
		if len(vals) != 1 || vals[0].absent {
			return false
		}
		v, err := strconv.ParseUint(vals[0].s, 10, 32)
		if err != nil {
			r.fail("%q compared as a number", vals[0].s)
		}
		switch op {
		case "<=":
			return uint32(v) <= n
		case ">=":
			return uint32(v) >= n
		case "<":
			return uint32(v) < n
		}
		return uint32(v) > n
	}
	rhs := r.take()
	if slices.ContainsFunc(vals, func(v value) bool { return v.absent }) {
		return false
	}
	var ok bool
	if set, isSet := strings.CutPrefix(rhs, "@"); isSet {
		s := r.w.tbl.Sets[set]
		if s == nil {
			r.fail("no set %q", set)
		}
		ok = findElement(s.Elements, vals) != nil ||
			(len(vals) == 1 && slices.ContainsFunc(r.w.remembered[set], func(v value) bool { return v == vals[0] }))
	} else {
		if len(vals) != 1 {
			r.fail("a concatenation compared with %q", rhs)
		}
		ok = literalMatches(vals[0], rhs, r)
	}
	return ok != negate
}

func literalMatches(v value, lit string, r *ruleReader) bool {
	if unq, err := strconv.Unquote(lit); err == nil {
		if prefix, wild := strings.CutSuffix(unq, "*"); wild {
			return strings.HasPrefix(v.s, prefix)
		}
		return v.s == unq
	}
	if n, err := strconv.ParseUint(lit, 0, 32); err == nil {
		return v.s == strconv.FormatUint(n, 10)
	}
	if v.addr.IsValid() {
		return elementPartMatches(v, lit)
	}
	return v.s == lit
}

// lookupMap reads "@map" or an inline "{ k : v , ... }" and returns the
// value for vals.
func (r *ruleReader) lookupMap(vals []value) (string, bool) {
	if r.peek() == "{" {
		for _, entry := range strings.Split(strings.Join(r.inline(), " "), " , ") {
			k, v, ok := strings.Cut(entry, " : ")
			if !ok {
				r.fail("map entry %q", entry)
			}
			if partsMatch(strings.Split(k, " . "), vals) {
				return v, true
			}
		}
		return "", false
	}
	name, ok := strings.CutPrefix(r.take(), "@")
	m := r.w.tbl.Maps[name]
	if !ok || m == nil {
		r.fail("no map %q", name)
	}
	e := findElement(m.Elements, vals)
	if e == nil {
		return "", false
	}
	return strings.Join(e.Value, " . "), true
}

// markStatement reads "meta mark set meta mark OP X".
func (r *ruleReader) markStatement() bool {
	if len(r.toks) < 7 || r.toks[0] != "meta" || r.toks[1] != "mark" || r.toks[2] != "set" {
		return false
	}
	if r.toks[3] != "meta" || r.toks[4] != "mark" {
		r.fail("mark set to something but itself")
	}
	op, x := r.toks[5], r.number(r.toks[6])
	r.toks = r.toks[7:]
	switch op {
	case "|":
		r.w.mark |= x
	case "^":
		r.w.mark ^= x
	case "&":
		r.w.mark &= x
	default:
		r.fail("mark operator %q", op)
	}
	return true
}

// icmpIDStatement reads "icmp id set N" (icmpv6).
func (r *ruleReader) icmpIDStatement() bool {
	if len(r.toks) < 4 || (r.toks[0] != "icmp" && r.toks[0] != "icmpv6") || r.toks[1] != "id" || r.toks[2] != "set" {
		return false
	}
	if r.w.pkt.proto != r.toks[0] {
		r.fail("%s id set on a packet without that header", r.toks[0])
	}
	r.w.icmpID, r.w.icmpIDSet = int(r.number(r.toks[3])), true
	r.toks = r.toks[4:]
	return true
}

// ttlStatement reads "ip ttl set N" (ip6 hoplimit).
func (r *ruleReader) ttlStatement() bool {
	if len(r.toks) < 4 || (r.toks[0] != "ip" && r.toks[0] != "ip6") || (r.toks[1] != "ttl" && r.toks[1] != "hoplimit") || r.toks[2] != "set" {
		return false
	}
	r.w.ttl = int(r.number(r.toks[3]))
	r.toks = r.toks[4:]
	return true
}

// dnat reads "dnat ip to ADDR:PORT" or "dnat ip to EXPR map @m".
func (r *ruleReader) dnat() {
	r.expect("dnat")
	r.take() // ip, ip6
	r.expect("to")
	if ap, err := netip.ParseAddrPort(r.peek()); err == nil {
		r.take()
		r.w.dst = ap
		return
	}
	vals := r.expression()
	r.expect("map")
	v, ok := r.lookupMap(vals)
	if !ok {
		// The kernel drops a packet whose DNAT map has no element.
		r.fail("DNAT map has no element for %v", vals)
	}
	a, p, ok := strings.Cut(v, " . ")
	if !ok {
		r.fail("DNAT target %q", v)
	}
	addr, err := netip.ParseAddr(a)
	if err != nil {
		r.fail("DNAT target %q", v)
	}
	r.w.dst = netip.AddrPortFrom(addr, uint16(r.number(p)))
}

func (w *walker) isLocal(a netip.Addr) bool { return slices.Contains(nodeLocalAddrs, a) }

// findElement finds the element of a set or map whose key matches vals,
// reading intervals (prefixes, ranges) in any part of the key.
func findElement(elements []*knftables.Element, vals []value) *knftables.Element {
	for _, e := range elements {
		if partsMatch(strings.Split(strings.Join(e.Key, " . "), " . "), vals) {
			return e
		}
	}
	return nil
}

func partsMatch(parts []string, vals []value) bool {
	if len(parts) != len(vals) {
		return false
	}
	for i, v := range vals {
		if !elementPartMatches(v, parts[i]) {
			return false
		}
	}
	return true
}

func elementPartMatches(v value, part string) bool {
	if !v.addr.IsValid() {
		// A number in a range ("253-255").
		if lo, hi, ok := strings.Cut(part, "-"); ok {
			n, err := strconv.Atoi(v.s)
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			return err == nil && err1 == nil && err2 == nil && l <= n && n <= h
		}
		return v.s == part
	}
	if p, err := netip.ParsePrefix(part); err == nil {
		return p.Contains(v.addr)
	}
	if lo, hi, ok := strings.Cut(part, "-"); ok {
		l, err1 := netip.ParseAddr(lo)
		h, err2 := netip.ParseAddr(hi)
		return err1 == nil && err2 == nil && l.Compare(v.addr) <= 0 && v.addr.Compare(h) <= 0
	}
	a, err := netip.ParseAddr(part)
	return err == nil && a == v.addr
}
