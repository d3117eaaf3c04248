package flows

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weirlb/weir/datapath"
)

// inNewNetns runs fn on a thread of its own in a new network namespace.
func inNewNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root")
		}
		t.Skip("needs root (network namespaces)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Error(err)
			return
		}
		fn()
	}()
	<-done
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	// The thread's namespace: /proc/thread-self/ns/net.
	out, err := exec.Command("nsenter", append([]string{"--net=/proc/" + strings.TrimSpace(tid()) + "/ns/net"}, args...)...).CombinedOutput()
	if err != nil {
		t.Errorf("%v: %v: %s", args, err, out)
	}
	return string(out)
}

func tid() string { return strconvItoa(os.Getpid()) + "/task/" + strconvItoa(unix.Gettid()) }

func strconvItoa(i int) string { return strings.TrimSpace(strings.Repeat(" ", 0) + itoa(i)) }

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// lanUp gives the namespace a LAN with node1's address, 192.0.2.11/24.
func lanUp(t *testing.T) {
	t.Helper()
	run(t, "ip", "link", "set", "lo", "up")
	run(t, "ip", "link", "add", "lan", "up", "type", "veth", "peer", "name", "lan-peer")
	run(t, "ip", "link", "set", "lan-peer", "up")
	run(t, "ip", "addr", "add", "192.0.2.11/24", "dev", "lan")
}

func TestSetProgramsTheRoutes(t *testing.T) {
	inNewNetns(t, func() {
		lanUp(t)
		f := New(Config{})
		node := datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::11")},
			FlowRing: 3, FlowPeers: []datapath.FlowPeer{{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("2001:db8::12")}}}}
		got, err := f.Set(node)
		if err != nil {
			t.Fatal(err)
		}
		if got.FlowRing != 3 || len(got.FlowPeers) != 1 {
			t.Errorf("node %+v", got)
		}
		t.Log(run(t, "ip", "rule"), run(t, "ip", "-6", "rule"), run(t, "ip", "route", "show", "table", "7449"), run(t, "ip", "-6", "route", "show", "table", "7449"), run(t, "ip", "-6", "neigh"))
	})
}

// Which next node moved packets go to, as the probes' answers come and go:
// a silent peer is passed over while another answers, one that answers
// again is taken back, and a node that hears no peer at all keeps its
// route (it cannot tell whether they or it are at fault). Every peer the
// probes ask has a forwarding entry on the device.
func TestProbesChooseTheNextNode(t *testing.T) {
	inNewNetns(t, func() {
		lanUp(t)
		peer := func(name, addr string) datapath.FlowPeer {
			return datapath.FlowPeer{Name: name, Addresses: []netip.Addr{netip.MustParseAddr(addr)}}
		}
		f := New(Config{})
		node := datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")},
			FlowRing: 4, FlowPeers: []datapath.FlowPeer{peer("node2", "192.0.2.12"), peer("node3", "192.0.2.13"), peer("node4", "192.0.2.14")}}
		if _, err := f.Set(node); err != nil {
			t.Fatal(err)
		}
		fdb := run(t, "bridge", "fdb", "show", "dev", DefaultInterface)
		for _, a := range []string{"192.0.2.12", "192.0.2.13", "192.0.2.14"} {
			if !strings.Contains(fdb, "dst "+a) {
				t.Errorf("no forwarding entry for the probes to %s:\n%s", a, fdb)
			}
		}
		t0 := time.Now()
		f.mu.Lock()
		f.started = t0
		f.mu.Unlock()
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		step := func(what string, now time.Duration, answering []string, wantNext string, wantPassed ...string) {
			t.Helper()
			for _, a := range answering {
				f.answered(netip.MustParseAddr(a), false, at(now-100*time.Millisecond))
			}
			f.judge(at(now))
			next, passed := f.sendingTo()
			if next != wantNext || !slices.Equal(passed, wantPassed) {
				t.Errorf("%s: next %s, passing over %v; want %s, passing over %v", what, next, passed, wantNext, wantPassed)
			}
		}
		step("every peer answers", 3*time.Second, []string{"192.0.2.12", "192.0.2.13", "192.0.2.14"}, "node2")
		step("node3 silent", 6*time.Second, []string{"192.0.2.12", "192.0.2.14"}, "node2", "node3")
		step("node2 silent too", 9*time.Second, []string{"192.0.2.14"}, "node4", "node2", "node3")
		step("no peer answers: nothing changes", 12*time.Second, nil, "node4", "node2", "node3")
		step("all answer again", 13*time.Second, []string{"192.0.2.12", "192.0.2.13", "192.0.2.14"}, "node2")
	})
}

// A packet marked for the next node never takes the main table, back to
// the router it came from, when the route to the next node is gone (its
// device deleted): it is dropped. Close takes the drop away too.
func TestMarkedPacketsNeverTakeTheMainTable(t *testing.T) {
	inNewNetns(t, func() {
		lanUp(t)
		run(t, "ip", "route", "add", "default", "via", "192.0.2.1", "dev", "lan")
		run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		f := New(Config{})
		node := datapath.NodeInfo{Name: "node1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")},
			FlowRing: 2, FlowPeers: []datapath.FlowPeer{{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}}}}
		if _, err := f.Set(node); err != nil {
			t.Fatal(err)
		}
		routeOf := func() string {
			out, _ := exec.Command("nsenter", "--net=/proc/"+strings.TrimSpace(tid())+"/ns/net", "ip", "route", "get", "203.0.113.10", "from", "198.51.100.2", "iif", "lan", "mark", "0x80").CombinedOutput()
			return string(out)
		}
		if got := routeOf(); !strings.Contains(got, "dev "+DefaultInterface) {
			t.Errorf("a marked packet goes %q; want the device", got)
		}
		run(t, "ip", "link", "del", DefaultInterface)
		if got := routeOf(); strings.Contains(got, "dev lan") || strings.Contains(got, "via 192.0.2.1") {
			t.Errorf("with the device gone, a marked packet goes %q: back to the router", got)
		}
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := run(t, "ip", "route", "show", "table", "all", "type", "blackhole"); strings.TrimSpace(got) != "" {
			t.Errorf("after Close: %q left", got)
		}
	})
}
