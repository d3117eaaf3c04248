package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
	"github.com/weirlb/weir/test/weirlab"
)

// target is one process Prometheus would scrape.
type target struct {
	job, instance string
	ns            *lab.Netns
	url           string
}

// scrape is what every target exported at one moment: job/instance ->
// families by name.
type scrape struct {
	at       time.Time
	families map[[2]string]map[string]*dto.MetricFamily
}

func scrapeAll(t *testing.T, targets []target) scrape {
	t.Helper()
	s, err := tryScrapeAll(t, targets)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryScrapeAll is scrapeAll for a wait: a process that has not opened
// its metrics port yet (just started, on a busy machine) is an error to
// wait out. What cannot be parsed still fails the test.
func tryScrapeAll(t *testing.T, targets []target) (scrape, error) {
	t.Helper()
	s := scrape{at: time.Now(), families: map[[2]string]map[string]*dto.MetricFamily{}}
	for _, tg := range targets {
		a, err := httpGet(t, tg.ns, tg.url)
		if err != nil {
			return s, fmt.Errorf("scraping %s %s: %v", tg.job, tg.instance, err)
		}
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(a.body))
		if err != nil {
			t.Fatalf("%s %s exports what Prometheus cannot parse: %v", tg.job, tg.instance, err)
		}
		s.families[[2]string{tg.job, tg.instance}] = fams
	}
	return s, nil
}

