package main

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weirlb/weir/internal/bgpnumbers"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) describePeer(ctx context.Context, c client, st weirv1.StatusServiceClient, o object, output string) (string, error) {
	peer := o.(*weirv1.BgpPeer)
	nodes, err := listNodes(ctx, c, &weirv1.ListNodesRequest{})
	if err != nil {
		return "", err
	}
	statuses, err := nodeStatuses(ctx, st)
	if err != nil {
		return "", err
	}
	peering := peerSessions(peer, nodes, statuses)
	if output != "table" {
		var docs []proto.Message
		for _, n := range peering {
			docs = append(docs, n)
		}
		k, _ := kindFor("peer")
		return describeDocument(k, o, map[string]any{"sessions": docs}, output)
	}

	var b strings.Builder
	kv := slices.Concat(a.metaFields(o), peerFields(peer))
	if peer.GetBfd() == nil {
		kv = append(kv, "BFD", "<none>")
	}
	fields(&b, "", kv...)
	if peer.GetBfd() != nil {
		bfdFields(&b, peer.GetBfd())
	}
	var rows [][]string
	for _, n := range peering {
		for _, s := range n.GetBgpSessions() {
			rows = append(rows, append([]string{n.GetName()}, a.sessionCells(s, n)...))
		}
		if len(n.GetBgpSessions()) == 0 {
			none := "<no session reported>"
			if !n.GetConnected() {
				none += " (agent not connected)"
			}
			rows = append(rows, []string{n.GetName(), "-", "-", none, "-", "-", "-", "-"})
		}
	}
	b.WriteString("\n")
	section(&b, "Sessions", append([]string{"NODE"}, sessionHeader...), rows)
	return b.String(), nil
}

// peerFields are every field of a peer, defaults filled in as the node
// speakers fill them; the password, which the server never reads back,
// only as whether it can be known.
func peerFields(p *weirv1.BgpPeer) []string {
	address := p.GetAddress()
	if address == "" {
		address = "unnumbered on " + p.GetInterface()
	}
	asn := strconv.FormatUint(uint64(p.GetAsn()), 10)
	if d := p.GetDynamicAsn(); d != "" {
		asn = d + " (dynamic: as the router's OPEN says)"
	}
	multihop := "<none> (directly connected)"
	if ttl := p.GetEbgpMultihopTtl(); ttl != 0 {
		multihop = strconv.FormatUint(uint64(ttl), 10)
	}
	hold := timer(p.GetHoldTimeSeconds(), bgpnumbers.DefaultHoldTime)
	keepalive := strconv.Itoa(int(p.GetKeepaliveSeconds())) + "s"
	if p.GetKeepaliveSeconds() == 0 {
		keepalive = "a third of the hold time"
	}
	nodes := "all"
	if len(p.GetNodeSelector()) > 0 {
		nodes = labels(p.GetNodeSelector())
	}
	return []string{
		"Address", address,
		"Interface", orNone(p.GetInterface()),
		"Port", defaulted(int(p.GetPort()), 179, ""),
		"ASN", asn,
		"My ASN", strconv.FormatUint(uint64(p.GetMyAsn()), 10),
		"VRF", orNone(p.GetVrf()),
		"eBGP Multihop TTL", multihop,
		"Source Address", orNone(p.GetSourceAddress()),
		"Hold Time", hold,
		"Keepalive", keepalive,
		"Connect Retry", timer(p.GetConnectRetrySeconds(), bgpnumbers.DefaultConnectRetry),
		"Graceful Restart", yesNo(p.GetGracefulRestart()),
		"Password", password(p),
		"Node Selector", nodes,
	}
}

// password says whether a peer's password is set where the server tells;
// it never does, the password being write-only.
func password(p *weirv1.BgpPeer) string {
	if p.GetPassword() != "" {
		return "<set>"
	}
	return "<write-only: not read back>"
}

// timer is a peer's timer in seconds, 0 being the speaker's default.
func timer(s int32, def time.Duration) string {
	return defaulted(int(s), int(def/time.Second), "s")
}

// defaulted is v with its unit, or the default it stands for when 0.
func defaulted(v, def int, unit string) string {
	if v == 0 {
		return strconv.Itoa(def) + unit + " (default)"
	}
	return strconv.Itoa(v) + unit
}

// bfdFields are a peer's BFD profile, defaults filled in.
func bfdFields(b *strings.Builder, bfd *weirv1.BfdProfile) {
	b.WriteString("BFD:\n")
	fields(b, "  ",
		"Receive Interval", defaulted(int(bfd.GetReceiveIntervalMs()), 300, "ms"),
		"Transmit Interval", defaulted(int(bfd.GetTransmitIntervalMs()), 300, "ms"),
		"Detect Multiplier", defaulted(int(bfd.GetDetectMultiplier()), 3, ""),
		"Passive", yesNo(bfd.GetPassive()),
		"Minimum TTL (multi-hop)", defaulted(int(bfd.GetMinimumTtl()), 254, ""))
}

// peerSessions are, per node that the peer's node selector picks or
// whose agent reports a session with it, the node's status with only
// those sessions (none for a node that reports none), by node name.
func peerSessions(p *weirv1.BgpPeer, nodes []*weirv1.Node, statuses map[string]*weirv1.NodeStatus) []*weirv1.NodeStatus {
	picked := map[string]bool{}
	for _, n := range nodes {
		if selects(p.GetNodeSelector(), n.GetMetadata().GetLabels()) {
			picked[n.GetMetadata().GetName()] = true
		}
	}
	var out []*weirv1.NodeStatus
	for name, n := range statuses {
		var with []*weirv1.BgpSession
		for _, s := range n.GetBgpSessions() {
			if sessionWith(p, s) {
				with = append(with, s)
			}
		}
		if len(with) > 0 || picked[name] {
			out = append(out, &weirv1.NodeStatus{Name: name, Connected: n.GetConnected(), LastSeen: n.GetLastSeen(), BgpSessions: with})
			delete(picked, name)
		}
	}
	for name := range picked { // nodes the status API does not list
		out = append(out, &weirv1.NodeStatus{Name: name})
	}
	slices.SortFunc(out, func(x, y *weirv1.NodeStatus) int { return strings.Compare(x.GetName(), y.GetName()) })
	return out
}

// selects says whether a node selector (all these labels; empty: every
// node) picks a node with these labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if l, ok := labels[k]; !ok || l != v {
			return false
		}
	}
	return true
}

// sessionWith says whether s, a node speaker's session, is with peer p. A
// session names no peer, only the router's address: a link-local
// router's with its interface as zone, an unnumbered one's being the
// link-local neighbour the node found on the peer's interface. Two peers
// with one address (in two VRFs, say) both claim its sessions.
func sessionWith(p *weirv1.BgpPeer, s *weirv1.BgpSession) bool {
	got, err := netip.ParseAddr(s.GetPeerAddress())
	if err != nil {
		return false
	}
	if p.GetAddress() == "" {
		return got.IsLinkLocalUnicast() && got.Zone() == p.GetInterface()
	}
	want, err := netip.ParseAddr(p.GetAddress())
	if err != nil || got.WithZone("") != want.WithZone("") {
		return false
	}
	return got.Zone() == "" || p.GetInterface() == "" || got.Zone() == p.GetInterface()
}
