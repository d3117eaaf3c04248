package datapath

import (
	"context"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weirlb/weir/test/lab"
)

// inNewNetns runs the rest of the calling test in a fresh network namespace
// on a locked OS thread, so the nft processes it starts see only that
// namespace. The thread is never unlocked: Go discards it when the test ends.
func inNewNetns(t *testing.T) { inNewNetnsTB(t) }

func inNewNetnsTB(t testing.TB) {
	t.Helper()
	lab.SkipUnlessPrivileged(t)
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Fatalf("unshare network namespace: %v", err)
	}
}

// TestRealNftablesAcceptsTheRuleset loads full and partial syncs into the
// kernel: the fake does not check nftables syntax, the kernel does.
func TestRealNftablesAcceptsTheRuleset(t *testing.T) {
	inNewNetns(t)
	ctx := context.Background()
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
	st := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.11", false), ep("fd00:244:1::11", true)), local, dns)
	if err := dp.Apply(ctx, st); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	// A new endpoint count makes the partial sync create a pick chain
	// that refers to maps the kernel already holds.
	local2 := *local
	local2.Ports = []ServicePort{local.Ports[0]}
	local2.Ports[0].Endpoints = []Endpoint{ep("10.244.1.12", true), ep("10.244.2.99", false)}
	st2 := nodeState(webService(ep("10.244.1.11", true), ep("10.244.2.12", false), ep("10.244.2.13", false)), &local2,
		dnsService(UDP, ep("10.244.1.53", true), ep("10.244.2.53", false)))
	if err := dp.Apply(ctx, st2); err != nil {
		t.Fatalf("partial sync: %v", err)
	}
	if err := dp.Resync(ctx); err != nil {
		t.Fatalf("resync: %v", err)
	}
	out, err := exec.Command("nft", "list", "map", "ip", TableName, ipKind.backends(TCP)).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	for _, want := range []string{"10.96.0.10 . tcp . 80 . 1 : 10.244.2.12 . 8080", "203.0.113.10 . tcp . 80 . 0 : 10.244.1.11 . 8080"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("backends map lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "10.244.2.11") {
		t.Errorf("backends map still has the removed endpoint:\n%s", out)
	}
	// Operators must be able to list the table, and a UDP pick chain made
	// by a partial sync must not carry a TCP match.
	if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	out, err = exec.Command("nft", "list", "chain", "ip", TableName, ipKind.pickChain(UDP, 2)).CombinedOutput()
	if err != nil || strings.Contains(string(out), "tcp") || !strings.Contains(string(out), "udp_backends") {
		t.Errorf("UDP pick chain: %v:\n%s", err, out)
	}
}
