// Package frr runs a real FRR router (zebra and bgpd, from Debian's frr
// package) inside a lab namespace, with its own configuration, pid files
// and sockets in a private folder, and reads its BGP and kernel state.
package frr

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weirlb/weir/test/lab"
)

// Router is a running FRR instance.
type Router struct {
	ns      *lab.Netns
	Dir     string
	procs   []*lab.Process
	bfdd    *lab.Process
	tempDir bool // Close removes Dir
}

// Config is the router's BGP setup: it accepts any speaker from the
// listen ranges into one peer group (nodes come and go without changes).
type Config struct {
	ASN          uint32
	RouterID     string
	ListenRanges []string // e.g. 192.0.2.0/24
	PeerASN      uint32   // the speakers' AS
	// Extra lines appended to the bgp router block.
	Extra []string
	// FamilyPerTransport makes each session carry only the family of its
	// own addresses (a peer group per family), as many routers are set
	// up; otherwise every session carries both.
	FamilyPerTransport bool
	// AddressFamilyExtra lines go into both address-family blocks.
	AddressFamilyExtra []string
	// Text, when set, is the whole configuration, used as it is (the
	// fields above are then ignored).
	Text string
	// BFD, when set, starts bfdd and runs BFD with every speaker of the
	// peer groups: a speaker whose BFD goes down loses its routes at once.
	BFD *BFD
}

// BFD is the router's BFD profile for the speakers.
type BFD struct {
	Interval   time.Duration // receive and transmit
	Multiplier int
	// Peers are sessions of their own, with no BGP neighbour: BFD alone,
	// at the profile's intervals.
	Peers []BFDPeer
}

// BFDPeer is a BFD session the router runs whatever BGP does (bfdd's
// "peer" block).
type BFDPeer struct {
	Address string
	// Local is the router's own address of the session; multi-hop needs
	// it.
	Local string
	// Interface is the router's device of a link-local peer.
	Interface string
	MultiHop  bool
}

