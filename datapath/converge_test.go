package datapath

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestConvergesFromAnyTable walks a random sequence of states, agent
// restarts, syncs cut off half-way (what SIGKILL or SIGTERM leaves) and
// damage to the tables (objects deleted, chains flushed, foreign and older
// objects added, the table flushed or deleted, one family made to fail
// while the other moves on) against the real kernel. After every step the
// tables must hold exactly what a fresh agent programs for the same state:
// at once after a restart or a sync, and after damage once the periodic
// resync or a restart has run once.
//
// WEIR_CONVERGE_STEPS sets the length of the walk (the default runs in
// seconds; a soak runs thousands) and WEIR_CONVERGE_SEED replays one.
func TestConvergesFromAnyTable(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	steps := envInt(t, "WEIR_CONVERGE_STEPS", 60)
	seed := uint64(envInt(t, "WEIR_CONVERGE_SEED", int(time.Now().UnixNano()%1e9)))
	t.Logf("seed %d (WEIR_CONVERGE_SEED=%d replays this walk), %d steps", seed, seed, steps)
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()

	newDP := func() *Datapath {
		dp, err := NewForNode(Config{})
		if err != nil {
			t.Fatal(err)
		}
		return dp
	}
	dp := newDP()
	state := randomState(rng)
	if err := dp.Apply(ctx, state); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	probe := startProbe(t)
	counts := map[string]int{}
	for step := range steps {
		probe.excused.Store(false)
		var what string
		switch op := rng.IntN(9); op {
		case 0, 1: // an ordinary change
			what = "change"
			state = mutate(rng, state)
			must(t, step, what, dp.Apply(ctx, state))
		case 2: // stopped (SIGTERM) or killed (SIGKILL), restarted on a changed state
			what = "restart"
			state = randomState(rng)
			dp = newDP()
			must(t, step, what, dp.Apply(ctx, state))
		case 7, 8: // restarted on the same state, or one changed a little
			what = "restart, adopting"
			if op == 8 {
				what, state = "restart, adopting a changed state", mutate(rng, state)
			}
			was := []digest{dp.tables[&ipv4].digest, dp.tables[&ipv6].digest}
			dp = newDP()
			must(t, step, what, dp.Apply(ctx, state))
			// What nft writes is the same (the digests say so): nothing but
			// elements differ, and the table the agent left is adopted.
			for i, f := range []*family{&ipv4, &ipv6} {
				if tab := dp.tables[f]; tab.digest == was[i] && !tab.adopted {
					t.Fatalf("step %d (%s): the %s table was not adopted", step, what, f)
				}
			}
			if dp.tables[&ipv4].adopted {
				counts["adopted"]++
			}
		case 3: // killed in the middle of a sync, restarted
			what = "killed mid-sync"
			cut, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(40000))*time.Microsecond)
			_ = dp.Apply(cut, randomState(rng))
			cancel()
			state = randomState(rng)
			dp = newDP()
			must(t, step, what, dp.Apply(ctx, state))
		default: // damage, then the periodic resync or a restart repairs it
			damage := damages[rng.IntN(len(damages))]
			what = "damage: " + damage.name
			// What someone else breaks may stop traffic until the repair.
			probe.excused.Store(true)
			damage.do(t, rng)
			// A restart adopts a table whose elements someone else
			// changed (the digest is the state's): the periodic resync
			// repairs them, as it does between restarts.
			if damage.elements || rng.IntN(2) == 0 {
				what += ", resync"
			} else {
				what += ", restart"
				dp = newDP()
			}
			// Whatever was done to the table, one attempt repairs it.
			if strings.HasSuffix(what, "resync") {
				must(t, step, what, dp.Resync(ctx))
			} else {
				must(t, step, what, dp.Apply(ctx, state))
			}
		}
		counts[strings.SplitN(what, ",", 2)[0]]++
		if failed := probe.failures(); failed != nil {
			t.Fatalf("step %d (%s): connections to the unchanged service failed: %v", step, what, failed)
		}
		got := canonicalTables(t)
		// What a fresh agent programs for the same state; the walk goes
		// on from its tables (the table is gone meanwhile: excused).
		probe.excused.Store(true)
		removeTables(t)
		dp = newDP()
		must(t, step, "fresh agent", dp.Apply(ctx, state))
		probe.forgetExcused(t)
		if diff := cmp.Diff(canonicalTables(t), got); diff != "" {
			t.Fatalf("step %d (%s): the tables differ from a fresh agent's (-fresh +got):\n%s", step, what, diff)
		}
	}
	t.Logf("steps by kind: %v; %d connections to the unchanged service", counts, probe.total.Load())
}

