package e2e

import (
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/connflood"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
)

// TestHealthPortsAnswerProbesThroughAFlood: one host on the node network
// holding as many connections as it can to node1's health-check port and
// /healthz, from 40 IPv4 addresses and 40 of the LAN's IPv6 /64, does not
// keep the load balancer (the router, another host on the LAN, so in the
// same /64) from a single answer; the agent's flags set its limits, and
// its metrics count what it closed.
func TestHealthPortsAnswerProbesThroughAFlood(t *testing.T) {
	c := startCluster(t, "--healthz-max-connections=64")
	const hcPort = 32106
	svc := lbService("flooded", 30094, []string{"10.96.0.44", "fd00:96::44"}, []string{"203.0.113.44", "2001:db8:113::44"})
	svc.Spec.ExternalTrafficPolicy = weirv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Spec.HealthCheckNodePort = hcPort
	node1 := c.Nodes[0]
	createService(t, c, svc, []*lab.Pod{node1.Pods[0]})
	// The load balancer (the router) probes node1 before the flood, as
	// it always does.
	urls := []string{hcURL(node1.IPv4, hcPort), hcURL(node1.IPv6, hcPort), hcURL(node1.IPv4, 10256)}
	for _, url := range urls {
		waitCode(t, c.Router, url, http.StatusOK)
	}

	// The attacker: the control host, with 40 more addresses of the rack
	// LAN and 40 of its IPv6 /64.
	var attacker []netip.Addr
	cmds := []string{}
	for i := range 40 {
		v4 := netip.AddrFrom4([4]byte{192, 0, 2, byte(150 + i)})
		v6 := netip.MustParseAddr(fmt.Sprintf("2001:db8:2::1:%x", i))
		attacker = append(attacker, v4, v6)
		cmds = append(cmds, fmt.Sprintf("addr add %s/24 dev eth0", v4), fmt.Sprintf("addr add %s/64 dev eth0 nodad", v6))
	}
	cmd := exec.Command("ip", "-n", c.Control.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("addresses of the attacker: %v: %s", err, out)
	}
	th, err := c.Control.Thread()
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	targets := []netip.AddrPort{netip.AddrPortFrom(node1.IPv4, hcPort), netip.AddrPortFrom(node1.IPv6, hcPort), netip.AddrPortFrom(node1.IPv4, 10256)}
	f := connflood.Start(th.DialFrom, attacker, targets, 17)
	defer f.Stop()
	wait.Until(t, time.Minute, "every connection of the flood opened once", func() bool { return f.Connected() == f.Slots() })
	time.Sleep(time.Second) // the agent takes what it will of them

	const probeTimeout = 2 * time.Second
	p := connflood.Probe(c.Router.HTTPClient(probeTimeout), urls, 50, http.StatusOK)
	t.Logf("%d of %d probes answered within %s, the slowest in %s; the flood held %d connection slots",
		p.Answered, p.Asked, probeTimeout, p.Slowest.Round(time.Millisecond), f.Slots())
	if p.Answered != p.Asked {
		t.Errorf("%d of %d probes from the router unanswered within %s while the control host flooded node1: %s",
			p.Asked-p.Answered, p.Asked, probeTimeout, strings.Join(p.Failures, "; "))
	}

	metrics, err := httpGet(t, node1.Netns, "http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatal(err)
	}
	value := func(series string) float64 {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(metrics.body)
		if m == nil {
			t.Errorf("no %s in node1's metrics", series)
			return 0
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	if held := value(`weir_health_connections{listener="healthz"}`); held > 64 {
		t.Errorf("/healthz holds %v connections; want at most --healthz-max-connections, 64", held)
	}
	for _, series := range []string{
		`weir_health_connections_closed_total{listener="healthz",reason="evicted"}`,
		`weir_health_connections_closed_total{listener="service_health_checks",reason="evicted"}`,
		`weir_health_connections_closed_total{listener="service_health_checks",reason="source_share"}`,
	} {
		if value(series) == 0 {
			t.Errorf("%s is 0 after the flood", series)
		}
	}
}
