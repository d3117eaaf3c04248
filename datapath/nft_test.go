package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/test/lab"
)

// insideNetnsEnv marks a test binary re-run inside a test's namespace.
const insideNetnsEnv = "WEIR_DATAPATH_TEST_NETNS"

// runInNewNetns runs the calling top-level test again, in a fresh network
// namespace, as a child process: the datapath starts nft from several
// goroutines, so the whole process, not one thread, must be inside. It
// returns true in the parent, which should then return (the child's
// verdict is the test's), and false in the child, which runs the test.
func runInNewNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(insideNetnsEnv) != "" {
		return false
	}
	lab.SkipUnlessPrivileged(t)
	ns := fmt.Sprintf("weir-dp-%d-%s", os.Getpid(), shortHash(t.Name()))
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), insideNetnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in network namespace %s:\n%s", ns, out)
	if err != nil {
		t.Fatalf("the test failed inside its network namespace: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatal("the test did not run inside its network namespace")
	}
	return true
}

// TestRealNftablesAcceptsTheRuleset loads full and partial syncs into the
// kernel: the fake does not check nftables syntax, the kernel does.
func TestRealNftablesAcceptsTheRuleset(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	// What an older layout left behind must go with the first full sync.
	for _, cmd := range []string{"add table ip weir", "add map ip weir frontends { type ipv4_addr : verdict ; }", "add chain ip weir old_chain"} {
		if out, err := exec.Command("sh", "-c", "nft '"+cmd+"'").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
	}
	dp, err := NewForNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	local := localService(ep("10.244.1.12", true), ep("10.244.2.12", false), ep("fd00:244:1::12", true))
	local.Key.Name = "local"
	local.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.12"), netip.MustParseAddr("fd00:96::12")}
	local.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.12"), netip.MustParseAddr("2001:db8:113::12")}
	local.Ports[0].NodePort = 30012
	local.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:100::/64"), netip.MustParsePrefix("192.0.2.0/24")}
	local.InternalTrafficPolicy = Local
	local.SessionAffinityTimeout = 10800 * time.Second
	dns := dnsService(UDP, ep("10.244.1.53", true))
	// SCTP: this kernel has no SCTP sockets to test with packets, but the
	// rules must load.
	sctp := dnsService(SCTP, ep("10.244.1.54", true), ep("fd00:244:1::54", true))
	sctp.Key.Name, sctp.ClusterIPs, sctp.Ports[0].NodePort = "sctp", []netip.Addr{netip.MustParseAddr("10.96.0.54"), netip.MustParseAddr("fd00:96::54")}, 30054
	st := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false), ep("fd00:244:1::11", true)), local, dns, sctp)
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	// A new endpoint count makes the partial sync create a pick chain
	// that refers to maps the kernel already holds.
	local2 := *local
	local2.Ports = []ServicePort{local.Ports[0]}
	local2.Ports[0].Endpoints = []Endpoint{ep("10.244.1.12", true), ep("10.244.2.99", false)}
	st2 := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.12", false), ep("10.244.2.13", false)), &local2,
		dnsService(UDP, ep("10.244.1.53", true), ep("10.244.2.53", false)), sctp)
	if err := dp.Apply(ctx, st2); err != nil {
		t.Fatalf("partial sync: %v", err)
	}
	// Someone else empties a chain and deletes a backend: the periodic
	// resync repairs both.
	for _, cmd := range []string{"flush chain ip weir services", "delete element ip weir " + dp.tables[&ipv4].gen.of(ipKind.backends(TCP)) + " { 10.96.0.10 . tcp . 80 . 0 }"} {
		if out, err := exec.Command("sh", "-c", "nft '"+cmd+"'").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
	}
	if err := dp.Resync(ctx); err != nil {
		t.Fatalf("resync: %v", err)
	}
	if out, _ := exec.Command("nft", "list", "chain", "ip", TableName, "services").CombinedOutput(); !strings.Contains(string(out), "jump cluster_ip_frontends") {
		t.Errorf("the resync did not repair the flushed chain:\n%s", out)
	}
	// The resync switched generations; nothing of the old one, nor of the
	// older layout, remains.
	listing, err := exec.Command("nft", "list", "table", "ip", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, listing)
	}
	for _, gone := range []string{dp.tables[&ipv4].gen.other().of(ipKind.frontends), "map frontends {", "old_chain"} {
		if strings.Contains(string(listing), gone) {
			t.Errorf("after a resync the table still holds %q", gone)
		}
	}
	// A restarted agent (a new Datapath) takes over the table it finds.
	restarted, err := NewForNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Apply(ctx, st2); err != nil {
		t.Fatalf("full sync of a restarted agent over an existing table: %v", err)
	}
	if restarted.tables[&ipv4].gen != dp.tables[&ipv4].gen {
		t.Errorf("the restarted agent switched to generation %q; want it to adopt %q, the one in use", restarted.tables[&ipv4].gen, dp.tables[&ipv4].gen)
	}
	dp = restarted
	out, err := exec.Command("nft", "list", "map", "ip", TableName, dp.tables[&ipv4].gen.of(ipKind.backends(TCP))).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	for _, want := range []string{"10.96.0.10 . tcp . 80 . 0 : 10.244.1.11 . 8080", "10.96.0.10 . tcp . 80 . 1 : 10.244.2.12 . 8080", "203.0.113.10 . tcp . 80 . 0 : 10.244.1.11 . 8080"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("backends map lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "10.244.2.11") {
		t.Errorf("backends map still has the removed endpoint:\n%s", out)
	}
	// Operators must be able to list the table, and a UDP pick made by a
	// partial sync must not carry a TCP match.
	if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	out, err = exec.Command("nft", "list", "chain", "ip", TableName, ipKind.pickChain(dp.tables[&ipv4].gen)).CombinedOutput()
	udpRule := ""
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, "@"+dp.tables[&ipv4].gen.of(ipKind.pick(UDP, 2).set())+" ") {
			udpRule = line
		}
	}
	if err != nil || udpRule == "" || strings.Contains(udpRule, "tcp") || !strings.Contains(udpRule, dp.tables[&ipv4].gen.of("udp_backends")) {
		t.Errorf("UDP pick: %v: rule %q in\n%s", err, udpRule, out)
	}

	// --cleanup removes both tables, and finds nothing to do a second time.
	for range 2 {
		if err := dp.Cleanup(ctx); err != nil {
			t.Fatalf("cleanup: %v", err)
		}
	}
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), TableName) {
		t.Errorf("after cleanup the tables remain:\n%s", out)
	}
}

