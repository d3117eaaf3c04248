// Package limits bounds what one caller of the API can take from the
// others: connections that never finish their handshake, connections per
// caller, streams per connection, calls in flight and watches per caller,
// the size of a request, and the rate of its calls.
//
// Memory is bounded before a request is read: a unary call is admitted
// (or refused) from its headers alone, so a caller can hold at most
// MaxCallsInFlightPerCaller requests of at most MaxRequestBytes each,
// whether they run or wait for the rate limiter.
package limits

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/weirlb/weir/internal/bounded"
	"github.com/weirlb/weir/server/auth"
)

// Config is the limits; the zero value of a field means its default.
type Config struct {
	// HandshakeTimeout closes a connection that has not finished TLS and
	// HTTP/2 set-up by then (gRPC's default is 120 s).
	HandshakeTimeout time.Duration
	// MaxStreamsPerConnection bounds concurrent calls on one connection.
	MaxStreamsPerConnection uint32
	// MaxWatchesPerCaller bounds a caller's open Watch* streams, over all
	// its connections.
	MaxWatchesPerCaller int
	// MaxConnectionsPerCaller bounds a certificate identity's open
	// connections; past it a new connection is closed after its handshake.
	MaxConnectionsPerCaller int
	// MaxCallsInFlightPerCaller bounds a certificate identity's unary
	// calls being read, waiting for the rate limiter or running, over all
	// its connections; past it a call is refused (ResourceExhausted)
	// before its request is read. In plain text, where every caller may
	// do anything, neither is bounded.
	MaxCallsInFlightPerCaller int
	// MaxRequestBytes bounds one message a caller sends.
	MaxRequestBytes int
	// CallsPerSecond and Burst are each caller's rate of unary calls to
	// the operators' services (RegistryService, StatusService: reads and
	// writes): a caller over it waits, the others do not. Negative: no
	// limit. Agents and speakers are not held to it: their reports are
	// their state, which a delayed or refused call would leave stale.
	CallsPerSecond float64
	Burst          int
}

// Defaults. An operator's lbctl makes a few calls a second over one
// connection, an orchestrator tens over a few; a loop listing as fast as it
// can is slowed to 50. At the defaults one caller's requests hold at most
// 8 × 4 MiB, decoded about twice that, where gRPC alone would let it park
// 128 of them on each of its connections.
const (
	DefaultHandshakeTimeout          = 5 * time.Second
	DefaultMaxStreamsPerConnection   = 128
	DefaultMaxWatchesPerCaller       = 64
	DefaultMaxConnectionsPerCaller   = 32
	DefaultMaxCallsInFlightPerCaller = 8
	DefaultMaxRequestBytes           = 4 << 20 // gRPC's default, stated
	DefaultCallsPerSecond            = 50
	DefaultBurst                     = 100
)

