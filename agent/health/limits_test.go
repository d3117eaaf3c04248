package health

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// A connection that sends nothing is closed by the health-check port after
// the header timeout, and the port keeps answering while connections wait
// for a slot.
func TestHealthCheckPortsCloseSilentConnections(t *testing.T) {
	s := NewServices(func() bool { return true }, slog.New(slog.DiscardHandler), nil)
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

// The limit holds across listeners: beyond it, connections wait in the
// backlog and are accepted as others close.
func TestConnLimitIsSharedByItsListeners(t *testing.T) {
	limit := NewConnLimit(2)
	var accepted atomic.Int32
	var conns = make(chan net.Conn, 10)
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
		lim := limit.Listen(ln)
		go func() {
			for {
				c, err := lim.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				conns <- c
			}
		}()
	}
	for i := range 4 {
		c, err := net.Dial("tcp", addrs[i%2])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The two slots fill, then nothing more is accepted while they are held.
	deadline := time.Now().Add(5 * time.Second)
	for accepted.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections accepted across the two listeners; want the limit, 2", n)
	}
	(<-conns).Close()
	deadline = time.Now().Add(5 * time.Second)
	for accepted.Load() != 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := accepted.Load(); n != 3 {
		t.Errorf("after one closed, %d accepted; want 3", n)
	}
}

// One host holding more silent connections than there are slots does not
// keep another host's probes from being accepted at once: past its share,
// its connections are closed as they come.
func TestOneSourceCannotStarveTheProbes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lim := newConnLimit(8, 2).Listen(ln)
	accepted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := lim.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	from := func(src string) net.Conn {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}).Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range 20 {
		from("127.0.0.2") // silent, held open
	}
	probe := netip.MustParseAddr("127.0.0.3")
	for i := range 3 {
		from(probe.String())
		for found := false; !found; {
			select {
			case c := <-accepted:
				// A probe is answered and closed; the flood's stay open.
				if found = sourceOf(c) == probe; found {
					c.Close()
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("probe %d from another host not accepted while one host floods", i)
			}
		}
	}
	l := lim.(*limitedListener).limit
	l.mu.Lock()
	defer l.mu.Unlock()
	if held := l.bySource[netip.MustParseAddr("127.0.0.2")]; held != 2 {
		t.Errorf("the flooding host holds %d connections; want its share, 2", held)
	}
}
