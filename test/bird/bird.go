// Package bird runs a real BIRD 2 router (Debian's bird2) inside a lab
// namespace: a second BGP implementation beside FRR, so that what Weir's
// speakers do is proven against more than one router. It accepts the nodes'
// sessions from listen ranges (dynamic neighbours, passive), installs the
// routes in its namespace's kernel (ECMP: merge paths), and offers graceful
// restart as a helper.
package bird

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirlb/weir/test/lab"
)

// Router is a running BIRD instance.
type Router struct {
	ns   *lab.Netns
	Dir  string
	proc *lab.Process
}

// Config is the router's BGP setup.
type Config struct {
	ASN      uint32
	RouterID string
	// ListenRanges4 are the IPv4 ranges speakers dial in from.
	ListenRanges4 []string
	PeerASN       uint32 // the speakers' AS
	// HoldTime is the sessions' hold time in seconds (0: 9, for tests).
	HoldTime int
	// Multihop, when above 0, takes speakers that many hops away (BIRD's
	// multihop), its own packets leaving from SourceAddress.
	Multihop      int
	SourceAddress string
	// BFD, when set, runs BFD with every speaker: a speaker whose BFD
	// goes down loses its routes at once.
	BFD *BFD
	// Protocols, when set, are the BGP protocols in BIRD's own words,
	// instead of those the fields above make (RouterID and BFD still
	// apply).
	Protocols string
}

// BFD is the router's BFD setup for the speakers.
type BFD struct {
	Interval   time.Duration // receive and transmit
	Multiplier int
	// Peers are sessions of their own, with no BGP neighbour: BFD alone,
	// at the intervals above.
	Peers []BFDPeer
}

// BFDPeer is a BFD session the router runs whatever BGP does (a
// "neighbor" of BIRD's protocol bfd).
type BFDPeer struct {
	Address string
	// Local is the router's own address of the session; multi-hop needs
	// it.
	Local string
	// Interface is the router's device of a link-local peer.
	Interface string
	MultiHop  bool
}

