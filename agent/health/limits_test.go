package health

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weirlb/weir/test/connflood"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
)

// A connection that sends nothing is closed by the health-check port after
// the header timeout, and the port keeps answering meanwhile.
func TestHealthCheckPortsCloseSilentConnections(t *testing.T) {
	s := NewServices(func() bool { return true }, ServiceLimits, slog.New(slog.DiscardHandler), nil)
	defer s.Close()
	port := freePort(t)
	s.Sync(loopback, []Service{{Namespace: "shop", Name: "cart", Port: port, LocalReady: 1}})
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(readHeaderTimeout + 5*time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a silent connection got bytes")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a silent connection was still open after %s", time.Since(start).Round(time.Second))
	}
	if got := get(t, port, "/"); got.code != http.StatusOK {
		t.Errorf("after the silent connection: %d", got.code)
	}
}

// What a full limit, or a source past its share, closes to make room for a
// new connection: never a connection of a source holding fewer than the
// newcomer's.
func TestConnLimitMakesRoomFromTheSourceHoldingMost(t *testing.T) {
	small := Limits{Connections: 4, PerSource: 2, IPv4Prefix: 32, IPv6Prefix: 64}
	const a, b, c, d, e = "192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"
	// held are the connections held, in the order their state last
	// changed; an "!" after the address marks one answering a request.
	for _, tc := range []struct {
		name   string
		limits Limits
		held   []string
		from   string
		want   string // "admitted", "refused" or "closes N" (of held)
	}{
		{"room left", small, []string{a, b}, c, "admitted"},
		{"a source past its share gives up its own longest waiting", small, []string{a, b, a}, a, "closes 0"},
		{"a connection answering a request is closed last", small, []string{a + "!", a}, a, "closes 1"},
		{"a source's only connection, answering, when it opens one more", Limits{Connections: 4, PerSource: 1, IPv4Prefix: 32, IPv6Prefix: 64},
			[]string{a + "!", b}, a, "closes 0"},
		{"full: a source holding fewer takes the place of one of the source holding most", small, []string{b, a, a, c}, d, "closes 1"},
		{"full: among sources holding as many, the longest waiting goes", Limits{Connections: 4, PerSource: 1, IPv4Prefix: 32, IPv6Prefix: 64},
			[]string{a, b, c, d}, e, "closes 0"},
		{"full: a waiting connection goes before an answering one", small, []string{a + "!", a, b, c}, d, "closes 1"},
		{"full: a source holding as many as any is refused", Limits{Connections: 4, PerSource: 3, IPv4Prefix: 32, IPv6Prefix: 64},
			[]string{a, a, b, b}, b, "refused"},
		{"addresses of one IPv6 /64 are one source", small, []string{"2001:db8::1", "2001:db8::2"}, "2001:db8::ff:1", "closes 0"},
		{"another /64 is another source", small, []string{"2001:db8::1", "2001:db8::2"}, "2001:db8:0:1::1", "admitted"},
		{"IPv4 addresses are sources of their own", small, []string{a, b}, c, "admitted"},
		{"an IPv4 prefix makes its addresses one source", Limits{Connections: 4, PerSource: 2, IPv4Prefix: 24, IPv6Prefix: 64},
			[]string{a, b}, c, "closes 0"},
		{"IPv4-mapped IPv6 is IPv4", small, []string{a, a}, "::ffff:" + a, "closes 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewConnLimit("test", tc.limits)
			var held []*limitedConn
			for _, h := range tc.held {
				addr, active := strings.CutSuffix(h, "!")
				a := netip.MustParseAddr(addr)
				c := &limitedConn{limit: l, addr: a, source: l.source(a), active: active, since: l.tick()}
				l.held++
				l.bySource[c.source] = append(l.bySource[c.source], c)
				held = append(held, c)
			}
			newcomer := &limitedConn{limit: l, addr: netip.MustParseAddr(tc.from).Unmap()}
			victim, ok := l.admit(newcomer)
			got := "admitted"
			switch {
			case !ok:
				got = "refused"
			case victim != nil:
				for i, c := range held {
					if c == victim {
						got = fmt.Sprintf("closes %d", i)
					}
				}
			}
			if got != tc.want {
				t.Errorf("a connection from %s to %v: %s, want %s", tc.from, tc.held, got, tc.want)
			}
			total := 0
			for _, conns := range l.bySource {
				total += len(conns)
			}
			if total != l.held || l.held > tc.limits.Connections || len(l.bySource[newcomer.source]) > tc.limits.PerSource {
				t.Errorf("after it, %d held (%d by source); want at most %d, %d a source", l.held, total, tc.limits.Connections, tc.limits.PerSource)
			}
		})
	}
}