// Start writes the configuration and starts zebra then bgpd in ns.
func Start(ctx context.Context, ns *lab.Netns, dir string, cfg Config) (*Router, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r := &Router{ns: ns, Dir: dir}
	conf := cfg.Text
	if conf == "" {
		conf = r.config(cfg)
	}
	if err := os.WriteFile(filepath.Join(dir, "frr.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	// The daemons drop to user frr: the folder must be theirs.
	if err := chownFRR(dir); err != nil {
		return nil, err
	}
	common := []string{"-f", filepath.Join(dir, "frr.conf"), "-z", filepath.Join(dir, "zserv.api"),
		"--vty_socket", dir, "-A", "127.0.0.1", "-P", "0", "-u", "frr", "-g", "frr"}
	zebra, err := ns.Start("/usr/lib/frr/zebra", append(common, "-i", filepath.Join(dir, "zebra.pid"))...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, zebra)
	if err := waitFile(ctx, filepath.Join(dir, "zserv.api")); err != nil {
		return nil, fmt.Errorf("zebra did not start: %w\n%s", err, zebra.Log())
	}
	bgpd, err := ns.Start("/usr/lib/frr/bgpd", append(common, "-i", filepath.Join(dir, "bgpd.pid"))...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, bgpd)
	if cfg.BFD != nil {
		var bfdd *lab.Process
		bfdd, err = ns.Start("/usr/lib/frr/bfdd", append(common, "-i", filepath.Join(dir, "bfdd.pid"))...)
		if err != nil {
			return nil, err
		}
		r.procs = append(r.procs, bfdd)
		r.bfdd = bfdd
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := r.Vtysh(ctx, "show bgp summary json"); err == nil {
			return r, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bgpd did not answer\n%s", bgpd.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *Router) config(cfg Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "frr defaults traditional\nhostname lab-router\nlog stdout\n!\n")
	if cfg.BFD != nil {
		// bfdd logs each state change, to the millisecond (BFDDownAt).
		fmt.Fprintf(&b, "log timestamp precision 3\ndebug bfd peer\n!\n")
		ms := cfg.BFD.Interval.Milliseconds()
		fmt.Fprintf(&b, "bfd\n profile speakers\n  receive-interval %d\n  transmit-interval %d\n  detect-multiplier %d\n !\n", ms, ms, cfg.BFD.Multiplier)
		for _, p := range cfg.BFD.Peers {
			fmt.Fprintf(&b, " peer %s", p.Address)
			if p.MultiHop {
				b.WriteString(" multihop")
			}
			if p.Local != "" {
				fmt.Fprintf(&b, " local-address %s", p.Local)
			}
			if p.Interface != "" {
				fmt.Fprintf(&b, " interface %s", p.Interface)
			}
			b.WriteString("\n  profile speakers\n !\n")
		}
		b.WriteString("!\n")
	}
	fmt.Fprintf(&b, "router bgp %d\n bgp router-id %s\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n", cfg.ASN, cfg.RouterID)
	fmt.Fprintf(&b, " bgp bestpath as-path multipath-relax\n timers bgp 3 9\n")
	group := func(af string) string {
		if cfg.FamilyPerTransport {
			return "NODES" + strings.TrimPrefix(af, "ip")
		}
		return "NODES"
	}
	for _, g := range slices.Compact([]string{group("ipv4"), group("ipv6")}) {
		fmt.Fprintf(&b, " neighbor %s peer-group\n neighbor %s remote-as %d\n neighbor %s advertisement-interval 0\n", g, g, cfg.PeerASN, g)
		if cfg.BFD != nil {
			fmt.Fprintf(&b, " neighbor %s bfd profile speakers\n", g)
		}
	}
	for _, rg := range cfg.ListenRanges {
		af := "ipv4"
		if strings.Contains(rg, ":") {
			af = "ipv6"
		}
		fmt.Fprintf(&b, " bgp listen range %s peer-group %s\n", rg, group(af))
	}
	for _, l := range cfg.Extra {
		fmt.Fprintf(&b, " %s\n", l)
	}
	for _, af := range []string{"ipv4", "ipv6"} {
		fmt.Fprintf(&b, " address-family %s unicast\n  neighbor %s activate\n  maximum-paths 16\n", af, group(af))
		for _, l := range cfg.AddressFamilyExtra {
			fmt.Fprintf(&b, "  %s\n", l)
		}
		fmt.Fprintf(&b, " exit-address-family\n")
	}
	fmt.Fprintf(&b, "!\n")
	return b.String()
}

// Vtysh runs one vtysh command against this router.
func (r *Router) Vtysh(ctx context.Context, command string) (string, error) {
	return r.ns.Run(ctx, "vtysh", "--vty_socket", r.Dir, "-c", command)
}

// Established counts the neighbors whose BGP session is Established (a
// session that carries both families counts once).
func (r *Router) Established(ctx context.Context) (int, error) {
	out, err := r.Vtysh(ctx, "show bgp summary json")
	if err != nil {
		return 0, err
	}
	var sum map[string]struct {
		Peers map[string]struct {
			State string `json:"state"`
		} `json:"peers"`
	}
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		return 0, err
	}
	up := map[string]bool{}
	for _, af := range sum {
		for addr, p := range af.Peers {
			if p.State == "Established" {
				up[addr] = true
			}
		}
	}
	return len(up), nil
}

// route is `ip route show prefix` in the router's namespace.
func (r *Router) route(ctx context.Context, prefix string) (string, error) {
	return lab.Route(ctx, r.ns, prefix)
}

// NextHops lists the kernel route's next hops for prefix (one per ECMP
// path), from `ip route show`.
func (r *Router) NextHops(ctx context.Context, prefix string) ([]string, error) {
	return lab.NextHops(ctx, r.ns, prefix)
}

// GracefulRestartFrom reports whether the neighbor offered graceful restart
// in its current session.
func (r *Router) GracefulRestartFrom(ctx context.Context, neighbor string) (bool, error) {
	out, err := r.Vtysh(ctx, "show bgp neighbors "+neighbor+" json")
	if err != nil {
		return false, err
	}
	return strings.Contains(out, `"remoteGrMode":"Restart"`), nil
}

// RestartDone reports whether the session with neighbor is Established
// and none of its paths to prefix is kept stale from an earlier session.
func (r *Router) RestartDone(ctx context.Context, neighbor, prefix string) (bool, error) {
	out, err := r.Vtysh(ctx, "show bgp neighbors "+neighbor+" json")
	if err != nil || !strings.Contains(out, `"bgpState":"Established"`) {
		return false, err
	}
	family := "ipv4"
	if strings.Contains(prefix, ":") {
		family = "ipv6"
	}
	paths, err := r.Vtysh(ctx, "show bgp "+family+" unicast "+prefix+" json")
	if err != nil {
		return false, err
	}
	return !strings.Contains(paths, `"stale":true`), nil
}

// Describe is what FRR says of its sessions and of prefix, for a failing
// test's message.
func (r *Router) Describe(ctx context.Context, prefix string) string {
	summary, _ := r.Vtysh(ctx, "show bgp summary")
	family := "ipv4"
	if strings.Contains(prefix, ":") {
		family = "ipv6"
	}
	paths, _ := r.Vtysh(ctx, "show bgp "+family+" unicast "+prefix)
	gr, _ := r.Vtysh(ctx, "show bgp neighbors graceful-restart")
	return summary + "\n" + paths + "\n" + gr
}

// Weights maps each next hop of prefix's kernel route to its ECMP weight
// (1 when the route shows none).
func (r *Router) Weights(ctx context.Context, prefix string) (map[string]int, error) {
	out, err := r.route(ctx, prefix)
	if err != nil {
		return nil, err
	}
	weights := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		hop, w := "", 1
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "via":
				hop = f[i+1]
			case "weight":
				w, _ = strconv.Atoi(f[i+1])
			}
		}
		if hop != "" {
			weights[hop] = w
		}
	}
	return weights, nil
}

