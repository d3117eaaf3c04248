package health

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Health answers are one small request from a prober, answered at once;
// nothing legitimate holds a connection long. These bounds close
// connections that send nothing (half-open, slow), so that they do not pile
// up until the agent runs out of file descriptors, which would stop its
// applies and fail its own /healthz.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 5 * time.Second
	writeTimeout      = 5 * time.Second
	idleTimeout       = 10 * time.Second
	maxHeaderBytes    = 8 << 10
)

// Limits bound the connections that a set of health listeners holds
// together. None of them makes a connection wait: a load balancer's prober
// gives up after a few seconds, so a probe queued behind a flood is a probe
// failed, and a node that fails every probe is taken out of the service.
type Limits struct {
	// Connections is how many connections the listeners hold together. At
	// the limit, a new connection from a source holding fewer than the
	// source holding the most takes the place of one of that source's;
	// any other is closed at once.
	Connections int
	// PerSource is how many of them one source holds at once: past it, a
	// new connection takes the place of the source's own that has waited
	// longest.
	PerSource int
	// IPv4Prefix and IPv6Prefix are the prefix lengths within which
	// addresses count as one source, but for known addresses (below). An
	// IPv6 host has a whole /64 to itself (SLAAC, privacy addresses):
	// counted per address, one host would be as many sources as it liked.
	IPv4Prefix, IPv6Prefix int
}

var (
	// ServiceLimits are the defaults of every health-check node port
	// together.
	ServiceLimits = Limits{Connections: 512, PerSource: 16, IPv4Prefix: 32, IPv6Prefix: 64}
	// NodeLimits are the defaults of /healthz and /livez, and of /metrics
	// (each listener its own).
	NodeLimits = Limits{Connections: 128, PerSource: 16, IPv4Prefix: 32, IPv6Prefix: 64}
)

// Known addresses: an address answered on a health listener within
// knownFor is a source of its own, not one address of its prefix; at most
// knownPerPrefix addresses of one prefix, and maxKnown in all, are known
// at once. A load balancer's prober on the node network shares its /64
// with every host there: counted as the /64, it would share the /64's
// connections with whoever floods from it, and a flood that opened the
// /64's share of connections faster than the prober's request arrives
// would close the prober's every time. Known, it holds its own share, and
// a host can split at most knownPerPrefix addresses of its /64 off.
const (
	knownFor       = 5 * time.Minute // longer than any balancer's probe interval (AWS and GCP allow up to 300 s)
	knownPerPrefix = 8
	maxKnown       = 4096
)

// Why a ConnLimit closed a connection: the label values of
// weir_health_connections_closed_total.
const (
	closedSourceShare = iota // its source opened one more past its share
	closedEvicted            // the limit was reached, and a source holding fewer connected
	closedRefused            // the limit was reached, and its source held as many as any
	closedReasons
)

var closedReasonNames = [closedReasons]string{"source_share", "evicted", "refused"}

// ConnLimit bounds the connections open across any number of listeners,
// in all and per source, so that whoever holds connections open, from
// however many addresses, cannot keep a prober's connection out: a prober
// holds one connection at a time, never the most. It is a Prometheus
// collector of what it holds and closed.
type ConnLimit struct {
	limits               Limits
	heldDesc, closedDesc *prometheus.Desc
	now                  func() time.Time // the known addresses' clock

	mu sync.Mutex // guards the fields below and the held connections' state
	// held counts the connections held, bySource holds them by source.
	held     int
	bySource map[netip.Prefix][]*limitedConn
	// known are the addresses answered lately, and knownIn how many of
	// them each prefix has; swept is when stale ones were last forgotten.
	known   map[netip.Addr]knownAddr
	knownIn map[netip.Prefix]int
	swept   time.Time
	// clock orders the held connections' state changes; closed counts the
	// connections closed, by reason.
	clock  uint64
	closed [closedReasons]uint64
}

// knownAddr is an address answered lately: its prefix, and when.
type knownAddr struct {
	prefix   netip.Prefix
	answered time.Time
}

// NewConnLimit returns a limit whose metrics carry listener as their
// listener label. Limits are taken as given (the flags that set them are
// checked where they are parsed).
func NewConnLimit(listener string, limits Limits) *ConnLimit {
	label := prometheus.Labels{"listener": listener}
	return &ConnLimit{
		limits: limits,
		heldDesc: prometheus.NewDesc("weir_health_connections",
			"Connections the agent's health listener holds now (every health-check node port together).", nil, label),
		closedDesc: prometheus.NewDesc("weir_health_connections_closed_total",
			"Connections the agent's health listener closed to keep within its limits, by reason: source_share (its source opened one more past its share), evicted (the listener was full and a source holding fewer connected), refused (the listener was full and its source held as many as any).",
			[]string{"reason"}, label),
		now:      time.Now,
		bySource: map[netip.Prefix][]*limitedConn{},
		known:    map[netip.Addr]knownAddr{},
		knownIn:  map[netip.Prefix]int{},
	}
}

// Server is an HTTP server for health answers, with the timeouts above; it
// tells l which of the connections it serves are answering a request
// (those are closed last).
func (l *ConnLimit) Server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ConnState: l.connState}
}

// Listen wraps ln: every connection it accepts is counted by l, and those
// past l's limits are closed as they come, or make room by closing
// another's.
func (l *ConnLimit) Listen(ln net.Listener) net.Listener { return &limitedListener{ln, l} }

type limitedListener struct {
	net.Listener
	limit *ConnLimit
}