// An address answered lately is a source of its own, not one address of
// its /64: a prober keeps its share when another host of its /64 floods.
// A /64 has at most knownPerPrefix known addresses, and an address is
// known for knownFor after its last answer.
func TestKnownAddressesAreSourcesOfTheirOwn(t *testing.T) {
	l := NewConnLimit("test", Limits{Connections: 8, PerSource: 2, IPv4Prefix: 32, IPv6Prefix: 64})
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	conn := func(addr string) (victim *limitedConn, ok bool) {
		return l.admit(&limitedConn{limit: l, addr: netip.MustParseAddr(addr)})
	}
	conn("2001:db8::1")
	conn("2001:db8::2") // the /64 holds its share
	l.answered(netip.MustParseAddr("2001:db8::9"))
	if victim, ok := conn("2001:db8::9"); !ok || victim != nil {
		t.Errorf("a known address of a /64 at its share: closes %v, admitted %v; want admitted, nothing closed", victim != nil, ok)
	}
	now = now.Add(knownFor)
	if victim, ok := conn("2001:db8::9"); !ok || victim == nil || victim.source != netip.MustParsePrefix("2001:db8::/64") {
		t.Errorf("%s after its last answer: closes %v, admitted %v; want one of its /64's closed for it", knownFor, victim, ok)
	}

	for i := range knownPerPrefix + 1 {
		l.answered(netip.MustParseAddr(fmt.Sprintf("2001:db8::1:%x", i)))
	}
	if _, ok := l.known[netip.MustParseAddr(fmt.Sprintf("2001:db8::1:%x", knownPerPrefix))]; ok || len(l.known) != knownPerPrefix {
		t.Errorf("%d addresses of one /64 known; want at most %d", len(l.known), knownPerPrefix)
	}
	now = now.Add(knownFor)
	l.answered(netip.MustParseAddr("2001:db8::2:1"))
	if _, ok := l.known[netip.MustParseAddr("2001:db8::2:1")]; !ok || len(l.known) != 1 {
		t.Errorf("after %s, %d known; want the stale ones forgotten and the new one known", knownFor, len(l.known))
	}
	// IPv4 addresses are sources of their own already (the /32 default):
	// they take no room in the table.
	l.answered(netip.MustParseAddr("192.0.2.1"))
	if len(l.known) != 1 {
		t.Errorf("an IPv4 address of a /32 source taken into the table")
	}
}

