// Package limits bounds what one caller of the API can take from the
// others: connections that never finish their handshake, streams per
// connection, watches per caller, and the rate of its calls.
package limits

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	// CallsPerSecond and Burst are each caller's rate of unary calls to
	// the operators' services (RegistryService, StatusService: reads and
	// writes): a caller over it waits, the others do not. Negative: no
	// limit. Agents and speakers are not held to it: their reports are
	// their state, which a delayed or refused call would leave stale.
	CallsPerSecond float64
	Burst          int
}

// Defaults. An operator's lbctl makes a few calls a second, an
// orchestrator tens; a loop listing as fast as it can is slowed to 50.
const (
	DefaultHandshakeTimeout        = 5 * time.Second
	DefaultMaxStreamsPerConnection = 128
	DefaultMaxWatchesPerCaller     = 64
	DefaultCallsPerSecond          = 50
	DefaultBurst                   = 100
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
	if c.CallsPerSecond == 0 {
		c.CallsPerSecond = DefaultCallsPerSecond
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	return c
}

// ServerOptions enforce cfg.
func ServerOptions(cfg Config) []grpc.ServerOption {
	cfg = cfg.withDefaults()
	l := &limiter{cfg: cfg, callers: map[string]*caller{}}
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.MaxConcurrentStreams(cfg.MaxStreamsPerConnection),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if svc, _, _ := strings.Cut(strings.TrimPrefix(info.FullMethod, "/"), "/"); svc != "weir.v1.RegistryService" && svc != "weir.v1.StatusService" {
				return h(ctx, req)
			}
			if err := l.get(ctx).rate.Wait(ctx); err != nil {
				return nil, status.Errorf(codes.ResourceExhausted, "rate limit (%g calls a second per caller): %v", cfg.CallsPerSecond, err)
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
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
}

type limiter struct {
	cfg     Config
	mu      sync.Mutex
	callers map[string]*caller
}

type caller struct {
	rate     *rate.Limiter
	mu       sync.Mutex
	watches  int
	lastUsed time.Time
}

// get finds ctx's caller, making it; callers idle for ten minutes are
// forgotten once there are many, so addresses cannot grow the map forever.
func (l *limiter) get(ctx context.Context) *caller {
	k := key(ctx)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.callers[k]
	if c == nil {
		if len(l.callers) >= 4096 {
			for k, o := range l.callers {
				o.mu.Lock()
				idle := o.watches == 0 && now.Sub(o.lastUsed) > 10*time.Minute
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