// value reads a gauge or counter from a target; NaN-free: false when
// absent.
func (s scrape) value(job, instance, name string, labels map[string]string) (float64, bool) {
	f := s.families[[2]string{job, instance}][name]
	for _, m := range f.GetMetric() {
		match := true
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			match = match && found
		}
		if match {
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// TestAlertsFireOnALabsFaults runs a lab with every kind of process
// (server, agents speaking BGP to FRR, a load-balancer speaker), its
// certificates ten days from their end, and records what each exports,
// healthy and then with faults: node1's applies hung, node2's agent
// killed, the router stopped, the address pool filled. Those recordings
// become promtool's input series for the shipped alerts
// (deploy/monitoring/weir-alerts.yaml), and promtool checks that each
// alert fires on exactly the faults it is for, with its annotations. The
// healthy recording also regenerates docs/metrics.md's reference, which
// must match the file (WEIR_UPDATE_METRICS_DOC=1 rewrites it).
func TestAlertsFireOnALabsFaults(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is required (Debian package prometheus)")
		}
		t.Skip("needs promtool (apt-get install prometheus)")
	}
	c, r := startBGPClusterWith(t, func(*lab.Node) []string {
		// BFD with a router that runs none: its sessions stay Down, and
		// their metrics are exported.
		return []string{"--bgp-peers", fmt.Sprintf("%s/%d,%s/%d", lab.RouterLANv4, routerASN, lab.RouterLANv6, routerASN), "--bgp-bfd-interval", "300ms"}
	}, labRouter, func(c *weirlab.Cluster) {
		c.CertValidity = 10 * 24 * time.Hour
		// The pool comes from a resources file, so that its metric is
		// exported too.
		pools := filepath.Join(t.TempDir(), "pools.yaml")
		if err := os.WriteFile(pools, []byte("kind: AddressPool\nmetadata: {name: public}\naddresses: [203.0.113.80/30]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		c.ServerArgs = append(c.ServerArgs, "--resources-file", pools)
	})
	ctx := context.Background()
	if _, err := c.StartSpeaker("lb1", "--bgp-asn", strconv.Itoa(nodeASN), "--bgp-router-id", lab.ControlIPv4.String(),
		"--bgp-peers", fmt.Sprintf("%s/%d,%s/%d", lab.RouterLANv4, routerASN, lab.RouterLANv6, routerASN), "--bgp-bfd-interval", "300ms"); err != nil {
		t.Fatal(err)
	}
	pooled := func(i int) {
		svc := lbService(fmt.Sprintf("pooled%d", i), int32(30100+i), []string{fmt.Sprintf("10.96.0.%d", 70+i)}, nil)
		svc.Status = nil
		createService(t, c, svc, c.Pods())
	}
	pooled(0)

	targets := []target{
		{"weir-server", "control", c.Control, "http://127.0.0.1:7444/metrics"},
		{"weir-speaker", "lb1", c.Control, "http://127.0.0.1:7446/metrics"},
	}
	for _, n := range c.Nodes {
		targets = append(targets, target{"weir-agent", n.Name, n.Netns, "http://127.0.0.1:10249/metrics"})
	}
	wait.For(t, 60*time.Second, "every BGP session established", func() error {
		s, err := tryScrapeAll(t, targets)
		if err != nil {
			return err
		}
		for _, tg := range targets[1:] {
			for _, peer := range []string{lab.RouterLANv4.String(), lab.RouterLANv6.String()} {
				if v, ok := s.value(tg.job, tg.instance, "weir_bgp_session_up", map[string]string{"peer": peer}); !ok || v != 1 {
					return fmt.Errorf("%s's session with %s: up %v (exported: %v)", tg.instance, peer, v, ok)
				}
			}
		}
		return nil
	})
	healthy := scrapeAll(t, targets)
	checkMetricsReference(t, healthy)

	// The faults.
	if err := c.Agents[0].Signal(syscall.SIGUSR1); err != nil { // node1 holds its applies
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Agents[0].Signal(syscall.SIGUSR2) })
	if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: endpointSlices("pooled0", c.Nodes[0].Pods)[0]}); err != nil {
		t.Fatal(err)
	}
	if err := c.Agents[1].Kill(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	for i := 1; i <= 3; i++ {
		svc := lbService(fmt.Sprintf("pooled%d", i), int32(30100+i), []string{fmt.Sprintf("10.96.0.%d", 70+i)}, nil)
		svc.Status = nil
		if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
			t.Fatal(err)
		}
	}
	faulty := targets[:3] // node2's agent is gone
	var broken scrape
	wait.For(t, 60*time.Second, "every fault shows in the metrics", func() error {
		broken = scrapeAll(t, faulty)
		for _, want := range []struct {
			job, instance, name string
			labels              map[string]string
			value               float64
			above               bool
		}{
			{"weir-server", "control", "weir_node_agent_connected", map[string]string{"node": "node2"}, 0, false},
			{"weir-server", "control", "weir_node_programmed_version_lag", map[string]string{"node": "node1"}, 0, true},
			{"weir-server", "control", "weir_address_pool_addresses_in_use", map[string]string{"pool": "public"}, 4, false},
			{"weir-agent", "node1", "weir_agent_configuration_stale", map[string]string{"reason": "not_applied"}, 1, false},
			{"weir-agent", "node1", "weir_bgp_session_up", map[string]string{"peer": lab.RouterLANv4.String()}, 0, false},
			{"weir-speaker", "lb1", "weir_bgp_session_up", map[string]string{"peer": lab.RouterLANv6.String()}, 0, false},
		} {
			v, ok := broken.value(want.job, want.instance, want.name, want.labels)
			if !ok || (want.above && v <= want.value) || (!want.above && v != want.value) {
				return fmt.Errorf("%s of %s %v: %v (exported: %v)", want.name, want.instance, want.labels, v, ok)
			}
		}
		return nil
	})

	rules := filepath.Join(moduleRoot(t), "deploy", "monitoring", "weir-alerts.yaml")
	checkRulesReadExportedMetrics(t, rules, healthy)
	dir := t.TempDir()
	serverCert, nodeCert := filepath.Join(c.CertDir, "server.crt"), func(n string) string { return filepath.Join(c.CertDir, n+".crt") }
	certAlert := func(instance, job, use, file string) map[string]string {
		return map[string]string{"instance": instance, "job": job, "use": use, "kind": "certificate", "file": file}
	}
	// Healthy: only the ten-day certificates (the server's and the
	// agents'; the speaker's is a year long).
	atHealthy := map[string][]map[string]string{
		"WeirCertificateExpiringSoon": {
			certAlert("control", "weir-server", "server", serverCert),
			certAlert("node1", "weir-agent", "agent", nodeCert("node1")),
			certAlert("node2", "weir-agent", "agent", nodeCert("node2")),
		},
	}
	atFaulty := map[string][]map[string]string{
		"WeirAgentDisconnected":       {{"instance": "control", "job": "weir-server", "node": "node2"}},
		"WeirNodeNotProgrammed":       {{"instance": "control", "job": "weir-server", "node": "node1"}},
		"WeirAgentConfigurationStale": {{"instance": "node1", "job": "weir-agent", "reason": "not_applied"}},
		"WeirBGPSessionDown": {
			{"instance": "node1", "job": "weir-agent", "peer": lab.RouterLANv4.String()},
			{"instance": "node1", "job": "weir-agent", "peer": lab.RouterLANv6.String()},
			{"instance": "lb1", "job": "weir-speaker", "peer": lab.RouterLANv4.String()},
			{"instance": "lb1", "job": "weir-speaker", "peer": lab.RouterLANv6.String()},
		},
		"WeirAddressPoolNearlyExhausted": {{"instance": "control", "job": "weir-server", "pool": "public", "family": "IPv4"}},
		"WeirCertificateExpiringSoon": {
			certAlert("control", "weir-server", "server", serverCert),
			certAlert("node1", "weir-agent", "agent", nodeCert("node1")),
		},
	}
	test := promtoolTest(t, rules, healthy, broken, atHealthy, atFaulty)
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), test, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, promtool, "test", "rules", filepath.Join(dir, "test.yaml")).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
		if os.Getenv("WEIR_KEEP") != "" {
			t.Logf("test file:\n%s", test)
		}
	}
}

