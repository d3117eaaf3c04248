// Package connflood holds connections open against a server from many
// source addresses, as a host that means to use up the server's
// connection limits does (each connection silent, half way through an
// HTTP request, or idle after one answered, and opened again whenever the
// server closes it), and probes the server meanwhile as a load balancer
// does.
package connflood

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DialFunc opens a TCP connection to to from the local address from.
type DialFunc func(ctx context.Context, from netip.Addr, to netip.AddrPort) (net.Conn, error)

// Dial is a DialFunc in the caller's network namespace.
func Dial(ctx context.Context, from netip.Addr, to netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
	return d.DialContext(ctx, "tcp", to.String())
}

// Flood is a set of connections being held open.
type Flood struct {
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	slots     int
	connected atomic.Int64
}

// Start holds perTarget connections from every address of from to every
// target of its family, until Stop.
func Start(dial DialFunc, from []netip.Addr, targets []netip.AddrPort, perTarget int) *Flood {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Flood{cancel: cancel}
	for _, src := range from {
		for _, dst := range targets {
			if src.Is4() != dst.Addr().Unmap().Is4() {
				continue
			}
			for i := range perTarget {
				f.slots++
				f.wg.Add(1)
				go func() {
					defer f.wg.Done()
					f.hold(ctx, dial, src, dst, i%3)
				}()
			}
		}
	}
	return f
}

// Slots is how many connections the flood holds when the server lets it.
func (f *Flood) Slots() int { return f.slots }

// Connected is how many of its slots connected at least once.
func (f *Flood) Connected() int { return int(f.connected.Load()) }

// Stop closes every connection and waits for the flood to end.
func (f *Flood) Stop() {
	f.cancel()
	f.wg.Wait()
}

// requests are what a connection sends, by kind: nothing, the start of a
// request, a whole one.
var requests = []string{"", "GET / HTTP/1.1\r\nHost: node\r\n", "GET / HTTP/1.1\r\nHost: node\r\n\r\n"}

// hold keeps one connection open from src to dst, sending requests[kind].
func (f *Flood) hold(ctx context.Context, dial DialFunc, src netip.Addr, dst netip.AddrPort, kind int) {
	first := true
	for ctx.Err() == nil {
		if c, err := dial(ctx, src, dst); err == nil {
			if first {
				f.connected.Add(1)
				first = false
			}
			stop := context.AfterFunc(ctx, func() { c.Close() })
			io.WriteString(c, requests[kind])
			io.Copy(io.Discard, c) // until the server closes it
			stop()
			c.Close()
		}
		// Paced, a second or so: a connection closed is soon held again,
		// and the machine keeps time for the test's own probes.
		select {
		case <-ctx.Done():
		case <-time.After(500*time.Millisecond + rand.N(time.Second)):
		}
	}
}

// Probes are a load balancer's health checks, asked while a flood holds
// its connections.
type Probes struct {
	Asked, Answered int
	// Slowest is the longest an answered probe took.
	Slowest time.Duration
	// Failures say why probes went unanswered, or answered otherwise.
	Failures []string
}

// maxFailures ends a probing early: past it the result is known, and each
// failure may cost the client's whole timeout.
const maxFailures = 10

// Probe asks every url in turn, rounds times, each on a new connection of
// client (which should not keep connections alive), as a load balancer's
// health checks do, and counts the answers with the code want.
func Probe(client *http.Client, urls []string, rounds, want int) Probes {
	var p Probes
	for range rounds {
		for _, url := range urls {
			p.Asked++
			start := time.Now()
			resp, err := client.Get(url)
			if err != nil {
				p.Failures = append(p.Failures, err.Error())
			} else {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					p.Failures = append(p.Failures, fmt.Sprintf("%s: %d, want %d", url, resp.StatusCode, want))
				} else {
					p.Answered++
					p.Slowest = max(p.Slowest, time.Since(start))
				}
			}
			if len(p.Failures) >= maxFailures {
				return p
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}