// TestRepairAfterAFlushedRuleset: `nft flush ruleset` (an nftables service
// reloading) takes the node's tables; RepairIfGone puts back the last
// state at once, and does nothing while the tables are in place.
func TestRepairAfterAFlushedRuleset(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	dp, err := NewForNode(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
	if err != nil {
		t.Fatal(err)
	}
	if dp.elements == nil {
		t.Fatal("no netlink socket: the tables would be listed through nft")
	}
	if repaired, err := dp.RepairIfGone(ctx); repaired || err != nil {
		t.Fatalf("before any apply: repaired %v, %v; want nothing done", repaired, err)
	}
	st := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false)))
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if repaired, err := dp.RepairIfGone(ctx); repaired || err != nil {
		t.Fatalf("with the tables in place: repaired %v, %v; want nothing done", repaired, err)
	}
	if out, err := exec.Command("nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft flush ruleset: %v: %s", err, out)
	}
	repaired, err := dp.RepairIfGone(ctx)
	if !repaired || err != nil {
		t.Fatalf("after a flush: repaired %v, %v; want the tables rewritten", repaired, err)
	}
	out, err := exec.Command("nft", "list", "map", "ip", TableName, dp.tables[&ipv4].gen.of(ipKind.backends(TCP))).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.96.0.10 . tcp . 80 . 0 : 10.244.1.11 . 8080") {
		t.Errorf("after the repair the backends map is: %v\n%s", err, out)
	}
	if out, _ := exec.Command("nft", "list", "counter", "ip", TableName, counterPassedPackets).CombinedOutput(); !strings.Contains(string(out), "packets") {
		t.Errorf("after the repair the counters are missing:\n%s", out)
	}
	// A table deleted by hand (one family) is put back too.
	if out, err := exec.Command("nft", "delete", "table", "ip6", TableName).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if repaired, err := dp.RepairIfGone(ctx); !repaired || err != nil {
		t.Fatalf("after the ip6 table went: repaired %v, %v", repaired, err)
	}
	if out, err := exec.Command("nft", "list", "table", "ip6", TableName).CombinedOutput(); err != nil {
		t.Errorf("the ip6 table is not back: %v: %s", err, out)
	}
}

// TestFlowCountsReadTheKernelsCounters reads the moved connections'
// counters over netlink, as nft reads them, with values already counted:
// a table an agent left behind whose counters a full sync keeps.
func TestFlowCountsReadTheKernelsCounters(t *testing.T) {
	if runInNewNetns(t) {
		return
	}
	ctx := context.Background()
	for _, cmd := range []string{
		"add table ip weir", "add counter ip weir " + counterPassedPackets + " { packets 10 bytes 1000 }",
		"add counter ip weir " + counterTaken2 + " { packets 7 bytes 700 }",
		"add table ip6 weir", "add counter ip6 weir " + counterPassedPackets + " { packets 5 bytes 500 }",
		"add counter ip6 weir " + counterRefusedNotAPeer + " { packets 3 bytes 300 }",
		// A counter of another name is no moved connection's.
		"add counter ip weir someone_elses { packets 99 bytes 9900 }",
	} {
		if out, err := exec.Command("sh", "-c", "nft '"+cmd+"'").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
	}
	dp, err := NewForNode(Config{Flows: &FlowRedirect{Interface: "weir-flows"}})
	if err != nil {
		t.Fatal(err)
	}
	if dp.elements == nil {
		t.Fatal("no netlink socket: the counters would be read through nft")
	}
	if err := dp.Apply(ctx, flowsState(2, FlowPeer{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}})); err != nil {
		t.Fatal(err)
	}
	got, err := dp.FlowCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := FlowCounts{PassedPackets: 15, TakenPackets: [4]uint64{0, 7, 0, 0}, RefusedNotAPeer: 3}
	if got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	// The same as nft reads them.
	dp.elements = nil
	throughNft, err := dp.FlowCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if throughNft != got {
		t.Errorf("over netlink %+v, through nft %+v", got, throughNft)
	}
}
