package health

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Health answers are one small request from a prober; nothing legitimate
// holds a connection long. These bounds keep connections that send nothing
// (half-open, slow) from piling up until the agent runs out of file
// descriptors, which would stop its applies and fail its own /healthz.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 10 * time.Second
	idleTimeout       = 30 * time.Second
	maxHeaderBytes    = 8 << 10

	// MaxServiceConnections is how many connections every health-check
	// node port together may hold; more wait in the kernel's backlog.
	MaxServiceConnections = 512
	// MaxNodeConnections bounds /healthz, /livez and /metrics likewise.
	MaxNodeConnections = 128
	// MaxConnectionsPerSource is how many of those one source address may
	// hold at once; past it, its new connections are closed at once, so
	// that one host holding slow connections cannot starve every
	// load balancer's probes.
	MaxConnectionsPerSource = 16
)

// NewHTTPServer is an HTTP server for health answers, with the timeouts
// above.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes}
}

// ConnLimit bounds the connections open across any number of listeners,
// in all and per source address.
type ConnLimit struct {
	slots     chan struct{}
	perSource int

	mu       sync.Mutex // guards bySource
	bySource map[netip.Addr]int
}

func NewConnLimit(n int) *ConnLimit { return newConnLimit(n, MaxConnectionsPerSource) }

func newConnLimit(n, perSource int) *ConnLimit {
	return &ConnLimit{slots: make(chan struct{}, n), perSource: perSource, bySource: map[netip.Addr]int{}}
}

// take counts a connection from src; false when src holds its share.
func (l *ConnLimit) take(src netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src] >= l.perSource {
		return false
	}
	l.bySource[src]++
	return true
}

func (l *ConnLimit) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// Listen wraps ln: Accept waits for a free slot first, so at the limit new
// connections stay in the kernel's backlog instead of taking descriptors.
func (l *ConnLimit) Listen(ln net.Listener) net.Listener { return &limitedListener{ln, l} }

type limitedListener struct {
	net.Listener
	limit *ConnLimit
}

func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		ln.limit.slots <- struct{}{}
		c, err := ln.Listener.Accept()
		if err != nil {
			<-ln.limit.slots
			return nil, err
		}
		src := sourceOf(c)
		if !ln.limit.take(src) {
			c.Close()
			<-ln.limit.slots
			continue
		}
		return &limitedConn{Conn: c, release: func() {
			ln.limit.release(src)
			<-ln.limit.slots
		}}, nil
	}
}

// sourceOf is a connection's remote address (IPv4 as IPv4).
func sourceOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