// The limits are shared by every listener of a ConnLimit: making room
// closes the connection of the source holding most, whichever listener it
// came in on, and the closes are counted.
func TestConnLimitIsSharedByItsListeners(t *testing.T) {
	limit := NewConnLimit("test", Limits{Connections: 3, PerSource: 2, IPv4Prefix: 32, IPv6Prefix: 64})
	var lns []netip.AddrPort
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns = append(lns, netip.MustParseAddrPort(ln.Addr().String()))
		lim := limit.Listen(ln)
		go func() {
			for {
				if _, err := lim.Accept(); err != nil {
					return
				}
			}
		}()
	}
	// closed says whether the agent closed c.
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		ne, ok := err.(net.Error)
		return err != nil && !(ok && ne.Timeout())
	}
	dial := func(from string, ln int) net.Conn {
		c, err := connflood.Dial(context.Background(), netip.MustParseAddr(from), lns[ln])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	conn := func(from string, ln int) net.Conn {
		c := dial(from, ln)
		wait.Until(t, 5*time.Second, "the connection is counted", func() bool {
			limit.mu.Lock()
			defer limit.mu.Unlock()
			for _, conns := range limit.bySource {
				for _, h := range conns {
					if h.RemoteAddr().String() == c.LocalAddr().String() {
						return true
					}
				}
			}
			return false
		})
		return c
	}
	a1, a2, b1 := conn("127.0.0.2", 0), conn("127.0.0.2", 1), conn("127.0.0.3", 0)
	b2 := conn("127.0.0.3", 1) // full: 127.0.0.2 holds most
	if !closed(a1) || closed(a2) || closed(b1) {
		t.Errorf("full, a second connection from another source: closed %v %v %v; want the first source's oldest (on the other listener) only", closed(a1), closed(a2), closed(b1))
	}
	c1 := conn("127.0.0.4", 1) // full: both hold 1 and 2; 127.0.0.3 most
	if !closed(b1) || closed(b2) || closed(a2) || closed(c1) {
		t.Errorf("full, a third source: closed %v %v %v %v; want the second source's oldest only", closed(b1), closed(b2), closed(a2), closed(c1))
	}
	// Full, and every source holds one: a second from any is refused.
	if c2 := dial("127.0.0.4", 0); !closed(c2) || closed(a2) || closed(b2) || closed(c1) {
		t.Errorf("full, one more from a source holding as many as any: closed %v %v %v %v; want it only", closed(c2), closed(a2), closed(b2), closed(c1))
	}
	want := `
# HELP weir_health_connections_closed_total Connections the agent's health listener closed to keep within its limits, by reason: source_share (its source opened one more past its share), evicted (the listener was full and a source holding fewer connected), refused (the listener was full and its source held as many as any).
# TYPE weir_health_connections_closed_total counter
weir_health_connections_closed_total{listener="test",reason="evicted"} 2
weir_health_connections_closed_total{listener="test",reason="refused"} 1
weir_health_connections_closed_total{listener="test",reason="source_share"} 0
`
	if err := testutil.CollectAndCompare(limit, strings.NewReader(want), "weir_health_connections_closed_total"); err != nil {
		t.Error(err)
	}
}

func addrs(first string, n int) []netip.Addr {
	a := netip.MustParseAddr(first)
	var out []netip.Addr
	for range n {
		out = append(out, a)
		a = a.Next()
	}
	return out
}

