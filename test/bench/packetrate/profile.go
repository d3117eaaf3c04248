package main

// -compare-profile: what a new connection costs in nf_tables itself, read
// from the kernel's own samples rather than from a rate.
//
// A ruleset's cost is a few per cent of a connection's CPU (the client's
// and the pod's sockets, routing and conntrack are the rest), so rates
// measured in turn resolve it only to the machine's noise. perf samples
// every CPU while one ruleset's node alone carries new connections, and
// the samples in nf_tables' code (its rule walk, its expressions, its set
// backends) divided by the connections made are its CPU per connection:
// the same for any noise that is not the rules'. The floor (one static
// DNAT rule) shows what of it every NAT proxy pays.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weirlb/weir/test/lab"
)

// profileHz is perf's sampling rate per CPU.
const profileHz = 4999

// newKinds are the kinds of traffic a profile times: a connection's
// first packet is the only one that walks the ruleset's NAT chains.
var newKinds = []string{"TCP new", "UDP new"}

// connCost is one profile's CPU per connection, in µs: in nf_tables, and
// everywhere but idle (both ends of the connection, the kernel between).
type connCost struct{ nft, busy float64 }

// labCosts are one lab's profiles: kind of traffic -> ruleset -> cost.
type labCosts map[string]map[string]connCost

// profileLab profiles each of rs for each new kind, in a shuffled order,
// for d each, its perf data in dir.
func profileLab(client *lab.Netns, rs []*ruleset, est map[*ruleset]*established, d time.Duration, dir string, shuffle func([]*ruleset)) (labCosts, error) {
	costs := labCosts{}
	for _, kind := range newKinds {
		costs[kind] = map[string]connCost{}
		seq := slices.Clone(rs)
		shuffle(seq)
		for _, r := range seq {
			data := filepath.Join(dir, strings.ReplaceAll(r.name+"-"+kind, " ", "-")+".data")
			c, err := profileOne(client, r, est[r], kind, d, data)
			// A new flow whose first packet was lost waits out its
			// timeout: profiled again.
			for try := 2; err != nil && timedOut(err) && try <= 3; try++ {
				fmt.Printf("%s, %s: a new flow timed out, profiled again\n", r.name, kind)
				c, err = profileOne(client, r, est[r], kind, d, data)
			}
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", r.name, kind, err)
			}
			costs[kind][r.name] = c
		}
	}
	return costs, nil
}

// profileOne samples every CPU with perf while r's node carries kind for d.
func profileOne(client *lab.Netns, r *ruleset, e *established, kind string, d time.Duration, data string) (connCost, error) {
	rec := exec.Command("perf", "record", "-a", "-F", strconv.Itoa(profileHz), "-o", data)
	var recErr bytes.Buffer
	rec.Stderr = &recErr
	if err := rec.Start(); err != nil {
		return connCost{}, fmt.Errorf("perf record (apt-get install linux-perf): %w", err)
	}
	// perf opens its events before it samples: a rate measured from the
	// start would count connections it never saw.
	time.Sleep(500 * time.Millisecond)
	rate, err := measure(client, r, e, kind, d)
	rec.Process.Signal(syscall.SIGINT)
	// perf writes its data and ends by the signal it was sent.
	if werr := rec.Wait(); !interrupted(werr) && err == nil {
		err = fmt.Errorf("perf record: %w: %s", werr, recErr.Bytes())
	}
	if err != nil {
		return connCost{}, err
	}
	// The samples span a little more than the phase (the half second
	// before it, perf's stop after): no connection is made then, and
	// the idle samples of that time are not counted as busy.
	conns := rate * d.Seconds()
	if conns < 1 {
		return connCost{}, fmt.Errorf("no connection in %v", d)
	}
	out, err := exec.Command("perf", "report", "-i", data, "-n", "--sort", "sym", "--stdio", "--percent-limit", "0").Output()
	if err != nil {
		return connCost{}, fmt.Errorf("perf report: %w", err)
	}
	nft, busy := classifySamples(out)
	os.Remove(data)
	perConn := 1e6 / profileHz / conns
	return connCost{nft: float64(nft) * perConn, busy: float64(busy) * perConn}, nil
}

// interrupted: the command ended well or by the SIGINT it was sent.
func interrupted(err error) bool {
	var ee *exec.ExitError
	if err == nil {
		return true
	}
	if errors.As(err, &ee) {
		ws, ok := ee.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGINT
	}
	return false
}

// classifySamples counts a perf report's samples (-n --sort sym) in
// nf_tables' code and out of the idle loop. nf_tables' code: its rule
// walk and expressions (nft_*), its set backends (the hash, the interval
// and the concatenated-interval sets), and jhash, which its hash sets and
// the jhash expression call (conntrack hashes with siphash).
func classifySamples(report []byte) (nft, busy int) {
	sc := bufio.NewScanner(bytes.NewReader(report))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// "12.34%  541  [k] nft_do_chain"
		if len(f) < 4 || !strings.HasSuffix(f[0], "%") || f[2] != "[k]" && f[2] != "[.]" {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		sym := f[3]
		if idleSymbol(sym) {
			continue
		}
		busy += n
		if nftSymbol(sym) {
			nft += n
		}
	}
	return nft, busy
}

func nftSymbol(sym string) bool {
	for _, p := range []string{"nft_", "__nft_", "nf_tables_", "pipapo_", "jhash"} {
		if strings.HasPrefix(sym, p) {
			return true
		}
	}
	return false
}

func idleSymbol(sym string) bool {
	for _, s := range []string{"safe_halt", "default_idle", "cpuidle", "intel_idle", "poll_idle", "acpi_idle", "mwait_idle", "do_idle"} {
		if strings.Contains(sym, s) {
			return true
		}
	}
	return false
}

// printCosts prints each kind's nf_tables CPU per connection by ruleset,
// and the differences that say what a ruleset costs beyond another, as a
// share of a connection's whole CPU on the second: each with its 95 %
// interval over the labs.
func printCosts(all []labCosts, names []string) {
	fmt.Println("nf_tables' CPU per new connection (perf, every CPU sampled while one node carries the traffic):")
	for _, kind := range newKinds {
		fmt.Printf("%s:\n", kind)
		for _, name := range names {
			var nft, busy []float64
			for _, c := range all {
				nft, busy = append(nft, c[kind][name].nft), append(busy, c[kind][name].busy)
			}
			m, h := meanInterval(nft)
			bm, bh := meanInterval(busy)
			fmt.Printf("  %-12s nf_tables %.2f ± %.2f µs of %.1f ± %.1f µs busy (%.1f %%)\n", name, m, h, bm, bh, 100*m/bm)
		}
		for _, pair := range [][2]string{{"weir", "kube-proxy"}, {"weir", "dnat"}, {"kube-proxy", "dnat"}, {"weir+flows", "weir"}, {"weir-control", "weir"}} {
			if !slices.Contains(names, pair[0]) || !slices.Contains(names, pair[1]) {
				continue
			}
			var diffs []float64
			for _, c := range all {
				a, b := c[kind][pair[0]], c[kind][pair[1]]
				diffs = append(diffs, 100*(a.nft-b.nft)/b.busy)
			}
			m, h := meanInterval(diffs)
			fmt.Printf("  %-12s - %-10s nf_tables %+.2f ± %.2f %% of a connection's CPU on the second\n", pair[0], pair[1], m, h)
		}
	}
}
