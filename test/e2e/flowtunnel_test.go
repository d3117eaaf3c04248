package e2e

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/weirlb/weir/agent/flows"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// TestFlowTunnelTakesOnlyItsPeers: the tunnel of moved connections is no
// way in. A host on the nodes' LAN that is not a node sends node1's VXLAN
// port what a peer would (SYNs from a spoofed client to a load-balancer
// IP, a datagram to a UDP one): no pod sees any of it, and node1 counts
// it refused. node2, a real peer, sends through the tunnel what the ring
// never passes on (a datagram, a SYN to a cluster IP): no pod sees it
// either. A SYN a peer passes on (the ring does, for a reused client
// port) meets the service's loadBalancerSourceRanges as one from the
// router does: outside them dropped, inside them served.
func TestFlowTunnelTakesOnlyItsPeers(t *testing.T) {
	c := startCluster(t)
	createWeb(t, c)
	node1, node2 := c.Nodes[0], c.Nodes[1]
	udpVIP := netip.MustParseAddrPort("203.0.113.151:53")
	rangedVIP := netip.MustParseAddrPort("203.0.113.152:80")
	udp := &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "tunnel-udp"},
		Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER, ClusterIps: []string{"10.96.0.151"},
			Ports: []*weirv1.ServicePort{{Name: "dns", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: weirlab.PodPort, NodePort: 30151}}},
		Status: &weirv1.ServiceStatus{LoadBalancerIps: []string{udpVIP.Addr().String()}},
	}
	udpSlices := endpointSlices("tunnel-udp", c.Pods())
	for _, s := range udpSlices {
		s.Ports = []*weirv1.EndpointPort{{Name: "dns", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: weirlab.PodPort}}
	}
	createServiceWithSlices(t, c, udp, udpSlices)
	ranged := lbService("tunnel-ranged", 30152, []string{"10.96.0.152"}, []string{rangedVIP.Addr().String()})
	ranged.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/28"}
	createService(t, c, ranged, c.Pods())

	taps := tapPods(t, c.Pods())
	inRanges, outsideRanges := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("198.51.100.77")
	// Each kind of packet carries its own tag (a TCP sequence number, a
	// datagram's first bytes), which neither DNAT nor masquerading
	// changes.
	const (
		strangerSYN uint32 = 0x7e110001 + iota
		strangerDatagram
		peerDatagram
		peerSYNToClusterIP
		peerSYNOutsideRanges
		peerSYNInRanges
	)
	send := func(from *lab.Netns, n int, packet func(i int) []byte) {
		t.Helper()
		var frames [][]byte
		for i := range n {
			frames = append(frames, vxlanFrame(node1.IPv4, packet(i)))
		}
		if err := sendUDP(from, netip.AddrPortFrom(node1.IPv4, flows.DefaultPort), frames); err != nil {
			t.Fatal(err)
		}
	}
	const n, inRangesSYNs = 20, 5
	refused := func(reason string) (float64, error) {
		return agentMetric(node1, `weir_moved_packets_refused_total{reason="`+reason+`"}`)
	}
	notAPeerBefore, _ := refused("not_a_peer")
	notPassedOnBefore, _ := refused("not_passed_on")

	t.Log("a host on the LAN that is not a node (the control host) sends node1's VXLAN port SYNs and datagrams")
	send(c.Control, n, func(i int) []byte {
		return tcpSYN(netip.AddrPortFrom(inRanges, uint16(41000+i)), netip.AddrPortFrom(lbIP, 80), strangerSYN)
	})
	send(c.Control, n, func(i int) []byte {
		return udpDatagram(netip.AddrPortFrom(inRanges, uint16(41000+i)), udpVIP, strangerDatagram)
	})
	t.Log("node2, a peer, sends through the tunnel what the ring never passes on, and SYNs to a service with source ranges")
	send(node2.Netns, n, func(i int) []byte {
		return udpDatagram(netip.AddrPortFrom(inRanges, uint16(42000+i)), udpVIP, peerDatagram)
	})
	send(node2.Netns, n, func(i int) []byte {
		return tcpSYN(netip.AddrPortFrom(inRanges, uint16(42000+i)), netip.AddrPortFrom(clusterIPv4, 80), peerSYNToClusterIP)
	})
	send(node2.Netns, n, func(i int) []byte {
		return tcpSYN(netip.AddrPortFrom(outsideRanges, uint16(43000+i)), rangedVIP, peerSYNOutsideRanges)
	})
	send(node2.Netns, inRangesSYNs, func(i int) []byte {
		return tcpSYN(netip.AddrPortFrom(inRanges, uint16(44000+i)), rangedVIP, peerSYNInRanges)
	})

	// The SYNs within the ranges, sent last, show that a peer's packets
	// reach the pods when nothing refuses them, and that the others had
	// their time to arrive.
	wait.For(t, 5*time.Second, "the SYNs within the source ranges reach the pods", func() error {
		if got := taps.count(peerSYNInRanges); got != inRangesSYNs {
			return fmt.Errorf("%d of %d", got, inRangesSYNs)
		}
		return nil
	})
	for tag, what := range map[uint32]string{
		strangerSYN:          "SYNs from a host that is not a node",
		strangerDatagram:     "datagrams from a host that is not a node",
		peerDatagram:         "datagrams a peer sent through the tunnel",
		peerSYNToClusterIP:   "SYNs to a cluster IP a peer sent through the tunnel",
		peerSYNOutsideRanges: "SYNs from outside the source ranges a peer sent through the tunnel",
	} {
		if got := taps.count(tag); got != 0 {
			t.Errorf("%s: %d of %d reached a pod; want none", what, got, n)
		}
	}
	// Every packet of the host that is not a node is counted, and none
	// of node2's (its probes included) as from a stranger; every packet
	// node2 sent that no peer passes on is counted.
	for _, want := range []struct {
		reason  string
		before  float64
		packets int
	}{{"not_a_peer", notAPeerBefore, 2 * n}, {"not_passed_on", notPassedOnBefore, 2 * n}} {
		wait.For(t, 3*flowsCountPeriod, fmt.Sprintf("node1 counts %d packets refused (%s)", want.packets, want.reason), func() error {
			got, err := refused(want.reason)
			if err != nil {
				return err
			}
			if got-want.before != float64(want.packets) {
				return fmt.Errorf("%v", got-want.before)
			}
			return nil
		})
	}
}