func (c Config) withDefaults() Config {
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxStreamsPerConnection == 0 {
		c.MaxStreamsPerConnection = DefaultMaxStreamsPerConnection
	}
	if c.MaxWatchesPerCaller == 0 {
		c.MaxWatchesPerCaller = DefaultMaxWatchesPerCaller
	}
	if c.MaxConnectionsPerCaller == 0 {
		c.MaxConnectionsPerCaller = DefaultMaxConnectionsPerCaller
	}
	if c.MaxCallsInFlightPerCaller == 0 {
		c.MaxCallsInFlightPerCaller = DefaultMaxCallsInFlightPerCaller
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.CallsPerSecond == 0 {
		c.CallsPerSecond = DefaultCallsPerSecond
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	return c
}

// ReceiveWindow is how much one stream may send the server before it reads
// (a connection: four times that).
const ReceiveWindow = 1 << 20

// ServerOptions enforce cfg; creds are the server's transport credentials,
// nil in plain text.
func ServerOptions(cfg Config, creds credentials.TransportCredentials, log *slog.Logger) []grpc.ServerOption {
	cfg = cfg.withDefaults()
	l := &limiter{cfg: cfg, callers: map[string]*caller{}, log: log}
	opts := []grpc.ServerOption{
		// Fixed receive windows. gRPC's default grows them by estimating
		// each connection's bandwidth-delay product, with a PING for the
		// first data after each estimate: every agent's acknowledgement of
		// every change cost a PING and its answer on top of the
		// acknowledgement itself (thousands of writes and reads a change).
		// What callers send is small (answers, reports, a request of at
		// most MaxRequestBytes): a fixed window loses nothing there, and
		// what the server sends is windowed by the callers.
		grpc.StaticStreamWindowSize(ReceiveWindow),
		grpc.StaticConnWindowSize(4 * ReceiveWindow),
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.MaxConcurrentStreams(cfg.MaxStreamsPerConnection),
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		grpc.InTapHandle(l.admit),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			return resp, boundedError(err)
		}, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if svc, _, _ := strings.Cut(strings.TrimPrefix(info.FullMethod, "/"), "/"); svc != "weir.v1.RegistryService" && svc != "weir.v1.StatusService" {
				return h(ctx, req)
			}
			if err := l.get(ctx).rate.Wait(ctx); err != nil {
				return nil, status.Errorf(codes.ResourceExhausted, "rate limit (%g calls a second per caller): %v", cfg.CallsPerSecond, err)
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return boundedError(h(srv, ss))
		}, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if _, name, _ := strings.Cut(strings.TrimPrefix(info.FullMethod, "/"), "/"); !strings.HasPrefix(name, "Watch") {
				return h(srv, ss)
			}
			c := l.get(ss.Context())
			if !c.startWatch(cfg.MaxWatchesPerCaller) {
				return status.Errorf(codes.ResourceExhausted, "%s has %d watches open, the most one caller may; close some", key(ss.Context()), cfg.MaxWatchesPerCaller)
			}
			defer c.endWatch()
			return h(srv, ss)
		}),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(&countedCreds{TransportCredentials: creds, l: l}))
	}
	return opts
}

// MaxErrorBytes bounds the message of an error sent back, and its details:
// an error may quote what the caller sent (a name of megabytes, say), which
// must not come back whole.
const MaxErrorBytes = 4096

func boundedError(err error) error {
	st, ok := status.FromError(err)
	if !ok || proto.Size(st.Proto()) <= MaxErrorBytes {
		return err
	}
	// The details (field violations) repeat the message: without room for
	// them they are left out.
	return status.Error(st.Code(), bounded.String(st.Message(), MaxErrorBytes))
}

// admit runs on a call's headers, before its request is read: a unary call
// takes one of its caller's in-flight places until the call ends, or is
// refused. It must not block (it runs on the connection's reader).
func (l *limiter) admit(ctx context.Context, info *tap.Info) (context.Context, error) {
	if _, ok := auth.Certified(ctx); !ok || streaming(info.FullMethodName) {
		// In plain text every caller may do anything, and all on one
		// address count as one: no cap on what it has in flight.
		return ctx, nil
	}
	who := capKey(ctx)
	c := l.named("calls of " + who)
	c.mu.Lock()
	if c.inFlight >= l.cfg.MaxCallsInFlightPerCaller {
		c.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "%s has %d calls in flight, the most one caller may; wait for some to end", who, l.cfg.MaxCallsInFlightPerCaller)
	}
	c.inFlight++
	c.mu.Unlock()
	// The stream's context ends with the call, however it ends (answered,
	// cancelled, its connection lost).
	context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.inFlight--
		c.lastUsed = time.Now()
		c.mu.Unlock()
	})
	return ctx, nil
}

// streaming reports whether a full method name ("/pkg.Service/Method") is
// a streaming call, from the descriptors its package registered; the
// streams have limits of their own (watches per caller, the agents' one
// stream each).
func streaming(method string) bool {
	if v, ok := streamingMethods.Load(method); ok {
		return v.(bool)
	}
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return false // no such service: refused unread, as a unary call
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return false
	}
	m := sd.Methods().ByName(protoreflect.Name(name))
	if m == nil {
		return false
	}
	// Only methods that exist are remembered: a caller cannot grow this.
	s := m.IsStreamingClient() || m.IsStreamingServer()
	streamingMethods.Store(method, s)
	return s
}

