package membership

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// freePort finds a port free for both TCP and UDP on loopback.
func freePort(t *testing.T) netip.AddrPort {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ap := netip.MustParseAddrPort(l.Addr().String())
		u, err := net.ListenPacket("udp", ap.String())
		l.Close()
		if err == nil {
			u.Close()
			return ap
		}
	}
	t.Fatal("no free port")
	return netip.AddrPort{}
}

// A member that dies without leaving is declared dead on the others; one
// that leaves is dropped at once; one that comes back is alive again.
func TestDeadMemberIsDetected(t *testing.T) {
	type event struct {
		name  string
		alive bool
		at    time.Time
	}
	var mu sync.Mutex
	var seen []event
	watcherAddr := freePort(t)
	watcher, err := Start(Config{Name: "speaker", Bind: watcherAddr, OnChange: func(n string, alive bool) {
		mu.Lock()
		seen = append(seen, event{n, alive, time.Now()})
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Leave()
	start := func(name string, bind netip.AddrPort) *Member {
		m, err := Start(Config{Name: name, Bind: bind, Join: []string{watcherAddr.String()}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	waitFor := func(name string, alive bool) time.Time {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			for i := len(seen) - 1; i >= 0; i-- {
				if seen[i].name == name {
					if seen[i].alive == alive {
						mu.Unlock()
						return seen[i].at
					}
					break
				}
			}
			mu.Unlock()
		}
		t.Fatalf("%s never became alive=%v; events %v", name, alive, seen)
		return time.Time{}
	}
	node1Addr := freePort(t)
	node1, node2 := start("node1", node1Addr), start("node2", freePort(t))
	defer node2.Leave()
	waitFor("node1", true)
	waitFor("node2", true)

	killed := time.Now()
	close(node1.stop)
	node1.ml.Shutdown() // no goodbye: a dead agent or a cut link
	t.Logf("dead member declared dead after %v", waitFor("node1", false).Sub(killed))

	node1 = start("node1", node1Addr) // restarted, on the same address

	waitFor("node1", true)
	left := time.Now()
	node1.Leave()
	t.Logf("leaving member dropped after %v", waitFor("node1", false).Sub(left))
	if got := watcher.Alive(); len(got) != 2 {
		t.Errorf("alive after node1 left: %v, want speaker and node2", got)
	}
}
