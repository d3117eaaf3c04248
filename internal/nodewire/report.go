package nodewire

import (
	"net/netip"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// The other direction: an agent encodes what it reports of its node, the
// server decodes it.

// EncodeReport is the wire form of an agent's report.
func EncodeReport(r *report.Report) *weirv1.Report {
	out := &weirv1.Report{Full: r.Full, RemovedServices: r.Removed}
	if r.Node != (report.NodeReport{}) {
		out.NodeHealth = &weirv1.NodeHealth{
			HealthzCode: int32(r.Node.HealthzCode), LivezCode: int32(r.Node.LivezCode),
			NodeEligible: r.Node.NodeEligible, LastUpdated: timestamp(r.Node.LastUpdated),
		}
	}
	if r.LastSync != 0 {
		out.LastSyncDuration = durationpb.New(r.LastSync)
	}
	if r.BGP != nil {
		out.Bgp = &weirv1.BgpSessions{Sessions: EncodeSessions(r.BGP.Sessions), Announcements: EncodeAnnouncements(r.BGP.Announcements)}
	}
	if r.Moved != nil {
		out.MovedConnections = EncodeMoved(*r.Moved)
	}
	if r.Drain != nil {
		out.Drain = EncodeDrain(*r.Drain)
	}
	for _, s := range r.Services {
		out.Services = append(out.Services, &weirv1.ServiceHealth{
			Namespace: s.Namespace, Name: s.Name,
			LocalReady: int32(s.LocalReady), LocalServing: int32(s.LocalServing), LocalTerminating: int32(s.LocalTerminating),
			HealthCheckNodePort: int32(s.HealthCheckNodePort), HealthCheckCode: int32(s.HealthCheckCode), HealthCheckError: s.HealthCheckError,
		})
	}
	return out
}

// DecodeReport reads an agent's report. It never fails: a report only
// informs, so what does not parse (an address, a port out of range) is
// read as absent, which every reader of a report already handles.
func DecodeReport(r *weirv1.Report) *report.Report {
	out := &report.Report{Full: r.GetFull(), Removed: r.GetRemovedServices(), LastSync: r.GetLastSyncDuration().AsDuration()}
	if nh := r.GetNodeHealth(); nh != nil {
		out.Node = report.NodeReport{HealthzCode: int(nh.GetHealthzCode()), LivezCode: int(nh.GetLivezCode()),
			NodeEligible: nh.GetNodeEligible(), LastUpdated: timeOf(nh.GetLastUpdated())}
	}
	if b := r.GetBgp(); b != nil {
		out.BGP = &report.BGPReport{Sessions: DecodeSessions(b.GetSessions()), Announcements: DecodeAnnouncements(b.GetAnnouncements())}
	}
	if m := r.GetMovedConnections(); m != nil {
		moved := DecodeMoved(m)
		out.Moved = &moved
	}
	if d := r.GetDrain(); d != nil {
		out.Drain = &report.DrainReport{Connections: int(d.GetConnectionsLeft()), CountedAt: timeOf(d.GetCountedAt()),
			Deadline: timeOf(d.GetDeadline()), Ended: int(d.GetEndedAtDeadline())}
	}
	for _, s := range r.GetServices() {
		p := s.GetHealthCheckNodePort()
		if p < 0 || p > 65535 {
			p = 0
		}
		out.Services = append(out.Services, report.ServiceReport{
			Namespace: s.GetNamespace(), Name: s.GetName(),
			LocalReady: int(s.GetLocalReady()), LocalServing: int(s.GetLocalServing()), LocalTerminating: int(s.GetLocalTerminating()),
			HealthCheckNodePort: uint16(p), HealthCheckCode: int(s.GetHealthCheckCode()), HealthCheckError: s.GetHealthCheckError(),
		})
	}
	return out
}

// EncodeMoved is the wire form of what a node did with moved connections.
func EncodeMoved(m report.MovedReport) *weirv1.MovedConnections {
	return &weirv1.MovedConnections{NextNode: m.Next, NotAnswering: m.NotAnswering, PassedPackets: m.PassedPackets,
		PassedConnections: m.PassedConnections, TakenPacketsByHops: m.TakenPackets[:], UnownedPackets: m.UnownedPackets,
		ChangedAt: timestamp(m.ChangedAt)}
}

// DecodeMoved reads what a node did with moved connections; counts by
// hops beyond the four it knows are added to the last.
func DecodeMoved(m *weirv1.MovedConnections) report.MovedReport {
	out := report.MovedReport{Next: m.GetNextNode(), NotAnswering: m.GetNotAnswering(), PassedPackets: m.GetPassedPackets(),
		PassedConnections: m.GetPassedConnections(), UnownedPackets: m.GetUnownedPackets(), ChangedAt: timeOf(m.GetChangedAt())}
	for i, n := range m.GetTakenPacketsByHops() {
		out.TakenPackets[min(i, len(out.TakenPackets)-1)] += n
	}
	return out
}

// EncodeDrain is the wire form of a node's drain (the agent's report, the
// server's status of the node).
func EncodeDrain(d report.DrainReport) *weirv1.DrainStatus {
	return &weirv1.DrainStatus{ConnectionsLeft: uint32(max(d.Connections, 0)), CountedAt: timestamp(d.CountedAt),
		Deadline: timestamp(d.Deadline), EndedAtDeadline: uint32(max(d.Ended, 0))}
}

// EncodeSessions is the wire form of a speaker's sessions; never nil, so
// that a report of no sessions says so.
func EncodeSessions(sessions []report.BGPSession) []*weirv1.BgpSession {
	out := make([]*weirv1.BgpSession, 0, len(sessions))
	for _, s := range sessions {
		out = append(out, EncodeSession(s))
	}
	return out
}

// DecodeSessions reads a speaker's sessions.
func DecodeSessions(sessions []*weirv1.BgpSession) []report.BGPSession {
	out := make([]report.BGPSession, 0, len(sessions))
	for _, s := range sessions {
		out = append(out, DecodeSession(s))
	}
	return out
}

// EncodeAnnouncements is the wire form of what a speaker announces.
func EncodeAnnouncements(announcements []report.BGPAnnouncement) []*weirv1.BgpAnnouncement {
	var out []*weirv1.BgpAnnouncement
	for _, an := range announcements {
		p := ""
		if an.Prefix.IsValid() {
			p = an.Prefix.String()
		}
		out = append(out, &weirv1.BgpAnnouncement{Prefix: p, NextHop: addrString(an.NextHop), Weight: an.Weight})
	}
	return out
}

// DecodeAnnouncements reads what a speaker announces.
func DecodeAnnouncements(announcements []*weirv1.BgpAnnouncement) []report.BGPAnnouncement {
	var out []report.BGPAnnouncement
	for _, an := range announcements {
		p, _ := netip.ParsePrefix(an.GetPrefix())
		hop, _ := netip.ParseAddr(an.GetNextHop())
		out = append(out, report.BGPAnnouncement{Prefix: p, NextHop: hop, Weight: an.GetWeight()})
	}
	return out
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
