package webhook

import (
	"net"
	"net/netip"
	"sync"
)

// connLimit bounds the connections a listener holds, in all and per
// source address.
type connLimit struct {
	slots     chan struct{} // one token per open connection
	perSource int

	mu       sync.Mutex // guards bySource
	bySource map[netip.Addr]int
}

func newConnLimit(total, perSource int) *connLimit {
	return &connLimit{slots: make(chan struct{}, total), perSource: perSource, bySource: map[netip.Addr]int{}}
}

// listen wraps ln. Accept waits for a free slot before it accepts, so past
// the total new connections wait in the kernel's backlog and take nothing
// of the process; a connection from a source that holds its share is
// closed at once.
func (l *connLimit) listen(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, limit: l}
}

// take counts a connection from src; false when src holds its share.
func (l *connLimit) take(src netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src] >= l.perSource {
		return false
	}
	l.bySource[src]++
	return true
}

func (l *connLimit) release(src netip.Addr) {
	l.mu.Lock()
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
	l.mu.Unlock()
	<-l.slots
}

type limitedListener struct {
	net.Listener
	limit *connLimit
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
		return &limitedConn{Conn: c, release: func() { ln.limit.release(src) }}, nil
	}
}

// sourceOf is a connection's remote address, IPv4 as IPv4.
func sourceOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// limitedConn gives its slot back at its first Close.
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