// phase is how long each recording stands in promtool's time: longer
// than every alert's for.
const phase = 70 * time.Minute

// promtoolTest writes promtool's unit test: every series recorded, the
// healthy values for one phase then the faulty ones for another, and the
// alerts expected at the end of each (every alert of the rules file is
// checked at both times; one not listed must not fire).
func promtoolTest(t *testing.T, rules string, healthy, broken scrape, atHealthy, atFaulty map[string][]map[string]string) []byte {
	t.Helper()
	points := int(phase / time.Minute)
	series := map[string][2]string{} // series -> values in each phase
	var order []string
	add := func(s scrape, i int) {
		for jobInstance, fams := range s.families {
			for name, f := range fams {
				if !strings.HasPrefix(name, "weir_") || f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
					continue
				}
				for _, m := range f.GetMetric() {
					labels := map[string]string{"job": jobInstance[0], "instance": jobInstance[1]}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					key := name + labelString(labels)
					v := m.GetGauge().GetValue()
					if f.GetType() == dto.MetricType_COUNTER {
						v = m.GetCounter().GetValue()
					}
					if strings.HasSuffix(name, "_timestamp_seconds") {
						// promtool's clock starts at 0: a moment is kept
						// as its distance from its recording, placed at
						// the start of its phase.
						v = v - float64(s.at.Unix()) + float64(i)*phase.Seconds()
					}
					if _, ok := series[key]; !ok {
						order = append(order, key)
					}
					vals := series[key]
					vals[i] = strconv.FormatFloat(v, 'f', -1, 64) + "+0x" + strconv.Itoa(points-1)
					series[key] = vals
				}
			}
		}
	}
	add(healthy, 0)
	add(broken, 1)
	sort.Strings(order)
	type inputSeries struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	var input []inputSeries
	for _, k := range order {
		v := series[k]
		for i := range v {
			if v[i] == "" {
				v[i] = "_" // not exported in that phase
			}
		}
		input = append(input, inputSeries{k, fixPhase(v[0], points) + " " + fixPhase(v[1], points)})
	}
	type alert struct {
		Labels      map[string]string `yaml:"exp_labels"`
		Annotations map[string]string `yaml:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string  `yaml:"eval_time"`
		Alertname string  `yaml:"alertname"`
		Alerts    []alert `yaml:"exp_alerts"`
	}
	defs := alertDefs(t, rules)
	var tests []alertTest
	for i, want := range []map[string][]map[string]string{atHealthy, atFaulty} {
		at := (time.Duration(i)*phase + phase - 5*time.Minute).String()
		for _, name := range slices.Sorted(maps.Keys(defs)) {
			at := alertTest{EvalTime: at, Alertname: name, Alerts: []alert{}}
			for _, l := range want[name] {
				labels := maps.Clone(l)
				maps.Copy(labels, defs[name].Labels)
				ann := map[string]string{}
				for k, tmpl := range defs[name].Annotations {
					ann[k] = expandLabels(tmpl, labels)
				}
				at.Alerts = append(at.Alerts, alert{labels, ann})
			}
			tests = append(tests, at)
		}
	}
	doc := map[string]any{
		"rule_files":          []string{rules},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval":        "1m",
			"input_series":    input,
			"alert_rule_test": tests,
		}},
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fixPhase is one phase's values: the recorded one repeated, or no
// sample ("_") when the series was not exported then.
func fixPhase(v string, points int) string {
	if strings.HasPrefix(v, "_") {
		return strings.TrimSpace(strings.Repeat("_ ", points))
	}
	return v
}

func labelString(labels map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+strconv.Quote(labels[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// alertDef is what promtool compares of an alerting rule.
type alertDef struct {
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertDefs(t *testing.T, rules string) map[string]alertDef {
	t.Helper()
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert    string `yaml:"alert"`
				alertDef `yaml:",inline"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	defs := map[string]alertDef{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			defs[r.Alert] = r.alertDef
		}
	}
	return defs
}

