package l2

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"go.uber.org/goleak"

	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
)

var (
	vip4 = netip.MustParseAddr("192.0.2.50")
	vip6 = netip.MustParseAddr("fd00:2::50")
)

// segment is one L2 segment without a router: a bridge, two node
// interfaces (n1, n2, in the nodes' namespace, where the responders run)
// and a client (c0, in its own namespace) that resolves addresses with
// its kernel, as a real host does.
type segment struct {
	nodes, client *lab.Netns
	mac           map[string]string // by interface
}

func newSegment(t *testing.T) *segment {
	t.Helper()
	lab.SkipUnlessPrivileged(t)
	id := fmt.Sprintf("%d", os.Getpid()%100000)
	s := &segment{nodes: &lab.Netns{Name: "weir-l2n-" + id}, client: &lab.Netns{Name: "weir-l2c-" + id}, mac: map[string]string{}}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []*lab.Netns{s.nodes, s.client} {
		exec.Command("ip", "netns", "del", ns.Name).Run() // a run killed before its cleanup
		run("ip", "netns", "add", ns.Name)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns.Name).Run() })
		// Addresses usable at once: no duplicate address detection.
		run("ip", "netns", "exec", ns.Name, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	n, c := s.nodes.Name, s.client.Name
	run("ip", "-n", n, "link", "add", "br0", "type", "bridge")
	run("ip", "-n", n, "link", "set", "br0", "up")
	for i, name := range []string{"n1", "n2"} {
		run("ip", "-n", n, "link", "add", name, "type", "veth", "peer", "name", name+"p")
		run("ip", "-n", n, "link", "set", name+"p", "master", "br0", "up")
		run("ip", "-n", n, "addr", "add", fmt.Sprintf("192.0.2.%d/24", 11+i), "dev", name)
		run("ip", "-n", n, "addr", "add", fmt.Sprintf("fd00:2::%d/64", 11+i), "dev", name, "nodad")
		run("ip", "-n", n, "link", "set", name, "up")
	}
	run("ip", "-n", n, "link", "add", "c0p", "type", "veth", "peer", "name", "c0", "netns", c)
	run("ip", "-n", n, "link", "set", "c0p", "master", "br0", "up")
	run("ip", "-n", c, "addr", "add", "192.0.2.100/24", "dev", "c0")
	run("ip", "-n", c, "addr", "add", "fd00:2::100/64", "dev", "c0", "nodad")
	run("ip", "-n", c, "link", "set", "c0", "up")
	for _, name := range []string{"n1", "n2"} {
		out, err := exec.Command("ip", "-n", n, "-j", "link", "show", name).Output()
		var links []struct{ Address string }
		if err != nil || json.Unmarshal(out, &links) != nil || len(links) != 1 {
			t.Fatalf("the MAC address of %s: %v: %s", name, err, out)
		}
		s.mac[name] = links[0].Address
	}
	// Link-local addresses (the NDP sockets' source) are there once the
	// links are up.
	wait.Until(t, 10*time.Second, "link-local addresses on the node interfaces", func() bool {
		out, _ := exec.Command("ip", "-n", n, "-6", "addr", "show", "scope", "link").Output()
		return strings.Count(string(out), "fe80::") >= 2
	})
	return s
}

// responder starts a Responder whose sockets live in the nodes' namespace.
func (s *segment) responder(t *testing.T) *Responder {
	t.Helper()
	r := New(slog.New(slog.DiscardHandler))
	t.Cleanup(r.Close)
	return r
}

// set gives r what it owns, from inside the nodes' namespace.
func (s *segment) set(t *testing.T, r *Responder, owned Owned) {
	t.Helper()
	if err := s.nodes.Do(func() error { return r.Set(owned) }); err != nil {
		t.Fatal(err)
	}
}

// resolve has the client's kernel resolve a (it sends a datagram there)
// and returns the MAC its neighbour table then holds for it, or "" when
// the resolution failed.
func (s *segment) resolve(t *testing.T, a netip.Addr) string {
	t.Helper()
	err := s.client.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 9)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("who has it"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var mac string
	wait.Until(t, 10*time.Second, "the client's kernel resolves "+a.String(), func() bool {
		var failed bool
		mac, failed = s.neighbour(t, a)
		return mac != "" || failed
	})
	return mac
}

// neighbour is the MAC the client's neighbour table holds for a, and
// whether its resolution failed.
func (s *segment) neighbour(t *testing.T, a netip.Addr) (mac string, failed bool) {
	t.Helper()
	out, err := s.client.Run(context.Background(), "ip", "-j", "neigh", "show", a.String(), "dev", "c0")
	if err != nil {
		t.Fatal(err)
	}
	var entries []struct {
		Lladdr string
		State  []string
	}
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("ip -j neigh: %v: %s", err, out)
	}
	for _, e := range entries {
		if containsAny(e.State, "FAILED") {
			return "", true
		}
		if e.Lladdr != "" && !containsAny(e.State, "INCOMPLETE") {
			return e.Lladdr, false
		}
	}
	return "", false
}

func containsAny(list []string, of ...string) bool {
	for _, x := range list {
		for _, y := range of {
			if x == y {
				return true
			}
		}
	}
	return false
}

