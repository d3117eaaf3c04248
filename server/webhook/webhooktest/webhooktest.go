// Package webhooktest attacks an admission webhook as any caller on a pod
// network can: many connections from many addresses, each sending a large
// review too slowly to end within the apiserver's timeout. Tests run the
// webhook in their own process and assert what it kept.
package webhooktest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// SlowBodies is the attack.
type SlowBodies struct {
	Addr string      // the webhook's address
	Path string      // the request's path
	TLS  *tls.Config // the attacker's: a certificate, or none
	// Conns connections from Sources loopback addresses (127.0.1.10 on),
	// all opened at once.
	Conns, Sources int
	// Each announces BodyBytes and sends Chunk bytes every Every.
	BodyBytes, Chunk int
	Every            time.Duration
	// For is how long the attack lasts.
	For time.Duration
}

// Outcome is what the attack saw, and the test process's live heap
// (after a collection) before and at its highest during the attack.
type Outcome struct {
	HeapBefore, HeapPeak uint64
	// Accepted connections finished their handshake, HandshakeFailed did
	// not (closed at once for their source's share, or refused); MaxOpen
	// were open at once; ClosedByServer were closed (or refused, after a
	// TLS 1.3 handshake the client thought done) by the server before the
	// attack ended, the one that lived longest after Longest.
	Accepted, HandshakeFailed, MaxOpen, ClosedByServer int64
	Longest                                            time.Duration
}

func (o Outcome) String() string {
	return fmt.Sprintf("heap %d MiB before, %d MiB at most during the attack (+%d MiB); connections accepted %d (%d handshakes failed), open at most %d, closed by the server %d, the longest lived %v",
		o.HeapBefore>>20, o.HeapPeak>>20, (o.HeapPeak-min(o.HeapBefore, o.HeapPeak))>>20, o.Accepted, o.HandshakeFailed, o.MaxOpen, o.ClosedByServer, o.Longest.Round(time.Millisecond))
}

// seenLate is how many more connections than a server holds its
// attacker may count open.
const seenLate = 4

// Bounded says how the outcome breaks a server's bounds, nil when it does
// not: at most conns connections open at once, each closed within
// lifetime of its accept and its slot taken again, and a heap grown by
// less than perConn bytes a connection.
func (o Outcome) Bounded(conns int, perConn uint64, lifetime time.Duration) error {
	var errs []error
	if bound := uint64(conns) * perConn; o.HeapPeak > o.HeapBefore+bound {
		errs = append(errs, fmt.Errorf("the heap grew by %d MiB; want at most %d MiB (%d connections of %d KiB)", (o.HeapPeak-o.HeapBefore)>>20, bound>>20, conns, perConn>>10))
	}
	// The attacker learns that the server closed a connection a moment
	// after the server may have taken the next one: a few more than the
	// server holds can look open.
	if o.MaxOpen > int64(conns)+seenLate {
		errs = append(errs, fmt.Errorf("%d connections open at once; want at most %d (and %d seen closed late)", o.MaxOpen, conns, seenLate))
	}
	if o.Longest > lifetime || o.ClosedByServer <= int64(conns) {
		errs = append(errs, fmt.Errorf("%d connections closed by the server, the longest after %v; want each closed within %v of its accept, and their slots taken again", o.ClosedByServer, o.Longest, lifetime))
	}
	return errors.Join(errs...)
}

// Run attacks, and returns when the attack is over and every connection
// closed. A.TLS must name the server (ServerName).
func (a SlowBodies) Run() Outcome {
	if a.TLS == nil || a.TLS.ServerName == "" {
		panic("webhooktest: the attack's TLS configuration names no server: every handshake would fail before it is sent")
	}
	var out Outcome
	out.HeapBefore = liveHeap()
	ctx, cancel := context.WithTimeout(context.Background(), a.For)
	defer cancel()
	var (
		open, maxOpen, closed, accepted, failed atomic.Int64
		mu                                      sync.Mutex // guards out.Longest
		wg                                      sync.WaitGroup
	)
	chunk := make([]byte, a.Chunk)
	for i := range a.Conns {
		wg.Go(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(10+i%a.Sources))}}
			raw, err := d.DialContext(ctx, "tcp", a.Addr)
			if err != nil {
				return
			}
			c := tls.Client(raw, a.TLS)
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			// Past the limit, a connection waits in the backlog: its
			// handshake ends when the server takes it.
			if err := c.Handshake(); err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
				}
				return
			}
			accepted.Add(1)
			for n, m := open.Add(1), maxOpen.Load(); n > m && !maxOpen.CompareAndSwap(m, n); m = maxOpen.Load() {
			}
			start := time.Now()
			// The server's closing shows as the end of what it sends (an
			// answer first, a 413 or a 400, or a TLS alert): the
			// connection is no longer open from then.
			gone := make(chan struct{})
			go func() {
				io.Copy(io.Discard, c)
				open.Add(-1)
				close(gone)
			}()
			defer func() {
				c.Close()
				<-gone
			}()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", a.Path, a.BodyBytes)
			for sent := 0; sent < a.BodyBytes; sent += a.Chunk {
				select {
				case <-ctx.Done():
					return
				case <-gone:
				case <-time.After(a.Every):
					// A write the server does not take (a full window)
					// leaves the TLS state broken, and the next ones fail
					// the same way: keep waiting for the end.
					c.SetWriteDeadline(time.Now().Add(a.Every))
					if _, err := c.Write(chunk); err == nil || isTimeout(err) {
						continue
					}
				}
				if ctx.Err() != nil {
					return
				}
				closed.Add(1)
				mu.Lock()
				out.Longest = max(out.Longest, time.Since(start))
				mu.Unlock()
				return
			}
		})
	}
	for ctx.Err() == nil {
		out.HeapPeak = max(out.HeapPeak, liveHeap())
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	out.Accepted, out.HandshakeFailed, out.MaxOpen, out.ClosedByServer = accepted.Load(), failed.Load(), maxOpen.Load(), closed.Load()
	return out
}

// liveHeap is the heap after a collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