// expandLabels fills a template that uses only {{ $labels.NAME }}.
func expandLabels(tmpl string, labels map[string]string) string {
	return regexp.MustCompile(`\{\{ *\$labels\.([a-z_]+) *\}\}`).ReplaceAllStringFunc(tmpl, func(m string) string {
		return labels[regexp.MustCompile(`\$labels\.([a-z_]+)`).FindStringSubmatch(m)[1]]
	})
}

// checkRulesReadExportedMetrics: every metric an alert reads is one the
// lab exported (an alert on a misspelled metric never fires).
func checkRulesReadExportedMetrics(t *testing.T, rules string, s scrape) {
	t.Helper()
	exported := map[string]bool{}
	for _, fams := range s.families {
		for name := range fams {
			exported[name] = true
		}
	}
	for name, d := range alertDefs(t, rules) {
		names := regexp.MustCompile(`\bweir_[a-z0-9_]+`).FindAllString(d.Expr, -1)
		if len(names) == 0 {
			t.Errorf("alert %s reads no Weir metric: %s", name, d.Expr)
		}
		for _, m := range names {
			if !exported[m] {
				t.Errorf("alert %s reads %s, which no process of the lab exports", name, m)
			}
		}
	}
}

// checkMetricsReference renders docs/metrics.md from what the lab
// exported, and compares it with the file.
func checkMetricsReference(t *testing.T, s scrape) {
	t.Helper()
	type entry struct {
		typ, help string
		labels    map[string]bool
		jobs      map[string]bool
	}
	entries := map[string]*entry{}
	for jobInstance, fams := range s.families {
		for name, f := range fams {
			if !strings.HasPrefix(name, "weir_") {
				continue
			}
			e := entries[name]
			if e == nil {
				e = &entry{typ: strings.ToLower(f.GetType().String()), help: f.GetHelp(), labels: map[string]bool{}, jobs: map[string]bool{}}
				entries[name] = e
			}
			e.jobs[jobInstance[0]] = true
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					e.labels[l.GetName()] = true
				}
			}
		}
	}
	var b strings.Builder
	b.WriteString(`# Metrics reference

Generated from what a lab's processes export (test/e2e
TestAlertsFireOnALabsFaults; WEIR_UPDATE_METRICS_DOC=1 rewrites this file).
Every metric is Weir's own (weir_*); each process also exports Go's and the
process's (go_*, process_*). Labels are bounded: per node, pool, BGP peer or
certificate, never per service. docs/operations.md says how to use them, and
deploy/monitoring holds the alerts and a dashboard.

| metric | type | labels | exported by | meaning |
| --- | --- | --- | --- | --- |
`)
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		e := entries[name]
		labels := strings.Join(slices.Sorted(maps.Keys(e.labels)), ", ")
		if labels == "" {
			labels = "-"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", name, e.typ, labels, strings.Join(slices.Sorted(maps.Keys(e.jobs)), ", "), strings.ReplaceAll(e.help, "|", "\\|"))
	}
	path := filepath.Join(moduleRoot(t), "docs", "metrics.md")
	if os.Getenv("WEIR_UPDATE_METRICS_DOC") != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != b.String() {
		t.Errorf("docs/metrics.md differs from what the lab exports; run WEIR_UPDATE_METRICS_DOC=1 go test -run TestAlertsFireOnALabsFaults ./test/e2e and commit. Generated:\n%s", b.String())
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := weirlab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