// A load balancer's prober is answered within its timeout, every time, on
// the health-check node ports and on /healthz, while one attacker holds as
// many connections as it can from 40 IPv4 addresses and 40 addresses of
// one IPv6 /64, the prober's own /64 or another: one host must not be able
// to make the node look unhealthy.
func TestProbesAreAnsweredWhileManySourcesHoldConnections(t *testing.T) {
	const probeTimeout = 2 * time.Second // HAProxy's default check timeout (its 2 s interval); cloud balancers allow 5 s
	for _, tc := range []struct {
		name     string
		netns    bool
		server   []netip.Addr
		attacker []netip.Addr
		probers  []netip.Addr
	}{
		{name: "IPv4", server: addrs("127.0.0.1", 1), attacker: addrs("127.0.1.1", 40), probers: addrs("127.0.0.2", 1)},
		// The probers: one in another /64, one in the attacker's own (a
		// load balancer on the node network shares its /64).
		{name: "IPv4 and an IPv6 /64", netns: true, server: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("fd00:64::1")},
			attacker: append(addrs("127.0.1.1", 40), addrs("fd00:64::1:0", 40)...),
			probers:  []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("fd00:65::2"), netip.MustParseAddr("fd00:64::2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The flood and the prober each dial from a thread of their
			// own, as from hosts of their own.
			flood, probe, listen := connflood.Dial, connflood.Dial, func(fn func()) { fn() }
			if tc.netns {
				ns := testNetns(t, tc.server, tc.attacker, tc.probers)
				var threads [2]*lab.Thread
				for i := range threads {
					th, err := ns.Thread()
					if err != nil {
						t.Fatal(err)
					}
					defer th.Close()
					threads[i] = th
				}
				flood, probe, listen = threads[0].DialFrom, threads[1].DialFrom, threads[1].Do
			}
			// The health-check node ports and /healthz, as the agent
			// serves them.
			s := NewServices(func() bool { return true }, ServiceLimits, slog.New(slog.DiscardHandler), nil)
			defer s.Close()
			node := NewNode(time.Minute, nil)
			node.Updated()
			nodeLimit := NewConnLimit("healthz", NodeLimits)
			srv := nodeLimit.Server(node.Handler())
			defer srv.Close()
			ports := distinctPorts(t, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), 2)
			hcPort, healthzPort := ports[0], ports[1]
			var targets []netip.AddrPort
			var err error
			listen(func() {
				if r := s.Sync(tc.server, []Service{{Namespace: "shop", Name: "cart", Port: hcPort, LocalReady: 1}}); r["shop/cart"].Err != nil {
					err = r["shop/cart"].Err
					return
				}
				for _, a := range tc.server {
					var ln net.Listener
					if ln, err = net.Listen("tcp", netip.AddrPortFrom(a, healthzPort).String()); err != nil {
						return
					}
					go srv.Serve(nodeLimit.Listen(ln))
					targets = append(targets, netip.AddrPortFrom(a, hcPort), netip.AddrPortFrom(a, healthzPort))
				}
			})
			if err != nil {
				t.Fatal(err)
			}

			// Every prober asks each of its family's ports, as it did
			// before the flood began.
			type prober struct {
				from   netip.Addr
				client *http.Client
				urls   []string
			}
			var probers []prober
			for _, from := range tc.probers {
				p := prober{from: from, client: &http.Client{Timeout: probeTimeout, Transport: &http.Transport{DisableKeepAlives: true,
					DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
						return probe(ctx, from, netip.MustParseAddrPort(addr))
					}}}}
				for _, to := range targets {
					if to.Addr().Is4() == from.Is4() {
						p.urls = append(p.urls, fmt.Sprintf("http://%s/healthz", to))
					}
				}
				if r := connflood.Probe(p.client, p.urls, 1, http.StatusOK); r.Answered != r.Asked {
					t.Fatalf("from %s before the flood: %s", from, strings.Join(r.Failures, "; "))
				}
				probers = append(probers, p)
			}

			f := connflood.Start(flood, tc.attacker, targets, ServiceLimits.PerSource+1)
			defer f.Stop()
			wait.Until(t, 30*time.Second, "every connection of the flood opened once", func() bool { return f.Connected() == f.Slots() })
			time.Sleep(500 * time.Millisecond) // the agent takes what it will of them

			for _, p := range probers {
				r := connflood.Probe(p.client, p.urls, 50, http.StatusOK)
				t.Logf("from %s: %d of %d probes answered within %s, the slowest in %s; the flood held %d connection slots",
					p.from, r.Answered, r.Asked, probeTimeout, r.Slowest.Round(time.Millisecond), f.Slots())
				if r.Answered != r.Asked {
					t.Errorf("from %s: %d of %d probes unanswered within %s while one host held connections open: %s",
						p.from, r.Asked-r.Answered, r.Asked, probeTimeout, strings.Join(r.Failures, "; "))
				}
			}
		})
	}
}

// testNetns makes a network namespace whose loopback holds every address
// given, removed when the test ends.
func testNetns(t *testing.T, addrSets ...[]netip.Addr) *lab.Netns {
	t.Helper()
	lab.RequireRoot(t, "health", "a network namespace with an IPv6 /64 on its loopback", "ip")
	name := fmt.Sprintf("weir-hc-%d", os.Getpid()%100000)
	exec.Command("ip", "netns", "del", name).Run() // left by a run killed before its cleanup
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	cmds := []string{"link set lo up"}
	for _, set := range addrSets {
		for _, a := range set {
			if a.Is6() {
				cmds = append(cmds, fmt.Sprintf("addr add %s/128 dev lo nodad", a))
			}
		}
	}
	cmd := exec.Command("ip", "-n", name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s -batch: %v: %s", name, err, out)
	}
	return &lab.Netns{Name: name}
}
