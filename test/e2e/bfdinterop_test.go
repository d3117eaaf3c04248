package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/test/bird"
	"github.com/weirlb/weir/test/frr"
	"github.com/weirlb/weir/test/lab"
)

// TestBFDInterop: Weir's BFD (package bfd, alone, in node1's namespace)
// runs sessions at 100 ms × 3 with FRR's bfdd and with BIRD's protocol bfd
// in the router's namespace: single hop over IPv4 on the rack LAN, single
// hop between the IPv6 link-local addresses of that link (unnumbered, by
// device), and multi-hop over IPv6 to the router's far address. Every
// session comes Up on both sides; BFD packets dropped in the router's namespace take both sides
// Down within the detection time; lifting the drop brings them Up again;
// closing the manager tells the router AdminDown.
func TestBFDInterop(t *testing.T) {
	lab.SkipUnlessPrivileged(t)
	l, err := lab.New(t.Context(), lab.Config{Nodes: 1, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	for _, impl := range []string{"FRR", "BIRD"} {
		t.Run(impl, func(t *testing.T) {
			requireRouter(t, impl)
			testBFDInterop(t, l, impl)
		})
	}
}

// bfdPeerRouter reads a lab router's own view of one BFD session.
type bfdPeerRouter interface {
	// bfdState is the session's state, lower case ("up", "down", "init"),
	// or "" when there is none; adminDown says the peer said AdminDown.
	bfdState(ctx context.Context, peer netip.Addr, multiHop bool) (state string, adminDown bool, err error)
	// bfdDownAt is when the router logged the session leaving Up after
	// since; the zero Time if it has not.
	bfdDownAt(peer netip.Addr, since time.Time) time.Time
}

type frrPeers struct{ *frr.Router }

func (r frrPeers) bfdState(ctx context.Context, peer netip.Addr, multiHop bool) (string, bool, error) {
	state, diag, err := r.BFDPeer(ctx, peer.String(), multiHop)
	return state, strings.HasPrefix(diag, "administratively"), err
}

func (r frrPeers) bfdDownAt(peer netip.Addr, since time.Time) time.Time {
	return r.BFDDownAt(peer.String(), since)
}

type birdPeers struct{ *bird.Router }

// bfdState: BIRD shows one session per address, so the lab gives each
// session an address of its own. BIRD does not show what the peer said.
func (r birdPeers) bfdState(ctx context.Context, peer netip.Addr, _ bool) (string, bool, error) {
	states, err := r.BFDSessions(ctx)
	return strings.ToLower(states[peer.String()]), false, err
}

func (r birdPeers) bfdDownAt(peer netip.Addr, since time.Time) time.Time {
	return r.BFDDownAt(peer.String(), since)
}

func testBFDInterop(t *testing.T, l *lab.Lab, impl string) {
	ctx := context.Background()
	node1 := l.Nodes[0]
	const interval, multiplier = 100 * time.Millisecond, 3
	profile := bfd.Profile{ReceiveInterval: interval, TransmitInterval: interval, DetectMultiplier: multiplier}
	routerLL, nodeLL := linkLocal(t, l.Router, "br0"), linkLocal(t, node1.Netns, "eth0")
	// Each session as node1 runs it, and the address the router knows
	// node1 by in it.
	type session struct {
		ours   bfd.Session
		theirs netip.Addr
	}
	sessions := []session{
		{bfd.Session{Peer: lab.RouterLANv4, Profile: profile}, node1.IPv4},
		{bfd.Session{Peer: routerLL, Interface: "eth0", Profile: profile}, nodeLL},
		{bfd.Session{Peer: lab.RouterClientIPv6, Local: node1.IPv6, MultiHop: true, Profile: profile}, node1.IPv6},
	}
	multi := &sessions[2].ours

	var r bfdPeerRouter
	if impl == "FRR" {
		fr, err := frr.StartTemp(ctx, l.Router, frr.Config{ASN: routerASN, RouterID: lab.RouterLANv4.String(), PeerASN: nodeASN,
			BFD: &frr.BFD{Interval: interval, Multiplier: multiplier, Peers: []frr.BFDPeer{
				{Address: node1.IPv4.String()},
				{Address: nodeLL.String(), Interface: "br0"},
				{Address: node1.IPv6.String(), Local: lab.RouterClientIPv6.String(), MultiHop: true},
			}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fr.Close)
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := fr.Vtysh(ctx, "show bfd peers")
				t.Logf("bfdd's peers:\n%s", out)
			}
		})
		r = frrPeers{fr}
	} else {
		br := startBIRDIn(t, l.Router, bird.Config{RouterID: lab.RouterLANv4.String(),
			BFD: &bird.BFD{Interval: interval, Multiplier: multiplier, Peers: []bird.BFDPeer{
				{Address: node1.IPv4.String()},
				{Address: nodeLL.String(), Interface: "br0"},
				{Address: node1.IPv6.String(), Local: lab.RouterClientIPv6.String(), MultiHop: true},
			}}})
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := br.Birdc(ctx, "show bfd sessions")
				t.Logf("BIRD's sessions:\n%s", out)
			}
		})
		r = birdPeers{br}
		// BIRD sends multi-hop packets with the system's default TTL
		// (64), where FRR sends 255: with the default minimum of 254 the
		// session never comes up. The router's far address is no hop
		// away, so its packets arrive with 64.
		multi.Profile.MinimumTTL = 64
	}

	type change struct {
		peer   netip.Addr
		usable bool
		at     time.Time
	}
	changes := make(chan change, 64)
	m := bfd.New(slog.Default(), func(p netip.Addr, u bool) { changes <- change{p, u, time.Now()} })
	t.Cleanup(m.Close)
	// The sockets are made by Set: made in node1's namespace, they stay
	// there.
	var ours []bfd.Session
	for _, s := range sessions {
		ours = append(ours, s.ours)
	}
	if err := node1.Do(func() error { return m.Set(ours) }); err != nil {
		t.Fatal(err)
	}
	// awaitUsable waits for onChange to say usable of every session, and
	// says when each did.
	awaitUsable := func(usable bool, within time.Duration) map[netip.Addr]time.Time {
		t.Helper()
		got := map[netip.Addr]time.Time{}
		deadline := time.After(within)
		for len(got) < len(sessions) {
			select {
			case c := <-changes:
				if c.usable != usable {
					t.Fatalf("%s reported usable %v; want %v", c.peer, c.usable, usable)
				}
				got[c.peer] = c.at
			case <-deadline:
				t.Fatalf("within %v onChange said usable %v of %v only; status %+v", within, usable, got, m.Status())
			}
		}
		return got
	}
	bothSidesUp := func() {
		t.Helper()
		awaitUsable(true, 10*time.Second)
		eventually(t, "both sides of every session Up at 300 ms detection", func() error {
			for _, st := range m.Status() {
				if st.State != bfd.Up || !st.Usable || st.DetectTime != multiplier*interval {
					return fmt.Errorf("ours: %+v", st)
				}
			}
			for _, s := range sessions {
				if state, _, err := r.bfdState(ctx, s.theirs, s.ours.MultiHop); err != nil || state != "up" {
					return fmt.Errorf("the router's session with %s (multi-hop %v): %q, %v", s.theirs, s.ours.MultiHop, state, err)
				}
			}
			return nil
		})
	}
	bothSidesUp()

	// A dead path: every BFD packet dropped in the router's namespace.
	const fault = "add table inet bfdfault { chain in { type filter hook input priority -400; udp dport { 3784, 4784 } drop; }; " +
		"chain out { type filter hook output priority -400; udp dport { 3784, 4784 } drop; }; }"
	start := time.Now()
	if _, err := l.Router.Run(ctx, "nft", fault); err != nil {
		t.Fatal(err)
	}
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			if _, err := l.Router.Run(ctx, "nft", "delete table inet bfdfault"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(lift)
	// Detection takes 300 ms; a second is slack for a loaded machine, and
	// still a third of BGP's shortest hold time.
	down := awaitUsable(false, time.Second)
	for _, s := range sessions {
		t.Logf("%s: Weir found its session with %s down in %v (detection time %v)", impl, s.ours.Peer, down[s.ours.Peer].Sub(start).Round(time.Millisecond), multiplier*interval)
	}
	eventually(t, "the router's sessions down", func() error {
		for _, s := range sessions {
			if state, _, err := r.bfdState(ctx, s.theirs, s.ours.MultiHop); err != nil || state == "up" {
				return fmt.Errorf("the router's session with %s: %q, %v", s.theirs, state, err)
			}
		}
		return nil
	})
	for _, s := range sessions {
		at := r.bfdDownAt(s.theirs, start)
		if at.IsZero() {
			t.Errorf("%s logged no Up to Down of its session with %s", impl, s.theirs)
			continue
		}
		took := at.Sub(start)
		t.Logf("%s found its session with %s down in %v", impl, s.theirs, took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("%s took %v to find its session with %s down; want under 1s", impl, took, s.theirs)
		}
	}
	for _, st := range m.Status() {
		if st.State != bfd.Down || st.Diagnostic != bfd.DiagDetectionExpired || st.Flaps != 1 {
			t.Errorf("ours after the fault: %+v; want Down by detection, one flap", st)
		}
	}

	lift()
	bothSidesUp()

	// Closing says AdminDown: the router takes its side down without
	// waiting for its detection time.
	start = time.Now()
	m.Close()
	eventually(t, "the router's sessions down after Close", func() error {
		for _, s := range sessions {
			state, adminDown, err := r.bfdState(ctx, s.theirs, s.ours.MultiHop)
			if err != nil || state == "up" {
				return fmt.Errorf("the router's session with %s: %q, %v", s.theirs, state, err)
			}
			if impl == "FRR" && !adminDown {
				return fmt.Errorf("the router's session with %s: down, but the peer's AdminDown not seen", s.theirs)
			}
		}
		return nil
	})
	for _, s := range sessions {
		if at := r.bfdDownAt(s.theirs, start); !at.IsZero() {
			t.Logf("%s took its session with %s down %v after Close", impl, s.theirs, at.Sub(start).Round(time.Millisecond))
		}
	}
}

// linkLocal is the IPv6 link-local address of dev in ns.
func linkLocal(t *testing.T, ns *lab.Netns, dev string) netip.Addr {
	t.Helper()
	var addr netip.Addr
	eventually(t, "a link-local address on "+dev+" in "+ns.Name, func() error {
		out, err := ns.Run(context.Background(), "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link")
		if err != nil {
			return err
		}
		// "5: br0    inet6 fe80::1c2f:ff:fe00:1/64 scope link ..."
		f := strings.Fields(out)
		for i := range f {
			if f[i] == "inet6" && i+1 < len(f) {
				p, err := netip.ParsePrefix(f[i+1])
				if err != nil {
					return err
				}
				addr = p.Addr()
				return nil
			}
		}
		return fmt.Errorf("none yet: %q", out)
	})
	return addr
}
