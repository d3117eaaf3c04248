package drain

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Conntrack is the seam to the node's connection-tracking table, TCP
// entries only: Netlink is the real one, Fake the tests'.
type Conntrack interface {
	// List returns the table's TCP entries, IPv4 and IPv6.
	List() ([]Entry, error)
	// Delete deletes the TCP entries match holds for, and says how many.
	Delete(match func(Entry) bool) (int, error)
}

// Entry is one TCP connection-tracking entry.
type Entry struct {
	// Src and Dst are the original direction's: the client, and the
	// address and port it connected to.
	Src, Dst netip.AddrPort
	// ReplySrc is what answers: the endpoint a DNAT rule chose, or Dst
	// itself when none did (a connection the node passed on unchanged).
	ReplySrc netip.AddrPort
	State    TCPState
}

// TCPState is conntrack's state of a TCP connection (the kernel's
// enum tcp_conntrack).
type TCPState uint8

const (
	StateNone TCPState = iota
	StateSynSent
	StateSynRecv
	StateEstablished
	StateFinWait
	StateCloseWait
	StateLastAck
	StateTimeWait
	StateClose
)

// Ended tells whether the connection is over and its entry only waits to
// expire: nothing is served on it any more.
func (s TCPState) Ended() bool { return s == StateTimeWait || s == StateClose }

func (e Entry) String() string {
	return fmt.Sprintf("tcp %s -> %s (answered by %s, state %d)", e.Src, e.Dst, e.ReplySrc, e.State)
}

// Netlink is the real Conntrack: the kernel's table of the agent's
// network namespace, over netlink (what conntrack(8) uses), without
// running a program every count.
type Netlink struct{}

var families = []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}

func (Netlink) List() ([]Entry, error) {
	var out []Entry
	for _, fam := range families {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, fmt.Errorf("listing the conntrack table (family %d): %w", fam, err)
		}
		for _, f := range flows {
			if e, ok := entryOf(f); ok {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

func (Netlink) Delete(match func(Entry) bool) (int, error) {
	n := 0
	for _, fam := range families {
		deleted, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filter(match))
		n += int(deleted)
		if err != nil {
			return n, fmt.Errorf("deleting conntrack entries (family %d): %w", fam, err)
		}
	}
	return n, nil
}

// filter is match as netlink's filter of entries.
type filter func(Entry) bool

func (f filter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	e, ok := entryOf(flow)
	return ok && f(e)
}

// entryOf reads a TCP flow; ok is false for any other protocol.
func entryOf(f *netlink.ConntrackFlow) (Entry, bool) {
	if f.Forward.Protocol != unix.IPPROTO_TCP {
		return Entry{}, false
	}
	e := Entry{
		Src:      addrPort(f.Forward.SrcIP, f.Forward.SrcPort),
		Dst:      addrPort(f.Forward.DstIP, f.Forward.DstPort),
		ReplySrc: addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort),
	}
	if tcp, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
		e.State = TCPState(tcp.State)
	}
	return e, true
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// Fake is a Conntrack in memory, for tests: a table the test sets, and a
// record of every entry deleted.
type Fake struct {
	mu      sync.Mutex // guards the fields below
	entries []Entry
	deleted []Entry
	err     error
	calls   int
}

// NewFake returns a table holding entries.
func NewFake(entries ...Entry) *Fake { return &Fake{entries: entries} }

func (f *Fake) List() ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return slices.Clone(f.entries), nil
}

func (f *Fake) Delete(match func(Entry) bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return 0, f.err
	}
	var kept []Entry
	n := 0
	for _, e := range f.entries {
		if match(e) {
			f.deleted = append(f.deleted, e)
			n++
		} else {
			kept = append(kept, e)
		}
	}
	f.entries = kept
	return n, nil
}

// Set replaces the table, as connections open and end.
func (f *Fake) Set(entries ...Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = slices.Clone(entries)
}

// Fail makes every call fail with err (nil: succeed again).
func (f *Fake) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Entries is the table now.
func (f *Fake) Entries() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.entries)
}

// Deleted is every entry deleted so far, in order.
func (f *Fake) Deleted() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deleted)
}

// Calls is how many times the table was listed or deleted from.
func (f *Fake) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}