// Start writes the configuration into a new temporary folder and starts
// bird in ns, returning once birdc answers.
func Start(ctx context.Context, ns *lab.Netns, cfg Config) (*Router, error) {
	dir, err := os.MkdirTemp("", "weir-bird-")
	if err != nil {
		return nil, err
	}
	r := &Router{ns: ns, Dir: dir}
	if err := os.WriteFile(filepath.Join(dir, "bird.conf"), []byte(config(cfg, dir)), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// -f: stay in the foreground, so the lab tracks the process.
	r.proc, err = ns.Start("bird", "-f", "-c", filepath.Join(dir, "bird.conf"), "-s", r.socket(), "-P", filepath.Join(dir, "bird.pid"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := r.Birdc(ctx, "show status"); err == nil {
			return r, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			log := r.proc.Log()
			r.Close()
			return nil, fmt.Errorf("bird did not answer\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *Router) socket() string { return filepath.Join(r.Dir, "bird.ctl") }

func config(cfg Config, dir string) string {
	hold := cfg.HoldTime
	if hold == 0 {
		hold = 9
	}
	var b strings.Builder
	fmt.Fprintf(&b, "router id %s;\nlog \"%s\" all;\n", cfg.RouterID, filepath.Join(dir, "bird.log"))
	b.WriteString("protocol device { scan time 1; }\n")
	// merge paths: several BGP paths of one prefix become one ECMP route.
	b.WriteString("protocol kernel { ipv4 { import none; export all; }; merge paths on; }\n")
	bfd := ""
	if cfg.BFD != nil {
		ms := cfg.BFD.Interval.Milliseconds()
		fmt.Fprintf(&b, "protocol bfd {\n  debug { events };\n  interface \"*\" { min rx interval %d ms; min tx interval %d ms; multiplier %d; };\n  multihop { min rx interval %d ms; min tx interval %d ms; multiplier %d; };\n",
			ms, ms, cfg.BFD.Multiplier, ms, ms, cfg.BFD.Multiplier)
		for _, p := range cfg.BFD.Peers {
			fmt.Fprintf(&b, "  neighbor %s", p.Address)
			if p.Interface != "" {
				fmt.Fprintf(&b, " dev \"%s\"", p.Interface)
			}
			if p.Local != "" {
				fmt.Fprintf(&b, " local %s", p.Local)
			}
			if p.MultiHop {
				b.WriteString(" multihop on")
			}
			b.WriteString(";\n")
		}
		b.WriteString("}\n")
		bfd = "\n  bfd on;"
	}
	if cfg.Protocols != "" {
		b.WriteString(cfg.Protocols)
		return b.String()
	}
	for i, rg := range cfg.ListenRanges4 {
		fmt.Fprintf(&b, `protocol bgp nodes%d {
  local as %d;
  neighbor range %s as %d;
  dynamic name "node";
  passive on;
  graceful restart on;
  hold time %d;
  connect retry time 1;
  error wait time 1, 2;
  debug { states, events, routes };
  ipv4 { import all; export none; };%s%s
}
`, i, cfg.ASN, rg, cfg.PeerASN, hold, multihop(cfg), bfd)
	}
	return b.String()
}

// multihop is the protocol's lines for Config.Multihop.
func multihop(cfg Config) string {
	if cfg.Multihop == 0 {
		return ""
	}
	return fmt.Sprintf("\n  multihop %d;\n  source address %s;", cfg.Multihop, cfg.SourceAddress)
}

// Birdc runs one birdc command against this router.
func (r *Router) Birdc(ctx context.Context, command string) (string, error) {
	return r.ns.Run(ctx, "birdc", "-s", r.socket(), command)
}

// Established counts the BGP sessions that are Established.
func (r *Router) Established(ctx context.Context) (int, error) {
	out, err := r.Birdc(ctx, "show protocols")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "BGP" && f[5] == "Established" {
			n++
		}
	}
	return n, nil
}

// NextHops lists the kernel route's next hops for prefix in the router's
// namespace.
func (r *Router) NextHops(ctx context.Context, prefix string) ([]string, error) {
	return lab.NextHops(ctx, r.ns, prefix)
}

// GracefulRestartFrom reports whether the session with neighbor is
// Established and the neighbor offered graceful restart in it.
func (r *Router) GracefulRestartFrom(ctx context.Context, neighbor string) (bool, error) {
	out, err := r.Birdc(ctx, "show protocols all")
	if err != nil {
		return false, err
	}
	// In the neighbour's block, the capabilities it sent follow
	// "Neighbor capabilities".
	for _, text := range protocolBlocks(out) {
		if !strings.Contains(text, "Neighbor address: "+neighbor+"\n") || !strings.Contains(text, "Established") {
			continue
		}
		if _, theirs, ok := strings.Cut(text, "Neighbor capabilities"); ok && strings.Contains(theirs, "Graceful restart") {
			return true, nil
		}
	}
	return false, nil
}

// RestartDone reports whether the session with neighbor is Established
// and no graceful restart of it is pending: the routes it sent are its
// current session's, not kept from an earlier one (prefix is not needed:
// BIRD says it per session).
func (r *Router) RestartDone(ctx context.Context, neighbor, _ string) (bool, error) {
	out, err := r.Birdc(ctx, "show protocols all")
	if err != nil {
		return false, err
	}
	for _, block := range protocolBlocks(out) {
		if strings.Contains(block, "Neighbor address: "+neighbor+"\n") && strings.Contains(block, "Established") {
			return !strings.Contains(block, "Neighbor graceful restart active"), nil
		}
	}
	return false, nil
}

// protocolBlocks splits `show protocols all` into one text per protocol:
// each starts with an unindented line.
func protocolBlocks(out string) []string {
	var blocks []string
	var block []string
	for _, line := range strings.Split(out, "\n") {
		if line != "" && line[0] != ' ' && line[0] != '\t' && len(block) > 0 {
			blocks = append(blocks, strings.Join(block, "\n")+"\n")
			block = nil
		}
		block = append(block, line)
	}
	return append(blocks, strings.Join(block, "\n")+"\n")
}

// Describe is what BIRD says of its sessions and of prefix, for a failing
// test's message.
func (r *Router) Describe(ctx context.Context, prefix string) string {
	protocols, _ := r.Birdc(ctx, "show protocols all")
	route, _ := r.Birdc(ctx, "show route for "+prefix+" all")
	return protocols + "\n" + route
}

// Close stops bird and removes its folder.
func (r *Router) Close() {
	if r.proc != nil {
		r.proc.Stop()
	}
	os.RemoveAll(r.Dir)
}

// BFDSessions is each BFD session's state by peer address ("Up", "Down",
// "Init"), as birdc shows it.
func (r *Router) BFDSessions(ctx context.Context) (map[string]string, error) {
	out, err := r.Birdc(ctx, "show bfd sessions")
	if err != nil {
		return nil, err
	}
	states := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		// "192.0.2.11  veth0  Up  12:00:00.000  0.100  0.300"
		f := strings.Fields(line)
		if len(f) >= 3 && strings.Count(f[0], ".")+strings.Count(f[0], ":") >= 2 {
			states[f[0]] = f[2]
		}
	}
	return states, nil
}

// BFDDownAt is when BIRD logged its BFD session with peer going down from
// Up after since (the first such change); the zero Time if it has not.
func (r *Router) BFDDownAt(peer string, since time.Time) time.Time {
	log, err := os.ReadFile(filepath.Join(r.Dir, "bird.log"))
	if err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(log), "\n") {
		// "2026-11-28 08:06:45.123 <TRACE> bfd1: Session to 192.0.2.11
		// changed state from Up to Down"
		if !strings.Contains(line, "Session to "+peer+" changed state from Up to Down") || len(line) < 23 {
			continue
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.000", line[:23], time.Local)
		if err == nil && at.After(since) {
			return at
		}
	}
	return time.Time{}
}
