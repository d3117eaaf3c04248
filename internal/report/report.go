// Package report is what an agent tells the server of its node: the
// health answers, every service as the node sees it, its BGP speaker's
// sessions and announcements, and what it still serves while drained. A
// leaf: the health checks, the node speaker, the drain and the syncer fill
// or send it without importing one another.
package report

import (
	"net/netip"
	"slices"
	"time"
)

// ServiceReport is one service as this node sees it.
type ServiceReport struct {
	Namespace, Name                            string
	LocalReady, LocalServing, LocalTerminating int
	HealthCheckNodePort                        uint16
	HealthCheckCode                            int // 0 when nothing listens
	HealthCheckError                           string
}

// NodeReport is the node's own health answers.
type NodeReport struct {
	HealthzCode, LivezCode int
	LastUpdated            time.Time
	NodeEligible           bool
}

// Report is what changed since the last report, or everything when Full.
// Each observer fills its part; a zero part is absent.
type Report struct {
	Full     bool
	Node     NodeReport
	Services []ServiceReport
	Removed  []string // "namespace/name"
	LastSync time.Duration
	// BGP is every session of the node's speaker, when they changed.
	BGP *BGPReport
	// Moved is what the node did with moved connections' packets, when
	// it changed; nil on a node that does not pass them on.
	Moved *MovedReport
	// Drain is the node's drain, when it changed; a zero DrainReport:
	// the node is not drained.
	Drain *DrainReport
}

// MovedReport is what a node's rules did with the packets of established
// connections that a router moved (agent/flows), with the kernel's counts
// since the node's table was made.
type MovedReport struct {
	// Next is the node the packets go to now; "" when none can be
	// reached. NotAnswering are next nodes passed over.
	Next         string   `json:",omitempty"`
	NotAnswering []string `json:",omitempty"`
	// Passed on to the next node.
	PassedPackets, PassedConnections uint64
	// TakenPackets were passed here by peers and served here, by the
	// nodes they crossed: 1, 2, 3, 4 or more.
	TakenPackets [4]uint64
	// UnownedPackets went round the ring (or found none) and were served
	// here as new, to be refused by their endpoint.
	UnownedPackets uint64
	// ChangedAt is the reading that saw the last change.
	ChangedAt time.Time
}

// Equal reports whether two reports say the same, apart from when.
func (m MovedReport) Equal(o MovedReport) bool {
	return m.Next == o.Next && slices.Equal(m.NotAnswering, o.NotAnswering) && m.PassedPackets == o.PassedPackets &&
		m.PassedConnections == o.PassedConnections && m.TakenPackets == o.TakenPackets && m.UnownedPackets == o.UnownedPackets
}

// DrainReport is what a drained node still serves: the external
// connections it holds (its conntrack entries of TCP connections it
// DNAT'ed to a load-balancer IP, an external IP or a node port).
type DrainReport struct {
	// Connections is how many it served when it counted them, at
	// CountedAt (zero before the first count).
	Connections int
	CountedAt   time.Time
	// Deadline is when the node ends them; zero: no deadline.
	Deadline time.Time
	// Ended is how many the node ended when Deadline passed.
	Ended int
}

// BGPReport is the node speaker's sessions and what it announces.
type BGPReport struct {
	Sessions      []BGPSession
	Announcements []BGPAnnouncement // by prefix
}

// BGPAnnouncement is one prefix the speaker announces.
type BGPAnnouncement struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
	Weight  uint32
}

// BGPSession is the speaker's session with one router.
type BGPSession struct {
	PeerAddress netip.Addr
	PeerASN     uint32
	State       BGPState
	Since       time.Time
	// LastError is the session's last NOTIFICATION, from either side.
	LastError string
	// Families is the session per address family.
	Families []BGPFamily
	// BFD is the BFD session's state beside it; "" without BFD.
	BFD string
}

// BGPFamily is one address family of a BGP session.
type BGPFamily struct {
	Name                     Family
	Negotiated               bool
	Sent, Received, Accepted uint64
}

// BGPState is a BGP session's finite-state-machine state (RFC 4271,
// section 8.2.2), in the lower-case words the speaker reports.
type BGPState string

const (
	BGPIdle        BGPState = "idle"
	BGPConnect     BGPState = "connect"
	BGPActive      BGPState = "active"
	BGPOpenSent    BGPState = "opensent"
	BGPOpenConfirm BGPState = "openconfirm"
	BGPEstablished BGPState = "established"
)

// Family is an IP address family.
type Family string

const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// Merge adds o's parts to r.
func (r *Report) Merge(o *Report) {
	r.Full = r.Full || o.Full
	if o.Node != (NodeReport{}) {
		r.Node = o.Node
	}
	r.Services = append(r.Services, o.Services...)
	r.Removed = append(r.Removed, o.Removed...)
	r.LastSync = max(r.LastSync, o.LastSync)
	if o.BGP != nil {
		r.BGP = o.BGP
	}
	if o.Moved != nil {
		r.Moved = o.Moved
	}
	if o.Drain != nil {
		r.Drain = o.Drain
	}
}
