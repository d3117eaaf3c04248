package health

import (
	"net"
	"net/http"
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
)

// NewHTTPServer is an HTTP server for health answers, with the timeouts
// above.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes}
}

// ConnLimit bounds the connections open across any number of listeners.
type ConnLimit struct{ slots chan struct{} }

func NewConnLimit(n int) *ConnLimit { return &ConnLimit{slots: make(chan struct{}, n)} }

// Listen wraps ln: Accept waits for a free slot first, so at the limit new
// connections stay in the kernel's backlog instead of taking descriptors.
func (l *ConnLimit) Listen(ln net.Listener) net.Listener { return &limitedListener{ln, l} }

type limitedListener struct {
	net.Listener
	limit *ConnLimit
}

func (ln *limitedListener) Accept() (net.Conn, error) {
	ln.limit.slots <- struct{}{}
	c, err := ln.Listener.Accept()
	if err != nil {
		<-ln.limit.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-ln.limit.slots }}, nil
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
