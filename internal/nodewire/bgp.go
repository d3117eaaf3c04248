package nodewire

import (
	"net/netip"

	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// The BGP session states and address families as the wire says them. The
// enums are what readers use; the lower-case words are the deprecated
// string fields, still filled so that clients and server replicas of the
// previous release read them, and still read when a message comes from one
// (its enum is then unspecified).

var sessionStates = map[report.BGPState]weirv1.BgpSessionState{
	report.BGPIdle:        weirv1.BgpSessionState_BGP_SESSION_STATE_IDLE,
	report.BGPConnect:     weirv1.BgpSessionState_BGP_SESSION_STATE_CONNECT,
	report.BGPActive:      weirv1.BgpSessionState_BGP_SESSION_STATE_ACTIVE,
	report.BGPOpenSent:    weirv1.BgpSessionState_BGP_SESSION_STATE_OPEN_SENT,
	report.BGPOpenConfirm: weirv1.BgpSessionState_BGP_SESSION_STATE_OPEN_CONFIRM,
	report.BGPEstablished: weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED,
}

var families = map[report.Family]weirv1.AddressFamily{
	report.IPv4: weirv1.AddressFamily_ADDRESS_FAMILY_IPV4,
	report.IPv6: weirv1.AddressFamily_ADDRESS_FAMILY_IPV6,
}

// SessionState is the wire form of a session's state; unspecified for a
// word the enum does not have.
func SessionState(s report.BGPState) weirv1.BgpSessionState { return sessionStates[s] }

// AddressFamily is the wire form of an address family; unspecified for a
// name the enum does not have.
func AddressFamily(f report.Family) weirv1.AddressFamily { return families[f] }

// StateOf reads a session's state: its enum, or the deprecated word when
// the enum is unspecified (a sender of the previous release).
func StateOf(s *weirv1.BgpSession) report.BGPState {
	for word, e := range sessionStates {
		if e == s.GetSessionState() {
			return word
		}
	}
	//lint:ignore SA1019 the word is what a sender of the previous release fills
	return report.BGPState(s.GetState())
}

// familied is a message that says an address family both ways
// (BgpFamily, ServiceFamilyStatus).
type familied interface {
	GetAddressFamily() weirv1.AddressFamily
	GetFamily() string
}

// FamilyOf reads a message's address family: its enum, or the deprecated
// name when the enum is unspecified (a sender of the previous release).
func FamilyOf(m familied) report.Family {
	for name, v := range families {
		if v == m.GetAddressFamily() {
			return name
		}
	}
	return report.Family(m.GetFamily())
}

// EncodeSession is the wire form of one session, enum and word.
func EncodeSession(s report.BGPSession) *weirv1.BgpSession {
	ps := &weirv1.BgpSession{PeerAddress: addrString(s.PeerAddress), PeerAsn: s.PeerASN,
		SessionState: SessionState(s.State), LastError: s.LastError, EstablishedSince: timestamp(s.Since), BfdState: s.BFD}
	ps.State = string(s.State) //lint:ignore SA1019 filled for readers of the previous release
	for _, f := range s.Families {
		pf := &weirv1.BgpFamily{AddressFamily: AddressFamily(f.Name), Negotiated: f.Negotiated, Sent: f.Sent, Received: f.Received, Accepted: f.Accepted}
		pf.Family = string(f.Name) //lint:ignore SA1019 filled for readers of the previous release
		ps.Families = append(ps.Families, pf)
	}
	return ps
}

// DecodeSession reads one session, preferring the enums.
func DecodeSession(s *weirv1.BgpSession) report.BGPSession {
	peer, _ := netip.ParseAddr(s.GetPeerAddress())
	rs := report.BGPSession{PeerAddress: peer, PeerASN: s.GetPeerAsn(), State: StateOf(s),
		LastError: s.GetLastError(), Since: timeOf(s.GetEstablishedSince()), BFD: s.GetBfdState()}
	for _, f := range s.GetFamilies() {
		rs.Families = append(rs.Families, report.BGPFamily{Name: FamilyOf(f), Negotiated: f.GetNegotiated(),
			Sent: f.GetSent(), Received: f.GetReceived(), Accepted: f.GetAccepted()})
	}
	return rs
}
