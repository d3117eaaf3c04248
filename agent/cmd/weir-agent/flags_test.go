package main

import (
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestLocalDetectionFlags(t *testing.T) {
	for _, tc := range []struct {
		mode, bridge, prefix string
		ok                   bool
	}{
		{"ClusterCIDR", "", "", true},
		{"None", "", "", true},
		{"BridgeInterface", "cbr0", "", true},
		{"BridgeInterface", "", "", false},                        // no bridge named
		{"BridgeInterface", `cbr0" accept`, "", false},            // not an interface name
		{"InterfaceNamePrefix", "", "veth", true},                 //
		{"InterfaceNamePrefix", "", "a-name-far-too-long", false}, // over 15
		{"clustercidr", "", "", false},                            // kube-proxy's spelling only
	} {
		_, err := localDetection(tc.mode, tc.bridge, tc.prefix)
		if (err == nil) != tc.ok {
			t.Errorf("localDetection(%q, %q, %q): %v; want ok %v", tc.mode, tc.bridge, tc.prefix, err, tc.ok)
		}
	}
}

func TestServiceCIDRFlagIsARange(t *testing.T) {
	for list, ok := range map[string]bool{
		"":                           true,
		"10.96.0.0/12,fd00:96::/108": true,
		"0.0.0.0/0":                  false,
		"::/0":                       false,
		"10.96.0.1/12":               false,
		"169.254.0.0/16":             false,
	} {
		if _, err := serviceRanges(list); (err == nil) != ok {
			t.Errorf("--service-cidr %q: %v; want ok %v", list, err, ok)
		}
	}
}

// --bgp-asn takes an AS number, or nothing (a manifest passing an unset
// setting through as --bgp-asn=$(WEIR_BGP_ASN)).
func TestBGPASNFlag(t *testing.T) {
	for in, want := range map[string]uint32{"": 0, "0": 0, "64512": 64512, "4200000000": 4200000000} {
		var a asn
		if err := a.Set(in); err != nil || uint32(a) != want {
			t.Errorf("--bgp-asn=%q: %d, %v; want %d", in, a, err, want)
		}
	}
	for _, in := range []string{"-1", "4294967296", "AS64512", " 64512", "23456"} {
		var a asn
		if err := a.Set(in); err == nil {
			t.Errorf("--bgp-asn=%q accepted", in)
		}
	}
}

// The health listeners' limits: counts of at least one, prefix lengths of
// their family; a bad one names its flag.
func TestHealthLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		hc, healthz, perSource, v4, v6 int
		bad                            string // the flag the error names; "" for none
	}{
		{512, 128, 16, 32, 64, ""},
		{1, 1, 1, 0, 0, ""},
		{512, 128, 16, 24, 128, ""},
		{0, 128, 16, 32, 64, "--health-check-max-connections"},
		{512, 0, 16, 32, 64, "--healthz-max-connections"},
		{512, 128, 0, 32, 64, "--health-connections-per-source"},
		{512, 128, 16, 33, 64, "--health-source-ipv4-prefix"},
		{512, 128, 16, -1, 64, "--health-source-ipv4-prefix"},
		{512, 128, 16, 32, 129, "--health-source-ipv6-prefix"},
	} {
		hc, healthz, err := healthLimits(tc.hc, tc.healthz, tc.perSource, tc.v4, tc.v6)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%+v: %v", tc, err)
		case tc.bad != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.bad+" ")):
			t.Errorf("%+v: %v; want an error naming %s", tc, err, tc.bad)
		case tc.bad == "" && (hc.Connections != tc.hc || healthz.Connections != tc.healthz || hc.PerSource != tc.perSource ||
			healthz.PerSource != tc.perSource || hc.IPv4Prefix != tc.v4 || healthz.IPv6Prefix != tc.v6):
			t.Errorf("%+v: limits %+v and %+v", tc, hc, healthz)
		}
	}
}

// The flags that reach the server keep their names, defaults and help
// (they are shared with weir-speaker's, which says "speaker" instead).
func TestServerFlags(t *testing.T) {
	fs := flag.NewFlagSet("weir-agent", flag.ContinueOnError)
	newOptions(fs)
	for name, want := range map[string][2]string{
		"server":          {"127.0.0.1:7443", "comma-separated HOST:PORT of weir-server's replicas (a DNS name counts as all its addresses); the agent is on one at a time, from a random start, and moves to the next when it goes away or is not current"},
		"insecure":        {"false", "talk to the server in plain text (lab and demo only)"},
		"ca-file":         {"", "CA that signed the server's certificate"},
		"cert-file":       {"", "this agent's client certificate (PEM)"},
		"key-file":        {"", "this agent's private key (PEM)"},
		"node-token-file": {"", "a service-account token naming this node (a projected token volume with the server's --agent-token-audience), sent with every call: on the agents' shared certificate, the server then lets this agent act for its own node only"},
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("no --%s", name)
			continue
		}
		if f.DefValue != want[0] || f.Usage != want[1] {
			t.Errorf("--%s: default %q, help %q; want %q, %q", name, f.DefValue, f.Usage, want[0], want[1])
		}
	}
}

// --own-daemonset names a DaemonSet as NAMESPACE/NAME, watched on an https
// apiserver; anything else is refused before the agent starts.
func TestOwnDaemonSetFlag(t *testing.T) {
	for _, tc := range []struct {
		daemonset, apiserver string
		ok                   bool
	}{
		{"", "", true}, // no watch
		{"weir-system/weir-agent", "", true},
		{"weir-system/weir-agent", "https://10.0.0.1:6443", true},
		{"weir-agent", "", false},
		{"weir-system/", "", false},
		{"/weir-agent", "", false},
		{"Weir/weir-agent", "", false},
		{"weir-system/weir-agent/x", "", false},
		{"weir-system/weir-agent", "http://10.0.0.1:8080", false},
	} {
		o := &options{ownDaemonSet: tc.daemonset, kubeAPIServer: tc.apiserver}
		cfg, err := o.removalWatch(slog.New(slog.DiscardHandler))
		if (err == nil) != tc.ok {
			t.Errorf("--own-daemonset %q --kube-apiserver %q: %v; want ok %v", tc.daemonset, tc.apiserver, err, tc.ok)
		}
		if err == nil && (cfg == nil) != (tc.daemonset == "") {
			t.Errorf("--own-daemonset %q: watch %+v", tc.daemonset, cfg)
		}
	}
}

// The metrics port answers /proxyMode as kube-proxy's does (upstream's
// "should check kube-proxy urls" spec asks for it), and still /metrics.
func TestStatusPortAnswersProxyMode(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "metrics at "+r.URL.Path) })
	srv := httptest.NewServer(statusHandler(metrics))
	defer srv.Close()
	for path, want := range map[string]string{"/proxyMode": "nftables", "/metrics": "metrics at /metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, resp.StatusCode, b, want)
		}
	}
}