// agentMetric reads one sample from node's agent.
func agentMetric(node *lab.Node, sample string) (float64, error) {
	resp, err := node.HTTPClient(2 * time.Second).Get("http://127.0.0.1:10249/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return metricValue(string(b), sample)
}

// podTaps count, by tag, the TCP segments (their sequence number) and
// UDP datagrams (their first four bytes) that reach the pods, whether or
// not anything listens for them: a raw socket in each pod sees every
// packet its kernel takes.
type podTaps struct {
	mu   sync.Mutex
	seen map[uint32]int
}

func tapPods(t *testing.T, pods []*lab.Pod) *podTaps {
	t.Helper()
	taps := &podTaps{seen: map[uint32]int{}}
	for _, p := range pods {
		for _, proto := range []string{"ip4:tcp", "ip4:udp"} {
			var conn net.PacketConn
			if err := p.Do(func() error {
				var err error
				conn, err = net.ListenPacket(proto, "0.0.0.0")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			go func() {
				buf := make([]byte, 2048)
				for {
					n, _, err := conn.ReadFrom(buf)
					if err != nil {
						return
					}
					// TCP: the sequence number; UDP: after the
					// 8-byte header.
					at := 4
					if proto == "ip4:udp" {
						at = 8
					}
					if n >= at+4 {
						taps.mu.Lock()
						taps.seen[binary.BigEndian.Uint32(buf[at:])]++
						taps.mu.Unlock()
					}
				}
			}()
		}
	}
	return taps
}

func (p *podTaps) count(tag uint32) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[tag]
}

// sendUDP sends each payload from ns to dst in a datagram of its own.
func sendUDP(ns *lab.Netns, dst netip.AddrPort, payloads [][]byte) error {
	return ns.Do(func() error {
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer conn.Close()
		for _, p := range payloads {
			if _, err := conn.Write(p); err != nil {
				return err
			}
		}
		return nil
	})
}

// vxlanFrame is what a peer's device sends node's: a VXLAN header with
// the ring's VNI, then an Ethernet frame for node's device holding
// packet, an IPv4 packet.
func vxlanFrame(node netip.Addr, packet []byte) []byte {
	b := make([]byte, 8, 8+14+len(packet))
	b[0] = 0x08 // the VNI is valid
	binary.BigEndian.PutUint32(b[4:], flows.DefaultVNI<<8)
	b = append(b, flows.MAC(node)...)
	b = append(b, 0x02, 0, 0, 0, 0, 0x01) // any source
	b = append(b, 0x08, 0x00)             // IPv4
	return append(b, packet...)
}

// tcpSYN is an IPv4 packet holding a TCP SYN from src to dst with
// sequence number seq, with the TTL a peer gives what it passes on.
func tcpSYN(src, dst netip.AddrPort, seq uint32) []byte {
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12] = 5 << 4 // header length, in words
	tcp[13] = 0x02   // SYN
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	binary.BigEndian.PutUint16(tcp[16:], l4Checksum(src.Addr(), dst.Addr(), 6, tcp))
	return ipv4Packet(src.Addr(), dst.Addr(), 6, tcp)
}

// udpDatagram is an IPv4 packet holding a datagram from src to dst whose
// payload starts with tag.
func udpDatagram(src, dst netip.AddrPort, tag uint32) []byte {
	udp := make([]byte, 8+8)
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	binary.BigEndian.PutUint32(udp[8:], tag)
	sum := l4Checksum(src.Addr(), dst.Addr(), 17, udp)
	if sum == 0 {
		sum = 0xffff // 0 would say there is none
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	return ipv4Packet(src.Addr(), dst.Addr(), 17, udp)
}

func ipv4Packet(src, dst netip.Addr, proto byte, payload []byte) []byte {
	ip := make([]byte, 20, 20+len(payload))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
	ip[8] = 254 // a packet one peer passed on
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], onesComplement(ip))
	return append(ip, payload...)
}

// l4Checksum is a TCP or UDP checksum over the IPv4 pseudo-header.
func l4Checksum(src, dst netip.Addr, proto byte, segment []byte) uint16 {
	s, d := src.As4(), dst.As4()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, proto, byte(len(segment)>>8), byte(len(segment)))
	return onesComplement(append(pseudo, segment...))
}

func onesComplement(b []byte) uint16 {
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		w := uint32(b[i]) << 8
		if i+1 < len(b) {
			w |= uint32(b[i+1])
		}
		sum += w
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
