// Package fanoutfloor measures the floor of a change's fan-out: the same
// bytes to the same number of agents over bare sockets on loopback, one
// connection each (TCP, or TLS as the agents' mTLS), with no gRPC, HTTP/2
// or hub: one write of a delta's size to every agent, each agent reading
// it and writing a small answer back, read by the sender. What the
// kernel, Go's poller and (with TLS) the record layer alone cost, for a
// bench to print beside its own figures from the same run.
package fanoutfloor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Result is one measurement.
type Result struct {
	Agents, Changes, Size int
	TLS                   bool
	GRPC                  bool // over gRPC streams (MeasureGRPC), not bare sockets
	// P50, P99 and Max are the agents' receipts, from the start of the
	// change's writes.
	P50, P99, Max time.Duration
	// LastP50 and LastP99 are the same for the last agent of each change:
	// when every agent had it.
	LastP50, LastP99 time.Duration
	// CPU is this process's CPU time per change: both sides.
	CPU time.Duration
}

func (r Result) String() string {
	over := "TCP"
	if r.TLS {
		over = "TLS"
	}
	how := "over bare " + over + " sockets"
	if r.GRPC {
		how = "through bare gRPC streams over " + over
	}
	return fmt.Sprintf("floor, the same fan-out %s (%d bytes to each of %d agents, a 15-byte answer back, %d changes): an agent has it p50 %v  p99 %v  max %v; every agent has it p50 %v  p99 %v; CPU per change, both sides: %v",
		how, r.Size, r.Agents, r.Changes, r.P50, r.P99, r.Max, r.LastP50, r.LastP99, r.CPU)
}

// run makes changes changes back to back: each sent by send, then its n
// answers awaited. It returns when each started, and sets the CPU time
// per change.
func (r *Result) run(ctx context.Context, n, changes int, answered <-chan struct{}, send func() error) ([]time.Time, error) {
	starts := make([]time.Time, 0, changes)
	cpuBefore := CPUTime(os.Getpid())
	for range changes {
		starts = append(starts, time.Now())
		if err := send(); err != nil {
			return nil, err
		}
		for range n {
			select {
			case <-answered:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	r.CPU = ((CPUTime(os.Getpid()) - cpuBefore) / time.Duration(changes)).Round(100 * time.Microsecond)
	return starts, nil
}

// summarize sets the quantiles from when each change started and when each
// agent received each change.
func (r *Result) summarize(starts []time.Time, received [][]time.Time) {
	var lat, last []time.Duration
	for k, start := range starts {
		var slowest time.Duration
		for i := range received {
			d := received[i][k].Sub(start)
			lat = append(lat, d)
			slowest = max(slowest, d)
		}
		last = append(last, slowest)
	}
	slices.Sort(lat)
	slices.Sort(last)
	q := func(d []time.Duration, p int) time.Duration {
		return d[min(len(d)-1, len(d)*p/100)].Round(100 * time.Microsecond)
	}
	r.P50, r.P99, r.Max = q(lat, 50), q(lat, 99), lat[len(lat)-1].Round(100*time.Microsecond)
	r.LastP50, r.LastP99 = q(last, 50), q(last, 99)
}

// Measure sends changes deltas of size bytes to n agents, until ctx ends.
func Measure(ctx context.Context, n, changes, size int, withTLS bool) (Result, error) {
	res := Result{Agents: n, Changes: changes, Size: size, TLS: withTLS}
	ln, clientTLS, err := listen(withTLS)
	if err != nil {
		return res, err
	}
	defer ln.Close()
	var cs conns
	defer cs.close()
	if err := cs.connect(ctx, ln, n, clientTLS); err != nil {
		return res, err
	}
	// Everything blocking below ends with the sockets.
	closeAll := context.AfterFunc(ctx, cs.close)
	defer closeAll()

	received, agents := cs.runAgents(changes, size)
	answered := cs.readAnswers(changes)
	delta := make([]byte, size)
	starts, err := res.run(ctx, n, changes, answered, func() error {
		for _, c := range cs.servers {
			if _, err := c.Write(delta); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	agents.Wait()
	res.summarize(starts, received)
	return res, nil
}

// listen opens the server's socket on loopback, with TLS when asked (and
// then the clients' configuration).
func listen(withTLS bool) (net.Listener, *tls.Config, error) {
	if !withTLS {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		return ln, nil, err
	}
	serverTLS, clientTLS, err := selfSigned()
	if err != nil {
		return nil, nil, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverTLS)
	return ln, clientTLS, err
}

// conns are the agents' connections (clients) and the server's ends of
// them (servers), in the same order.
type conns struct {
	clients, servers []net.Conn
}

func (cs *conns) close() {
	for _, c := range cs.clients {
		c.Close()
	}
	for _, c := range cs.servers {
		c.Close()
	}
}

// connect dials n agents to ln, one at a time, and accepts them.
func (cs *conns) connect(ctx context.Context, ln net.Listener, n int, clientTLS *tls.Config) error {
	cs.servers = make([]net.Conn, 0, n)
	accepted := make(chan error, 1)
	go func() {
		for range n {
			c, err := ln.Accept()
			if err == nil {
				if tc, ok := c.(*tls.Conn); ok {
					// The agents dial one at a time, each waiting
					// for its handshake to end.
					err = tc.HandshakeContext(ctx)
				}
			}
			if err != nil {
				accepted <- err
				return
			}
			cs.servers = append(cs.servers, c)
		}
		accepted <- nil
	}()
	// Accepting ends with the socket.
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	cs.clients = make([]net.Conn, 0, n)
	for range n {
		var c net.Conn
		var err error
		if clientTLS != nil {
			c, err = (&tls.Dialer{Config: clientTLS}).DialContext(ctx, "tcp", ln.Addr().String())
		} else {
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
		}
		if err != nil {
			return err
		}
		cs.clients = append(cs.clients, c)
	}
	return <-accepted
}

// runAgents starts each agent: read a delta, note when, answer. The
// agents are done once each has read changes deltas, or its connection
// ended.
func (cs *conns) runAgents(changes, size int) (received [][]time.Time, agents *sync.WaitGroup) {
	received = make([][]time.Time, len(cs.clients))
	agents = &sync.WaitGroup{}
	for i, c := range cs.clients {
		agents.Add(1)
		go func() {
			defer agents.Done()
			buf := make([]byte, size)
			for range changes {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				received[i] = append(received[i], time.Now())
				if _, err := c.Write(buf[:15]); err != nil {
					return
				}
			}
		}()
	}
	return received, agents
}

// readAnswers reads every answer, as a server reads every
// acknowledgement: one value on the channel each.
func (cs *conns) readAnswers(changes int) <-chan struct{} {
	answered := make(chan struct{}, len(cs.servers))
	for _, c := range cs.servers {
		go func() {
			buf := make([]byte, 15)
			for range changes {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				answered <- struct{}{}
			}
		}()
	}
	return answered
}

// selfSigned is a server and a client TLS configuration around a fresh
// self-signed certificate for 127.0.0.1 (P-256, as the lab's).
func selfSigned() (server, client *tls.Config, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS13},
		&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}, nil
}

// CPUTime is a process's user and system CPU time so far (in clock
// ticks of 10 ms, Linux's USER_HZ).
func CPUTime(pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces: fields count from after ")".
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