// Close stops the daemons.
func (r *Router) Close() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop()
	}
	if r.tempDir {
		os.RemoveAll(r.Dir)
	}
}

// StartTemp is Start in a new temporary folder, which Close removes.
func StartTemp(ctx context.Context, ns *lab.Netns, cfg Config) (*Router, error) {
	dir, err := os.MkdirTemp("", "weir-frr-")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755) // FRR's daemons run as user frr
	r, err := Start(ctx, ns, dir, cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	r.tempDir = true
	return r, nil
}

func chownFRR(dir string) error {
	u, err := user.Lookup("frr")
	if err != nil {
		return fmt.Errorf("user frr (install Debian's frr package): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
}

func waitFile(ctx context.Context, path string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not appear", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BFDPeers is each BFD session's state by peer address ("up", "down",
// "init"), as bfdd shows it.
func (r *Router) BFDPeers(ctx context.Context) (map[string]string, error) {
	out, err := r.Vtysh(ctx, "show bfd peers json")
	if err != nil {
		return nil, err
	}
	var peers []struct {
		Peer   string `json:"peer"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &peers); err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	states := map[string]string{}
	for _, p := range peers {
		states[p.Peer] = p.Status
	}
	return states, nil
}

// BFDPeer is the state of the router's BFD session with peer ("up",
// "down", "init"), single or multi hop, and what the peer last said of
// its own side ("administratively down" when it stopped the session);
// "" and no error when there is no such session.
func (r *Router) BFDPeer(ctx context.Context, peer string, multiHop bool) (state, remoteDiag string, err error) {
	out, err := r.Vtysh(ctx, "show bfd peers json")
	if err != nil {
		return "", "", err
	}
	var peers []struct {
		Peer       string `json:"peer"`
		MultiHop   bool   `json:"multihop"`
		Status     string `json:"status"`
		RemoteDiag string `json:"remote-diagnostic"`
	}
	if err := json.Unmarshal([]byte(out), &peers); err != nil {
		return "", "", fmt.Errorf("%w: %s", err, out)
	}
	for _, p := range peers {
		if p.Peer == peer && p.MultiHop == multiHop {
			return p.Status, p.RemoteDiag, nil
		}
	}
	return "", "", nil
}

// BFDDownAt is when bfdd logged its session with peer going down from Up
// after since (the first such change); the zero Time if it has not.
func (r *Router) BFDDownAt(peer string, since time.Time) time.Time {
	if r.bfdd == nil {
		return time.Time{}
	}
	for _, line := range strings.Split(r.bfdd.Log(), "\n") {
		// "2026/11/28 08:06:45.123 BFD: [XYZ] state-change: [mhop:no
		// peer:192.0.2.11 ...] up -> down reason:control-expired"
		if !strings.Contains(line, "state-change:") || !strings.Contains(line, "peer:"+peer+" ") || !strings.Contains(line, "up -> down") || len(line) < 23 {
			continue
		}
		at, err := time.ParseInLocation("2006/01/02 15:04:05.000", line[:23], time.Local)
		if err == nil && at.After(since) {
			return at
		}
	}
	return time.Time{}
}