// The unchanged service every state holds: a cluster IP whose one endpoint
// is a listener of this test, reached from a source inside the cluster (so
// nothing is masqueraded), both on lo.
var (
	stableClusterIP = netip.MustParseAddr("10.96.0.200")
	stableEndpoint  = netip.MustParseAddr("10.244.1.251")
	probeSource     = netip.MustParseAddr("10.244.1.250")
)

func stableService() *Service {
	return &Service{
		Key:        ServiceKey{"default", "stable"},
		ClusterIPs: []netip.Addr{stableClusterIP},
		Ports: []ServicePort{{Name: "p", Protocol: TCP, Port: 80, Endpoints: []Endpoint{
			{Addr: stableEndpoint, Port: 8080, Local: true, Ready: true, Serving: true}}}},
	}
}

// probe connects to the stable service every few milliseconds and keeps
// the failures that were not excused.
type probe struct {
	excused atomic.Bool
	total   atomic.Int64
	mu      sync.Mutex
	failed  []string
}

func startProbe(t *testing.T) *probe {
	t.Helper()
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", stableEndpoint.String() + "/32", "dev", "lo"},
		{"ip", "addr", "add", probeSource.String() + "/32", "dev", "lo"},
		// A route for the cluster IP, which DNAT then sends to lo.
		{"ip", "route", "add", "10.96.0.0/16", "dev", "lo"},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(stableEndpoint, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	p := &probe{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		d := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: probeSource.AsSlice()}}
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			excused := p.excused.Load()
			c, err := d.Dial("tcp", netip.AddrPortFrom(stableClusterIP, 80).String())
			if err == nil {
				c.Close()
			}
			p.total.Add(1)
			if err != nil && !excused && !p.excused.Load() {
				p.mu.Lock()
				p.failed = append(p.failed, err.Error())
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done; ln.Close() })
	return p
}

// forgetExcused forgets what happened while failures were excused: the
// failures, and the conntrack entries of connections that began while the
// table was missing. Those were never DNAT'ed, and a later connection that
// happens to reuse one's source port would be taken for it and refused.
func (p *probe) forgetExcused(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("conntrack", "-D", "-d", stableClusterIP.String()).CombinedOutput(); err != nil && !strings.Contains(string(out), "0 flow entries") {
		t.Fatalf("conntrack -D: %v: %s", err, out)
	}
	p.failures()
}

// failures returns and forgets the failures so far.
func (p *probe) failures() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.failed
	p.failed = nil
	return f
}

func must(t *testing.T, step int, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("step %d (%s): %v", step, what, err)
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// randomState is a few services with endpoint counts that come and go, so
// that the set of pick chains changes from one state to the next.
func randomState(rng *rand.Rand) NodeState {
	st := nodeState(stableService())
	for i := range 3 + rng.IntN(6) {
		st.Services[randomService(rng, i).Key] = randomService(rng, i)
	}
	return st
}

func randomService(rng *rand.Rand, i int) *Service {
	s := &Service{
		Key:        ServiceKey{"default", fmt.Sprintf("svc%d", i)},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})},
		Ports:      []ServicePort{{Name: "p", Protocol: []Protocol{TCP, UDP}[rng.IntN(2)], Port: 80, NodePort: uint16(30080 + i)}},
	}
	if rng.IntN(2) == 0 {
		s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", 10+i)))
	}
	if rng.IntN(3) == 0 {
		s.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)})}
		s.ExternalTrafficPolicy = TrafficPolicy(rng.IntN(2))
	}
	if rng.IntN(5) == 0 {
		s.SessionAffinityTimeout = time.Duration(1+rng.IntN(100)) * time.Second
	}
	for j := range rng.IntN(5) {
		s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 244, byte(1 + rng.IntN(2)), byte(10*i + j)}), Port: 8080,
			Local: rng.IntN(2) == 0, Ready: true, Serving: true})
		if rng.IntN(2) == 0 {
			s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, Endpoint{
				Addr: netip.MustParseAddr(fmt.Sprintf("fd00:244:1::%x", 16*i+j)), Port: 8080, Local: true, Ready: true, Serving: true})
		}
	}
	return s
}