func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, limit: ln.limit, addr: remoteAddr(c)}
		victim, ok := ln.limit.admit(lc)
		if victim != nil {
			// Its server sees the connection end and closes it again, which
			// counts nothing twice: admit has let go of it.
			victim.Conn.Close()
		}
		if !ok {
			c.Close()
			continue
		}
		return lc, nil
	}
}

// admit counts c in, and says which held connection to close to make room
// for it (nil for none); false when c itself is to be closed.
func (l *ConnLimit) admit(c *limitedConn) (victim *limitedConn, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.source = l.source(c.addr)
	mine := len(l.bySource[c.source])
	switch {
	case mine >= l.limits.PerSource:
		victim = longestWaiting(nil, l.bySource[c.source])
		l.closed[closedSourceShare]++
	case l.held >= l.limits.Connections:
		most := 0
		for _, conns := range l.bySource {
			most = max(most, len(conns))
		}
		if most > mine {
			for _, conns := range l.bySource {
				if len(conns) == most {
					victim = longestWaiting(victim, conns)
				}
			}
		}
		if victim == nil {
			l.closed[closedRefused]++
			return nil, false
		}
		l.closed[closedEvicted]++
	}
	if victim != nil {
		l.drop(victim)
	}
	c.since = l.tick()
	l.held++
	l.bySource[c.source] = append(l.bySource[c.source], c)
	return victim, true
}

// longestWaiting is, of found and conns, the connection answering no
// request that has been so longest; one answering a request only when
// there is none. Called with mu held.
func longestWaiting(found *limitedConn, conns []*limitedConn) *limitedConn {
	for _, c := range conns {
		if found == nil || (found.active && !c.active) || (found.active == c.active && c.since < found.since) {
			found = c
		}
	}
	return found
}

// connState follows the HTTP server's view of a connection: a request
// read and being answered (active), or none yet, or the last answered
// (waiting). An address whose request is answered is known from then on.
func (l *ConnLimit) connState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok || (st != http.StateActive && st != http.StateIdle) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.active = st == http.StateActive
	lc.since = l.tick()
	if lc.active {
		l.answered(lc.addr)
	}
}

// answered makes a a known address, or keeps it one, when its prefix and
// the table have room. Called with mu held.
func (l *ConnLimit) answered(a netip.Addr) {
	now := l.now()
	if k, ok := l.known[a]; ok {
		l.known[a] = knownAddr{k.prefix, now}
		return
	}
	p := l.prefix(a)
	if p.Bits() == a.BitLen() {
		return // a source of its own anyway
	}
	full := func() bool { return l.knownIn[p] >= knownPerPrefix || len(l.known) >= maxKnown }
	if full() {
		l.forgetStale(now)
		if full() {
			return
		}
	}
	l.known[a] = knownAddr{p, now}
	l.knownIn[p]++
}

// forgetStale forgets the addresses not answered within knownFor, at most
// once a second (it walks the table). Called with mu held.
func (l *ConnLimit) forgetStale(now time.Time) {
	if now.Sub(l.swept) < time.Second {
		return
	}
	l.swept = now
	for a, k := range l.known {
		if now.Sub(k.answered) >= knownFor {
			delete(l.known, a)
			if l.knownIn[k.prefix]--; l.knownIn[k.prefix] <= 0 {
				delete(l.knownIn, k.prefix)
			}
		}
	}
}

// tick is the next instant of l's clock. Called with mu held.
func (l *ConnLimit) tick() uint64 {
	l.clock++
	return l.clock
}

func (l *ConnLimit) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop(c)
}

// drop stops counting c, if it is counted. Called with mu held.
func (l *ConnLimit) drop(c *limitedConn) {
	conns := l.bySource[c.source]
	i := slices.Index(conns, c)
	if i < 0 {
		return // closed to make room, and counted out then
	}
	l.held--
	if conns = slices.Delete(conns, i, i+1); len(conns) == 0 {
		delete(l.bySource, c.source)
	} else {
		l.bySource[c.source] = conns
	}
}

// remoteAddr is a connection's remote address (IPv4-mapped IPv6 as IPv4).
func remoteAddr(c net.Conn) netip.Addr {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap().WithZone("")
}

// source is the source a connection from a counts against: a alone when
// known, else its prefix. Called with mu held.
func (l *ConnLimit) source(a netip.Addr) netip.Prefix {
	if k, ok := l.known[a]; ok && l.now().Sub(k.answered) < knownFor {
		return netip.PrefixFrom(a, a.BitLen())
	}
	return l.prefix(a)
}

// prefix is a within the limits' prefix length of its family.
func (l *ConnLimit) prefix(a netip.Addr) netip.Prefix {
	bits := l.limits.IPv6Prefix
	if a.Is4() {
		bits = l.limits.IPv4Prefix
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return netip.PrefixFrom(a, a.BitLen())
	}
	return p
}

// Describe implements prometheus.Collector.
func (l *ConnLimit) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.heldDesc
	ch <- l.closedDesc
}

// Collect implements prometheus.Collector.
func (l *ConnLimit) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	held, closed := l.held, l.closed
	l.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(l.heldDesc, prometheus.GaugeValue, float64(held))
	for reason, n := range closed {
		ch <- prometheus.MustNewConstMetric(l.closedDesc, prometheus.CounterValue, float64(n), closedReasonNames[reason])
	}
}

// limitedConn is a connection a ConnLimit counts.
type limitedConn struct {
	net.Conn
	limit *ConnLimit
	addr  netip.Addr // remote
	// Guarded by limit.mu: the source it counts against, whether it is
	// answering a request, and since when (limit's clock).
	source netip.Prefix
	active bool
	since  uint64
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.limit.release(c)
	return err
}