// The owner answers ARP and NDP for its addresses, on its interface only,
// with its MAC; a takeover moves the client's cached entry without the
// client asking again; the old owner is silent from the moment it lost
// the address.
func TestTheOwnerAnswersAndATakeoverMovesTheClients(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // after the responders close
	s := newSegment(t)
	r1, r2 := s.responder(t), s.responder(t)
	s.set(t, r2, Owned{}) // a node that owns nothing answers nothing

	if mac := s.resolve(t, vip4); mac != "" {
		t.Fatalf("%s resolved to %s with no owner", vip4, mac)
	}
	s.set(t, r1, Owned{vip4: {"n1"}, vip6: {"n1"}})
	for _, a := range []netip.Addr{vip4, vip6} {
		if mac := s.resolve(t, a); mac != s.mac["n1"] {
			t.Fatalf("the client resolved %s to %q; want n1's %s", a, mac, s.mac["n1"])
		}
	}

	// Takeover: n1 loses the addresses, n2 takes them. The client sends
	// nothing: the announcements move its entries.
	s.set(t, r1, Owned{})
	s.set(t, r2, Owned{vip4: {"n2"}, vip6: {"n2"}})
	for _, a := range []netip.Addr{vip4, vip6} {
		wait.Until(t, 10*time.Second, fmt.Sprintf("the client's entry for %s moves to n2 (%s)", a, s.mac["n2"]), func() bool {
			mac, _ := s.neighbour(t, a)
			return mac == s.mac["n2"]
		})
	}

	// Only n2 answers now: every ARP reply for the address the client
	// sees, asked anew, is from n2.
	var replies []string
	err := s.client.Do(func() error {
		ifi, err := net.InterfaceByName("c0")
		if err != nil {
			return err
		}
		c, err := arp.Dial(ifi)
		if err != nil {
			return err
		}
		defer c.Close()
		for range 3 {
			if err := c.Request(vip4); err != nil {
				return err
			}
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		for {
			p, _, err := c.Read()
			if err != nil {
				return nil // the deadline: the capture is over
			}
			if p.Operation == arp.OperationReply && p.SenderIP == vip4 {
				replies = append(replies, p.SenderHardwareAddr.String())
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) == 0 {
		t.Fatalf("no ARP reply for %s after the takeover", vip4)
	}
	for _, mac := range replies {
		if mac != s.mac["n2"] {
			t.Fatalf("ARP replies for %s after the takeover came from %v; want n2's %s alone", vip4, replies, s.mac["n2"])
		}
	}
}

// An interface the node does not have is a clear error naming it, and
// the addresses on the node's other interfaces are still answered.
func TestAMissingInterfaceIsNamed(t *testing.T) {
	s := newSegment(t)
	r := s.responder(t)
	err := s.nodes.Do(func() error { return r.Set(Owned{vip4: {"n1", "eth9"}}) })
	if err == nil || !strings.Contains(err.Error(), `"eth9"`) {
		t.Fatalf("Set with a missing interface: %v; want an error naming eth9", err)
	}
	if mac := s.resolve(t, vip4); mac != s.mac["n1"] {
		t.Fatalf("the client resolved %s to %q; want n1's %s", vip4, mac, s.mac["n1"])
	}
}

// An address given on two interfaces at once is announced on both, every
// time: each interface's announcements run on their own.
func TestAnAddressOnTwoInterfacesIsAnnouncedOnBoth(t *testing.T) {
	s := newSegment(t)
	r := s.responder(t)
	var c *arp.Client
	if err := s.client.Do(func() error {
		ifi, err := net.InterfaceByName("c0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s.set(t, r, Owned{vip4: {"n1", "n2"}})
	// The announcements at 0, 0.25 and 1.1 s.
	c.SetReadDeadline(time.Now().Add(Announcements[2] + 500*time.Millisecond))
	seen := map[string]int{}
	for {
		p, _, err := c.Read()
		if err != nil {
			break
		}
		if p.Operation == arp.OperationReply && p.SenderIP == vip4 && p.TargetIP == vip4 {
			seen[p.SenderHardwareAddr.String()]++
		}
	}
	for _, n := range []string{"n1", "n2"} {
		if seen[s.mac[n]] < 3 {
			t.Errorf("%s announced %s %d times in the first %v; want 3 (seen: %v)", n, vip4, seen[s.mac[n]], Announcements[2], seen)
		}
	}
}

// An address whose lease no longer runs is not answered, even while the
// owner's timer has not yet taken it away (a loaded node).
func TestNoAnswerPastTheLease(t *testing.T) {
	s := newSegment(t)
	r := s.responder(t)
	var valid atomic.Bool
	r.Valid(func(netip.Addr) bool { return valid.Load() })
	s.set(t, r, Owned{vip4: {"n1"}})
	if mac := s.resolve(t, vip4); mac != "" {
		t.Fatalf("the client resolved %s to %s past the lease", vip4, mac)
	}
	valid.Store(true)
	if mac := s.resolve(t, vip4); mac != s.mac["n1"] {
		t.Fatalf("the client resolved %s to %q within the lease; want n1's %s", vip4, mac, s.mac["n1"])
	}
}