// mutate changes one service, adds one or removes one, as a new state
// with new *Service values only where they changed.
func mutate(rng *rand.Rand, st NodeState) NodeState {
	next := NodeState{Node: st.Node, Services: map[ServiceKey]*Service{}}
	for k, s := range st.Services {
		next.Services[k] = s
	}
	i := rng.IntN(10)
	key := ServiceKey{"default", fmt.Sprintf("svc%d", i)}
	if _, ok := next.Services[key]; ok && rng.IntN(3) == 0 {
		delete(next.Services, key)
	} else {
		next.Services[key] = randomService(rng, i)
	}
	return next
}

// damages are what someone else, or an older agent, may do to the tables.
var damages = []struct {
	name     string
	do       func(t *testing.T, rng *rand.Rand)
	elements bool // only elements change
}{
	{"delete a map of the live generation", func(t *testing.T, rng *rand.Rand) {
		g := kernelGeneration(t, "ip")
		// Rules refer to it: empty them first, as an operator would have to.
		nft(t, "flush chain ip weir node_ports",
			"delete map ip weir "+g.of(nodePortKind.frontends))
	}, false},
	{"flush a chain", func(t *testing.T, rng *rand.Rand) {
		nft(t, "flush chain ip weir "+[]string{"services", "node_ports", "dispatch", "masquerading", "nat_prerouting", "reject_unserved"}[rng.IntN(6)])
	}, false},
	{"flush the table", func(t *testing.T, rng *rand.Rand) {
		nft(t, "flush table ip weir", "flush table ip6 weir")
	}, false},
	{"delete the table", func(t *testing.T, rng *rand.Rand) {
		nft(t, "delete table ip weir")
	}, false},
	{"foreign objects", func(t *testing.T, rng *rand.Rand) {
		nft(t, "add set ip weir foreign { type ipv4_addr ; elements = { 192.0.2.1 } ; }",
			"add chain ip weir foreign_chain",
			"add rule ip weir foreign_chain ip saddr @foreign counter",
			"add rule ip weir services jump foreign_chain",
			"add chain ip weir foreign_base { type filter hook input priority 0 ; }")
	}, false},
	{"an older layout's objects", func(t *testing.T, rng *rand.Rand) {
		nft(t, "add chain ip weir svc-ABCDEF", "add chain ip weir old_pick",
			"add map ip weir frontends { type ipv4_addr . inet_proto . inet_service : verdict ; elements = { 10.96.9.9 . tcp . 80 : goto svc-ABCDEF } ; }",
			"add rule ip weir svc-ABCDEF jump old_pick")
	}, false},
	{"both generations, the idle one referenced", func(t *testing.T, rng *rand.Rand) {
		holdIdleFrontends(t, "ip")
	}, false},
	{"the idle generation's set, of another shape", func(t *testing.T, rng *rand.Rand) {
		// The next switch creates its sets over netlink: the kernel
		// refuses one whose name is taken by another shape.
		nft(t, "add set ip weir "+kernelGeneration(t, "ip").other().of(clusterIPsSet)+" { type inet_service ; elements = { 80 } ; }")
	}, false},
	{"both generation markers", func(t *testing.T, rng *rand.Rand) {
		nft(t, "add chain ip weir "+kernelGeneration(t, "ip").other().marker())
	}, false},
	{"IPv6 fails after IPv4 switched", func(t *testing.T, rng *rand.Rand) {
		// The IPv6 switch cannot recreate the map a rule holds; IPv4's
		// goes through.
		holdIdleFrontends(t, "ip6")
	}, false},
	{"delete one element", func(t *testing.T, rng *rand.Rand) {
		g := kernelGeneration(t, "ip")
		set := g.of([]string{clusterIPsSet, ipKind.backends(TCP), noEndpointFrontendsSet, localEndpointsSet}[rng.IntN(4)])
		if elems := nftElements(t, "ip", set); len(elems) > 0 {
			nft(t, "delete element ip weir "+set+" { "+elems[rng.IntN(len(elems))]+" }")
		}
	}, true},
	{"a foreign element", func(t *testing.T, rng *rand.Rand) {
		g := kernelGeneration(t, "ip")
		nft(t, "add element ip weir "+g.of(ipKind.backends(TCP))+" { 10.96.77.77 . tcp . 80 . 0 : 10.244.9.9 . 8080 }",
			"add element ip weir "+g.of(clusterIPsSet)+" { 10.96.77.78 }")
	}, true},
	{"an element's value changed", func(t *testing.T, rng *rand.Rand) {
		set := kernelGeneration(t, "ip").of(ipKind.backends(TCP))
		if elems := nftElements(t, "ip", set); len(elems) > 0 {
			key, _, _ := strings.Cut(elems[rng.IntN(len(elems))], " : ")
			nft(t, "delete element ip weir "+set+" { "+key+" }", "add element ip weir "+set+" { "+key+" : 10.244.9.10 . 9090 }")
		}
	}, true},
	{"a rule deleted", func(t *testing.T, rng *rand.Rand) {
		out, err := exec.Command("nft", "-a", "list", "chain", "ip", "weir", "services").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list chain: %v: %s", err, out)
		}
		var handles []string
		for _, line := range strings.Split(string(out), "\n") {
			if _, h, ok := strings.Cut(line, "# handle "); ok && !strings.Contains(line, "chain ") {
				handles = append(handles, strings.TrimSpace(h))
			}
		}
		nft(t, "delete rule ip weir services handle "+handles[rng.IntN(len(handles))])
	}, false},
	{"a rule added", func(t *testing.T, rng *rand.Rand) {
		nft(t, "add rule ip weir services ip daddr 10.96.77.79 counter accept")
	}, false},
	{"an older agent's marker", func(t *testing.T, rng *rand.Rand) {
		m, ok := liveMarker(chainNames(t, "ip"))
		if !ok {
			t.Fatal("no marker")
		}
		nft(t, "delete chain ip weir "+m.name, "add chain ip weir "+m.gen.marker())
	}, false},
	{"delete elements", func(t *testing.T, rng *rand.Rand) {
		nft(t, "flush map ip weir "+kernelGeneration(t, "ip").of(ipKind.frontends))
	}, true},
}

