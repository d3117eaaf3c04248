package flows

// Which next nodes are alive. A packet passed to a node that is gone (a
// reboot, a power loss, a node whose agent and tables were wiped) is
// lost, and every retransmission with it: the ring must skip such a node
// at once. The probe goes the way moved packets go: an ICMP echo request,
// framed for the peer's device and sent through this node's, so that the
// answer (the peer's kernel replies over the LAN) proves the peer's
// device and tunnel take packets, not only that its host is up. The
// peer's table marks the request on its way in (its identifier,
// datapath.FlowProbeID, becomes FlowProbeAnsweredID), so the answer says
// whether the rules are there too: a node whose rules were flushed while
// its agent was away answers unmarked, and is passed over like a silent
// one (a peer that never marked an answer runs an older agent, and its
// answers count as they are). An agent that died while its tables still
// forward stays on the ring: its node still holds and serves its
// connections.

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/weirlb/weir/datapath"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Probe timing: a node that answered none of the probes of the last two
// seconds is passed over. Passing over a node that is alive loses the
// connections it holds, so the deadline leaves room for a busy machine
// (in the lab, a loaded machine delayed answers by over a second), and a
// prober that was not scheduled for a while (its own ticks late) starts
// counting again rather than blame its peers. Two seconds stay within
// TCP's first retransmissions (0.2 + 0.4 + 0.8 + 1.6 s), so a connection
// whose packets a dead node swallowed meanwhile goes on.
const (
	probeInterval = 200 * time.Millisecond
	probeDeadline = 10 * probeInterval
)

// probeTarget is a next node the probe asks.
type probeTarget struct {
	name string
	addr netip.Addr // its outer address (IPv4, or IPv6 on IPv6-only nodes)
	mac  net.HardwareAddr
}

// Run probes the next nodes until ctx ends, and moves the route when the
// first alive one changes. The probes go in the node's outer family: IPv4,
// or IPv6 on IPv6-only nodes.
func (f *Flows) Run(ctx context.Context) {
	answered := make(chan answer, 64)
	listening := 0
	for _, l := range []struct {
		network, address string
		protocol         int // of the ICMP message, for icmp.ParseMessage
	}{{"ip4:icmp", "0.0.0.0", 1}, {"ip6:ipv6-icmp", "::", 58}} {
		replies, err := icmp.ListenPacket(l.network, l.address)
		if err != nil {
			f.cfg.Log.Warn("next nodes are not probed in one family: a node that goes away takes moved connections with it until the server drops it", "network", l.network, "error", err)
			continue
		}
		listening++
		defer replies.Close()
		stop := context.AfterFunc(ctx, func() { replies.Close() })
		defer stop()
		go readAnswers(replies, l.protocol, answered)
	}
	if listening == 0 {
		return
	}
	s := &sender{iface: f.cfg.Interface, log: f.cfg.Log}
	defer s.close()
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-answered:
			f.answered(a.from, a.byTable, time.Now())
		case now := <-tick.C:
			if now.Sub(last) > 3*probeInterval {
				f.restartClock(now)
			}
			last = now
			f.takeAnswers(answered, now)
			if s.send(f.probeTargets(now)) {
				f.judge(time.Now())
			}
		}
	}
}

// answer is an echo reply to a probe: who sent it, and whether its table
// marked the request.
type answer struct {
	from    netip.Addr
	byTable bool
}

// readAnswers passes on the echo replies to the probes until replies is
// closed; protocol is the messages' (1: ICMP, 58: ICMPv6).
func readAnswers(replies *icmp.PacketConn, protocol int, answered chan<- answer) {
	buf := make([]byte, 1500)
	for {
		n, from, err := replies.ReadFrom(buf)
		if err != nil {
			return
		}
		m, err := icmp.ParseMessage(protocol, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply {
			continue
		}
		e, ok := m.Body.(*icmp.Echo)
		if !ok || e.ID != datapath.FlowProbeID && e.ID != datapath.FlowProbeAnsweredID {
			continue
		}
		if a, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP); ok {
			select {
			case answered <- answer{from: a.Unmap(), byTable: e.ID == datapath.FlowProbeAnsweredID}:
			default:
			}
		}
	}
}

// takeAnswers records the answers already read, so that they count
// before any judgement.
func (f *Flows) takeAnswers(answered <-chan answer, now time.Time) {
	for {
		select {
		case a := <-answered:
			f.answered(a.from, a.byTable, now)
		default:
			return
		}
	}
}

// sender sends the probes through the device, on a raw socket it opens
// again when the device is remade or the family changes.
type sender struct {
	iface string
	log   *slog.Logger

	conn  *packet.Conn
	index int  // of the device conn is bound to
	is6   bool // the family conn sends
	seq   int
}

// send sends one round of echo requests from src, the node's outer
// address, and its device's MAC to the targets. It is false when no round
// went out: nothing to probe, or no device to send through.
func (s *sender) send(src netip.Addr, srcMAC net.HardwareAddr, targets []probeTarget) bool {
	if len(targets) == 0 || !src.IsValid() {
		return false
	}
	ifi, err := net.InterfaceByName(s.iface)
	if err != nil {
		return false
	}
	if s.conn == nil || s.index != ifi.Index || s.is6 != src.Is6() {
		s.close()
		etherType := ethernet.EtherTypeIPv4
		if src.Is6() {
			etherType = ethernet.EtherTypeIPv6
		}
		if s.conn, err = packet.Listen(ifi, packet.Raw, int(etherType), nil); err != nil {
			s.log.Warn("probing the next nodes", "error", err)
			s.conn = nil
			return false
		}
		s.index, s.is6 = ifi.Index, src.Is6()
	}
	s.seq++
	for _, t := range targets {
		frame, err := echoFrame(srcMAC, t.mac, src, t.addr, datapath.FlowProbeID, s.seq)
		if err == nil {
			_, _ = s.conn.WriteTo(frame, &packet.Addr{HardwareAddr: t.mac})
		}
	}
	return true
}

func (s *sender) close() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// echoFrame is an Ethernet frame holding an ICMP (ICMPv6) echo request
// from src to dst.
func echoFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, id, seq int) ([]byte, error) {
	echo := &icmp.Echo{ID: id, Seq: seq & 0xffff, Data: []byte("weir flows")}
	if src.Is6() {
		body, err := (&icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: echo}).Marshal(icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice()))
		if err != nil {
			return nil, err
		}
		ip := make([]byte, 40, 40+len(body))
		ip[0] = 6 << 4
		binary.BigEndian.PutUint16(ip[4:], uint16(len(body)))
		ip[6] = 58 // ICMPv6
		ip[7] = 64 // hop limit
		s, d := src.As16(), dst.As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
		ip = append(ip, body...)
		return (&ethernet.Frame{Destination: dstMAC, Source: srcMAC, EtherType: ethernet.EtherTypeIPv6, Payload: ip}).MarshalBinary()
	}
	body, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: echo}).Marshal(nil)
	if err != nil {
		return nil, err
	}
	ip := make([]byte, 20, 20+len(body))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(body)))
	ip[8] = 64 // TTL
	ip[9] = 1  // ICMP
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	ip = append(ip, body...)
	return (&ethernet.Frame{Destination: dstMAC, Source: srcMAC, EtherType: ethernet.EtherTypeIPv4, Payload: ip}).MarshalBinary()
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
