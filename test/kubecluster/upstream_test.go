package kubecluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/test/kubeapi"
	"github.com/weirlb/weir/test/kubecluster"
	"github.com/weirlb/weir/test/lab"
)

// The upstream specs make test runs on Weir: the [Conformance] specs of
// Services and EndpointSlices (the side-by-side run shows kube-proxy
// passing every one of them on this lab).
const conformanceFocus = `^\[sig-network\] (Services|EndpointSlice|EndpointSliceMirroring) .*\[Conformance\]`

// The specs the side-by-side run (make test-upstream) takes: every
// [sig-network] spec about Services, EndpointSlices and the proxies...
const upstreamFocus = `^\[sig-network\] (Services|EndpointSlice|EndpointSliceMirroring|Networking|Service CIDRs|Conntrack|KubeProxy|Service endpoints latency|Connectivity Pod Lifecycle) `

// ...but those the lab cannot hold (docs/kube-proxy.md says why for each).
const upstreamSkip = `\[Feature:|\[Disruptive\]|\[Serial\]|LoadBalancer|\[sig-windows\]|SCTP`

// upstreamExternalIP is the address upstream's "should be possible to
// connect to a service via ExternalIP when the external IP is not assigned
// to a node" spec gives its Service's spec.externalIPs.
const upstreamExternalIP = "203.0.113.250"

// upstreamNodes is the side-by-side clusters' size: three, as some specs
// need (HealthCheckNodePort when ExternalTrafficPolicy changes).
const upstreamNodes = 3

// upstreamShards is how many e2e.test processes share a run's specs.
const upstreamShards = 4

// TestUpstreamSideBySide runs Kubernetes' own network e2e specs on two
// clusters of the lab, one served by kube-proxy (nftables mode) and one by
// Weir, and fails for every spec that passes on kube-proxy and not on
// Weir. Opt-in (WEIR_UPSTREAM=1; make test-upstream): about an hour on
// two cores. It writes the table docs/kube-proxy.md shows to
// $WEIR_UPSTREAM_REPORT (default: the test's log).
func TestUpstreamSideBySide(t *testing.T) {
	if os.Getenv("WEIR_UPSTREAM") == "" {
		t.Skip("opt-in: WEIR_UPSTREAM=1 (make test-upstream) runs Kubernetes' network e2e specs on kube-proxy and on Weir, about an hour")
	}
	requireClusterLab(t)
	focus, skip := upstreamFocus, upstreamSkip
	if f := os.Getenv("WEIR_UPSTREAM_FOCUS"); f != "" {
		focus = f
	}
	specs, err := kubecluster.UpstreamSpecs(t.Context(), focus, skip)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d specs", len(specs))
	proxies := []string{"kube-proxy", "weir"}
	if p := os.Getenv("WEIR_UPSTREAM_PROXIES"); p != "" {
		proxies = strings.Split(p, ",")
	}
	results := map[string][]kubecluster.SpecResult{}
	for _, proxy := range proxies {
		t.Run(proxy, func(t *testing.T) {
			results[proxy] = runUpstream(t, proxy, specs)
		})
	}
	table := upstreamTable(specs, proxies, results)
	if path := os.Getenv("WEIR_UPSTREAM_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	} else {
		t.Log("\n" + table)
	}
	base, weir := results["kube-proxy"], results["weir"]
	if len(base) == 0 || len(weir) == 0 {
		return
	}
	for i, s := range specs {
		if base[i].Passed() && !weir[i].Passed() {
			t.Errorf("passes on kube-proxy, %s on Weir: %s\n%s", weir[i].State, s.Name, weir[i].Failure)
		}
	}
}

// TestUpstreamConformanceOnWeir runs the [Conformance] specs of Services
// and EndpointSlices on a cluster Weir serves, installed by its chart, with
// a cluster DNS: every one must pass.
func TestUpstreamConformanceOnWeir(t *testing.T) {
	requireClusterLab(t)
	l := install(t, 2, true)
	specs, err := kubecluster.UpstreamSpecs(t.Context(), conformanceFocus, upstreamSkip)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) < 15 {
		t.Fatalf("%d conformance specs selected, want the 15 or more of Kubernetes %s", len(specs), kubeapi.Version)
	}
	for _, r := range runSpecs(t, l.c, specs) {
		if !r.Passed() {
			t.Errorf("%s: %s\n%s", r.State, r.Name, r.Failure)
		}
	}
}

func requireClusterLab(t *testing.T) {
	lab.RequireRoot(t, "the cluster lab", "it runs kubelets and containerd in network namespaces",
		"ip", "nft", "containerd", "runc", "ctr", "/usr/lib/frr/bgpd", "nc.openbsd", "curl", "ss", "wget")
}

// runUpstream starts a cluster served by proxy (kube-proxy or weir), runs
// the specs on it and returns their results, in the specs' order.
func runUpstream(t *testing.T, proxy string, specs []kubecluster.Spec) []kubecluster.SpecResult {
	var c *kubecluster.Cluster
	switch proxy {
	case "kube-proxy":
		images, err := kubecluster.UpstreamImages(t.Context(), filepath.Join(t.TempDir(), "e2e-images"))
		if err != nil {
			t.Fatal(err)
		}
		c = kubecluster.StartForTest(t, kubecluster.Config{Nodes: upstreamNodes, Images: images, KubeProxy: true, DNS: true, Upstream: true})
	case "weir":
		c = install(t, upstreamNodes, true).c
	default:
		t.Fatalf("no proxy %q: kube-proxy or weir", proxy)
	}
	return runSpecs(t, c, specs)
}

// runSpecs runs the specs on the cluster and returns their results, in the
// specs' order; the e2e logs and reports stay in the cluster's folder when
// the test fails.
func runSpecs(t *testing.T, c *kubecluster.Cluster, specs []kubecluster.Spec) []kubecluster.SpecResult {
	start := time.Now()
	dir := filepath.Join(c.Dir, "e2e")
	results, err := c.RunUpstream(t.Context(), dir, specs, upstreamShards)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]int{}
	for _, r := range results {
		states[r.State]++
		t.Logf("%-9s %6.1fs %s", r.State, r.Duration.Seconds(), r.Name)
		if r.Failure != "" {
			t.Logf("          %s", firstLines(r.Failure, 4))
		}
	}
	t.Logf("%d specs in %v: %v (logs and reports in %s)", len(specs), time.Since(start).Round(time.Second), states, dir)
	return results
}

// upstreamTable is a Markdown table of each spec's result on each proxy.
func upstreamTable(specs []kubecluster.Spec, proxies []string, results map[string][]kubecluster.SpecResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| Spec | %s |\n|---|%s\n", strings.Join(proxies, " | "), strings.Repeat("---|", len(proxies)))
	for i, s := range specs {
		fmt.Fprintf(&b, "| %s |", strings.ReplaceAll(s.Name, "|", `\|`))
		for _, p := range proxies {
			state := "-"
			if rs := results[p]; i < len(rs) {
				state = rs[i].State
			}
			fmt.Fprintf(&b, " %s |", state)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// firstLines is the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n          ")
}