// nftElements are the elements of a set or map of the family's table, as
// nft lists them.
func nftElements(t *testing.T, family, set string) []string {
	t.Helper()
	text, err := exec.Command("nft", "list", "set", family, "weir", set).Output()
	if err != nil {
		text, err = exec.Command("nft", "list", "map", family, "weir", set).Output()
	}
	if err != nil {
		t.Fatalf("nft list %s: %v", set, err)
	}
	body := string(text)
	start := strings.Index(body, "elements = {")
	if start < 0 {
		return nil
	}
	body = body[start+len("elements = {"):]
	body = body[:strings.Index(body, "}")]
	var elems []string
	for _, e := range strings.Split(body, ",") {
		if e = strings.TrimSpace(e); e != "" {
			elems = append(elems, e)
		}
	}
	return elems
}

// chainNames are the names of the family's table's chains.
func chainNames(t *testing.T, family string) []string {
	t.Helper()
	out, err := exec.Command("nft", "list", "chains", family).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list chains: %v: %s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "chain "); ok {
			names = append(names, strings.TrimSuffix(name, " {"))
		}
	}
	return names
}

// holdIdleFrontends fills the family's idle generation's frontends map and
// leaves a chain reading it: the next switch, which recreates that map,
// must not trip over it.
func holdIdleFrontends(t *testing.T, family string) {
	t.Helper()
	idle := kernelGeneration(t, family).other().of(ipKind.frontends)
	addr := map[string]string{"ip": "ipv4_addr", "ip6": "ipv6_addr"}[family]
	nft(t, "add map "+family+" weir "+idle+" { type "+addr+" . inet_proto . inet_service : verdict ; }",
		"add chain "+family+" weir stale_reader",
		"add rule "+family+" weir stale_reader "+family+" daddr . meta l4proto . th dport vmap @"+idle)
}

