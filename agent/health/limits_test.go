package health

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