var streamingMethods sync.Map

// countedCreds counts each caller's connections after its handshake, when
// its certificate names it, and closes those past the limit.
type countedCreds struct {
	credentials.TransportCredentials
	l *limiter
}

func (c *countedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: raw.RemoteAddr(), AuthInfo: info})
	if _, ok := auth.Certified(ctx); !ok {
		return conn, info, nil // TLS without client certificates: no one to count
	}
	who := capKey(ctx)
	cl := c.l.named("connections of " + who)
	cl.mu.Lock()
	if cl.conns >= c.l.cfg.MaxConnectionsPerCaller {
		warn := time.Since(cl.refusedLogged) > time.Minute
		if warn {
			cl.refusedLogged = time.Now()
		}
		cl.mu.Unlock()
		conn.Close()
		if warn && c.l.log != nil {
			c.l.log.Warn("connection refused: the caller has as many connections open as one caller may (logged once a minute per caller)", "who", who, "from", raw.RemoteAddr().String(), "limit", c.l.cfg.MaxConnectionsPerCaller)
		}
		return nil, nil, fmt.Errorf("%s has %d connections open, the most one caller may", who, c.l.cfg.MaxConnectionsPerCaller)
	}
	cl.conns++
	cl.mu.Unlock()
	return &countedConn{Conn: conn, c: cl}, info, nil
}

func (c *countedCreds) Clone() credentials.TransportCredentials {
	return &countedCreds{TransportCredentials: c.TransportCredentials.Clone(), l: c.l}
}

type countedConn struct {
	net.Conn
	c    *caller
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.c.mu.Lock()
		c.c.conns--
		c.c.lastUsed = time.Now()
		c.c.mu.Unlock()
	})
	return c.Conn.Close()
}

type limiter struct {
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	callers map[string]*caller
}

type caller struct {
	rate          *rate.Limiter
	mu            sync.Mutex
	watches       int
	conns         int
	inFlight      int
	lastUsed      time.Time
	refusedLogged time.Time
}

// get finds ctx's caller, making it; callers idle for ten minutes are
// forgotten once there are many, so addresses cannot grow the map forever.
func (l *limiter) get(ctx context.Context) *caller { return l.named(key(ctx)) }

// named is get by key.
func (l *limiter) named(k string) *caller {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.callers[k]
	if c == nil {
		if len(l.callers) >= 4096 {
			for k, o := range l.callers {
				o.mu.Lock()
				idle := o.watches == 0 && o.conns == 0 && o.inFlight == 0 && now.Sub(o.lastUsed) > 10*time.Minute
				o.mu.Unlock()
				if idle {
					delete(l.callers, k)
				}
			}
		}
		limit := rate.Limit(l.cfg.CallsPerSecond)
		if l.cfg.CallsPerSecond < 0 {
			limit = rate.Inf
		}
		c = &caller{rate: rate.NewLimiter(limit, l.cfg.Burst)}
		l.callers[k] = c
	}
	c.mu.Lock()
	c.lastUsed = now
	c.mu.Unlock()
	return c
}

func (c *caller) startWatch(most int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watches >= most {
		return false
	}
	c.watches++
	return true
}

func (c *caller) endWatch() {
	c.mu.Lock()
	c.watches--
	c.lastUsed = time.Now()
	c.mu.Unlock()
}

// capKey is whom the per-certificate caps count (auth.Party).
func capKey(ctx context.Context) string { return auth.Party(ctx) }

// key is the caller's certificate identity or, in plain text, its address
// without the port (one machine is one caller).
func key(ctx context.Context) string {
	c := auth.Caller(ctx)
	if addr, ok := strings.CutPrefix(c, "unauthenticated "); ok {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			return fmt.Sprintf("unauthenticated %s", host)
		}
	}
	return c
}
