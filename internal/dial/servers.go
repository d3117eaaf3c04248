package dial

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirlb/weir/internal/apierr"
	"github.com/weirlb/weir/internal/tlsconfig"
)

// NotCurrent begins the message of a replica that has lost its store when
// it refuses, or ends, an agent's or a speaker's stream (code Unavailable):
// the client should try another replica.
const NotCurrent = apierr.NotCurrentMessage

// IsNotCurrent reports whether err is a replica's refusal as not current.
func IsNotCurrent(err error) bool { return apierr.IsNotCurrent(err) }

// ParseList reads a --server value: comma-separated HOST:PORT entries,
// where HOST is an IP address or a DNS name.
func ParseList(list string) ([]string, error) {
	var out []string
	for _, entry := range strings.Split(list, ",") {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		host, port, err := net.SplitHostPort(entry)
		if _, perr := strconv.ParseUint(port, 10, 16); err != nil || host == "" || perr != nil {
			return nil, fmt.Errorf("server address %q: want HOST:PORT", entry)
		}
		out = append(out, entry)
	}
	if len(out) == 0 {
		return nil, errors.New("no server address")
	}
	return out, nil
}

// resolveTimeout bounds one DNS lookup of an entry, so that a slow
// resolver does not hold up the move to another replica.
const resolveTimeout = 2 * time.Second

// Servers is a client of one of several weir-server replicas at a time:
// calls and streams go to the current one, and Next moves to the next.
// Each address has its own connection, with Server's settings, made on
// first use and kept, so that coming back to a replica finds it ready.
//
// The addresses are the entries with every DNS name replaced by all its
// addresses, looked up again at the start of each round (a walk through
// all of them), so that a changed DNS answer is seen.
type Servers struct {
	entries  []string
	opts     []grpc.DialOption
	dialer   *net.Dialer // nil: gRPC's own
	resolver *net.Resolver

	mu     sync.Mutex // guards the fields below
	round  []address  // this round's addresses
	pos    int        // the current one, in round
	tried  int        // addresses of round tried so far, the current one included
	conns  map[address]*grpc.ClientConn
	closed bool
}

// address is where one replica listens, and the name its certificate is
// checked against: the entry's host (a DNS name, or the address itself).
type address struct{ addr, authority string }

// NewServers makes a client of the servers at the entries of list (see
// ParseList): mTLS with tls's files, or plain text when tls is nil. It starts at a
// random address, so that a rack's agents spread over the replicas.
func NewServers(list string, tls *tlsconfig.Source, opts ...Option) (*Servers, error) {
	entries, err := ParseList(list)
	if err != nil {
		return nil, err
	}
	s := &Servers{entries: entries, resolver: net.DefaultResolver, conns: map[address]*grpc.ClientConn{}, opts: options(tls)}
	for _, o := range opts {
		o(s)
	}
	if s.dialer != nil {
		s.opts = append(s.opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return s.dialer.DialContext(ctx, "tcp", addr)
		}))
	}
	s.round, s.tried = shuffled(s.resolve(entries)), 1
	return s, nil
}

// Option adjusts how Servers connects.
type Option func(*Servers)

// WithSocketMark marks every socket the client opens, to its servers and
// to the resolver that names them, with mark: an agent's datapath lets
// such packets pass whatever the state it programs says, so that no state
// can cut the node off its server.
func WithSocketMark(mark uint32) Option {
	return func(s *Servers) {
		d := &net.Dialer{Control: markControl(mark)}
		d.Resolver = &net.Resolver{PreferGo: true, Dial: d.DialContext}
		s.dialer, s.resolver = d, d.Resolver
	}
}

// shuffled is the addresses in an order of this client's own: a rack's
// agents start on different replicas, and those of a replica that goes
// away move to different ones.
func shuffled(round []address) []address {
	rand.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
	return round
}

// resolve returns the addresses of entries, each once.
func (s *Servers) resolve(entries []string) []address {
	var out []address
	seen := map[string]bool{}
	add := func(a address) {
		if !seen[a.addr] {
			seen[a.addr] = true
			out = append(out, a)
		}
	}
	for _, entry := range entries {
		host, port, _ := net.SplitHostPort(entry)
		if _, err := netip.ParseAddr(host); err == nil {
			add(address{entry, entry})
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		ips, err := s.resolver.LookupHost(ctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			// Kept as a name: the connection looks it up again, and its
			// failure is the stream's error, which moves the client on.
			add(address{entry, entry})
			continue
		}
		slices.Sort(ips)
		for _, ip := range ips {
			add(address{net.JoinHostPort(ip, port), entry})
		}
	}
	return out
}

// Current is the address calls go to now.
func (s *Servers) Current() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.round[s.pos].addr
}

// Len is the number of addresses in this round.
func (s *Servers) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.round)
}

// Next moves to the next address, and reports whether that starts a new
// round: every address of the last one has been tried. A new round looks
// the DNS names up again. Next is for one caller, the owner of the stream.
func (s *Servers) Next() (newRound bool) {
	s.mu.Lock()
	if s.tried < len(s.round) {
		s.tried++
		s.pos = (s.pos + 1) % len(s.round)
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	// Looked up without the lock: calls to the current replica go on
	// meanwhile.
	round := shuffled(s.resolve(s.entries))
	s.mu.Lock()
	defer s.mu.Unlock()
	// A new order, not starting where the last round ended.
	if len(round) > 1 && round[0] == s.round[s.pos] {
		round[0], round[len(round)-1] = round[len(round)-1], round[0]
	}
	s.round, s.pos, s.tried = round, 0, 1
	return true
}

// conn returns the current address's connection, made on first use.
func (s *Servers) conn() (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, status.Error(codes.Canceled, "dial: the connection to the servers is closed")
	}
	a := s.round[s.pos]
	if cc := s.conns[a]; cc != nil {
		return cc, nil
	}
	// Passthrough: the address is already looked up. The authority is
	// what TLS checks the server's certificate against: the entry's host.
	cc, err := grpc.NewClient("passthrough:///"+a.addr, append(slices.Clip(s.opts), grpc.WithAuthority(a.authority))...)
	if err != nil {
		return nil, err
	}
	s.conns[a] = cc
	return cc, nil
}

// Invoke sends a call to the current replica.
func (s *Servers) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	cc, err := s.conn()
	if err != nil {
		return err
	}
	return cc.Invoke(ctx, method, args, reply, opts...)
}

// NewStream opens a stream to the current replica.
func (s *Servers) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc, err := s.conn()
	if err != nil {
		return nil, err
	}
	return cc.NewStream(ctx, desc, method, opts...)
}

// Close closes every connection; later calls fail.
func (s *Servers) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for _, cc := range s.conns {
		errs = append(errs, cc.Close())
	}
	clear(s.conns)
	return errors.Join(errs...)
}
