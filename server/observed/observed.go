// Package observed is what the server knows of each node from its agent:
// the connection, the versions sent and applied, and what the agent
// reports of its health answers, its services, its BGP speaker and what
// it still serves while drained. The
// hub (server/agentsync) keeps it; the status API, the receive verdicts
// and the replicas read it. No transport types: reports arrive decoded.
package observed

import (
	"time"

	"github.com/weirlb/weir/internal/report"
)

// Node is what the server knows of one node's agent. Field names are
// part of what replicas share through etcd (server/replicas), so they
// change only with that format.
type Node struct {
	Node           string
	Connected      bool
	SentVersion    uint64
	AppliedVersion uint64
	// Covered is the cache version up to which the node has been sent
	// every change that concerns it.
	Covered uint64
	// ProgrammingLatency is, for the last state the node applied that held
	// changes, the time from the oldest change's acceptance to the ACK.
	ProgrammingLatency time.Duration
	// LastError is the agent's last NACK, cleared by the next ACK.
	LastError        string
	LastErrorVersion uint64
	LastSeen         time.Time
	// AgentVersion is the agent's build version, from its hello;
	// CertificateNotAfter the end of its stream's client certificate.
	// Left out when unknown, so that what replicas share reads as before
	// (an older replica ignores them).
	AgentVersion        string    `json:",omitzero"`
	CertificateNotAfter time.Time `json:",omitzero"`
	// Health is what the node last reported of its health answers.
	Health   Health
	LastSync time.Duration
	// Services is, per "namespace/name", what the node sees of a service.
	Services map[string]Service
	// BGPSessions are the node speaker's sessions as last reported; none
	// when the node runs no speaker. Never changed once recorded: a new
	// report replaces the slice.
	BGPSessions []report.BGPSession `json:"-"`
	// BGPAnnouncements are what the node's speaker announces, by prefix.
	BGPAnnouncements []report.BGPAnnouncement `json:"-"`
	// Moved is what the node did with moved connections' packets, as
	// last reported; zero when it does not pass them on (and then left
	// out of what replicas share).
	Moved report.MovedReport `json:",omitzero"`
	// Drain is what the node still serves while drained, as last
	// reported; zero when it is not drained. Left out then, so that what
	// replicas share reads as before.
	Drain Drain `json:",omitzero"`
}

// Drain is what a drained node still serves: the external connections
// its agent counts, and what it ended at the drain's deadline.
type Drain struct {
	ConnectionsLeft int
	CountedAt       time.Time
	// Deadline is the drain's deadline as the agent knows it; zero: none.
	Deadline        time.Time `json:",omitzero"`
	EndedAtDeadline int       `json:",omitzero"`
}

// Progress is where a node stands toward a version, and no more: what a
// wait for a version reads at every status change.
type Progress struct {
	Node      string
	Connected bool
	// Programmed is the node's ProgrammedVersion.
	Programmed       uint64
	LastError        string
	LastErrorVersion uint64
}

// Applying says the node may still reach version rev: its agent is
// connected, has not programmed rev, and has not refused a state that
// holds it. Waiting for rev is over once no node is applying it.
func (p Progress) Applying(rev uint64) bool {
	return p.Connected && p.Programmed < rev && (p.LastError == "" || p.LastErrorVersion < rev)
}

// Progress is n's progress.
func (n *Node) Progress() Progress {
	return Progress{Node: n.Node, Connected: n.Connected, Programmed: n.ProgrammedVersion(), LastError: n.LastError, LastErrorVersion: n.LastErrorVersion}
}

// ProgrammedVersion is the highest store revision such that everything up
// to it that concerns the node is applied in its kernel: what the agent
// acknowledged, or, once it has acknowledged everything it was sent, what
// that covered.
func (n Node) ProgrammedVersion() uint64 {
	if n.AppliedVersion >= n.SentVersion {
		return max(n.AppliedVersion, n.Covered)
	}
	return n.AppliedVersion
}

// Programmed: the node's agent is connected and applied the newest state
// it was sent.
func (n Node) Programmed() bool {
	return n.Connected && n.AppliedVersion >= n.SentVersion && n.LastError == ""
}

// Health is a node's own health answers (port 10256).
type Health struct {
	HealthzCode, LivezCode int
	LastUpdated            time.Time
	NodeEligible           bool
}

// Service is one service on one node.
type Service struct {
	LocalReady, LocalServing, LocalTerminating int
	HealthCheckNodePort                        int
	// HealthCheckCode is what the health-check port answers; 0 when it is
	// not open, and then HealthCheckError says why.
	HealthCheckCode  int
	HealthCheckError string
}

// Record folds an agent's report into what is known of its node: a full
// report replaces, a partial one changes what it names.
func (n *Node) Record(r *report.Report) {
	if r.Node != (report.NodeReport{}) {
		n.Health = Health{HealthzCode: r.Node.HealthzCode, LivezCode: r.Node.LivezCode,
			NodeEligible: r.Node.NodeEligible, LastUpdated: r.Node.LastUpdated}
	}
	if r.LastSync != 0 {
		n.LastSync = r.LastSync
	}
	if r.Full || r.BGP != nil {
		var bgp report.BGPReport
		if r.BGP != nil {
			bgp = *r.BGP
		}
		n.BGPSessions, n.BGPAnnouncements = bgp.Sessions, bgp.Announcements
	}
	if r.Full || r.Moved != nil {
		n.Moved = report.MovedReport{}
		if r.Moved != nil {
			n.Moved = *r.Moved
		}
	}
	if r.Full || r.Drain != nil {
		var d report.DrainReport
		if r.Drain != nil {
			d = *r.Drain
		}
		n.Drain = Drain{ConnectionsLeft: d.Connections, CountedAt: d.CountedAt, Deadline: d.Deadline, EndedAtDeadline: d.Ended}
	}
	if r.Full || n.Services == nil {
		n.Services = map[string]Service{}
	}
	for _, s := range r.Services {
		n.Services[s.Namespace+"/"+s.Name] = Service{
			LocalReady: s.LocalReady, LocalServing: s.LocalServing, LocalTerminating: s.LocalTerminating,
			HealthCheckNodePort: int(s.HealthCheckNodePort), HealthCheckCode: s.HealthCheckCode, HealthCheckError: s.HealthCheckError,
		}
	}
	for _, key := range r.Removed {
		delete(n.Services, key)
	}
}
