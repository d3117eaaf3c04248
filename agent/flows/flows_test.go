package flows

import (
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

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

func TestSetProgramsTheRoutes(t *testing.T) {
	inNewNetns(t, func() {
		run(t, "ip", "link", "set", "lo", "up")
		run(t, "ip", "link", "add", "lan", "up", "type", "veth", "peer", "name", "lan-peer")
		run(t, "ip", "link", "set", "lan-peer", "up")
		run(t, "ip", "addr", "add", "192.0.2.11/24", "dev", "lan")
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