// kernelGeneration is the generation the family's services chain reads,
// from the kernel.
func kernelGeneration(t *testing.T, family string) generation {
	t.Helper()
	out, err := exec.Command("nft", "list", "chain", family, "weir", "services").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list chain %s weir services: %v: %s", family, err, out)
	}
	for _, g := range []generation{genA, genB} {
		if strings.Contains(string(out), g.ref(clusterIPsSet)+" ") {
			return g
		}
	}
	t.Fatalf("the %s services chain reads no generation:\n%s", family, out)
	return ""
}

func nft(t *testing.T, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := exec.Command("nft", c).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v: %s", c, err, out)
		}
	}
}

func removeTables(t *testing.T) {
	t.Helper()
	for _, f := range []string{"ip", "ip6"} {
		exec.Command("nft", "delete table "+f+" weir").Run()
	}
}

// canonicalTables is both tables as sorted lines of JSON, without handles,
// with elements sorted and generation names folded into one, so that two
// tables that forward alike compare equal.
func canonicalTables(t *testing.T) []string {
	t.Helper()
	fold := map[string]string{}
	for _, f := range []family{ipv4, ipv6} {
		for _, g := range []generation{genA, genB} {
			for _, obj := range tableSets(f, g) {
				name := setName(obj)
				fold[name] = strings.TrimSuffix(name, "_"+string(g)) + "_G"
				fold["@"+name] = "@" + fold[name]
			}
			fold[g.comment()] = "weir generation G"
			fold[g.marker()] = "generation_G"
			for _, k := range frontendKinds {
				fold[k.pickChain(g)] = strings.TrimSuffix(k.pickChain(g), "_"+string(g)) + "_G"
			}
		}
	}
	var lines []string
	for _, f := range []string{"ip", "ip6"} {
		out, err := exec.Command("nft", "--json", "list", "table", f, "weir").Output()
		if err != nil {
			t.Fatalf("nft list table %s weir: %v", f, err)
		}
		var doc struct {
			Nftables []map[string]any `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatal(err)
		}
		// The marker carries the digest of what nft wrote, the same
		// for both generations.
		for _, obj := range doc.Nftables {
			if c, ok := obj["chain"].(map[string]any); ok {
				if name, _ := c["name"].(string); isMarker(name) {
					fold[name] = "generation_G" + name[len("generation_a"):]
				}
			}
		}
		ruleIndex := map[string]int{}
		for _, obj := range doc.Nftables {
			for kind, body := range obj {
				if kind == "metainfo" {
					continue
				}
				m := normalize(body, fold).(map[string]any)
				if kind == "rule" {
					chain := m["chain"].(string)
					m["index"] = ruleIndex[chain]
					ruleIndex[chain]++
				}
				if elems, ok := m["elem"].([]any); ok {
					slices.SortFunc(elems, func(a, b any) int { return strings.Compare(jsonString(a), jsonString(b)) })
				}
				lines = append(lines, kind+" "+jsonString(m))
			}
		}
	}
	slices.Sort(lines)
	return lines
}

// normalize drops handles and folds generation names, recursively. It also
// reads every "<proto> dport" as "th dport": nft 1.0.6 adds a protocol
// match to a rule that DNATs through a map typed "tcp dport" depending on
// what it has cached when it parses the rule, and names the header after
// it. Every such rule matches only the frontends of its pick's set, keyed
// by the protocol, so the match never changes where a packet goes.
func normalize(v any, fold map[string]string) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			if k != "handle" {
				out[k] = normalize(x, fold)
			}
		}
		if out["field"] == "dport" && out["protocol"] != nil {
			out["protocol"] = "th"
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = normalize(x, fold)
		}
		return out
	case string:
		if f, ok := fold[v]; ok {
			return f
		}
		// The picks' sets come and go with the endpoint counts.
		return pickSetOfGeneration.ReplaceAllString(v, "${1}_G")
	}
	return v
}

var pickSetOfGeneration = regexp.MustCompile(`^(@?[a-z_]*_(?:endpoints|table)_[0-9]+)_[ab]$`)

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
