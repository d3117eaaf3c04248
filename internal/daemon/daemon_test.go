package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	stdlog "log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

func parse(t *testing.T, args ...string) *Flags {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

// Profiles are served only with --profiling, whatever the address: the
// Kubernetes manifests bind metrics on every address, without
// authentication.
func TestProfilesOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		addr string
		want int
	}{
		{nil, "127.0.0.1:7444", http.StatusNotFound},
		{nil, "0.0.0.0:7444", http.StatusNotFound},
		{[]string{"--profiling"}, "127.0.0.1:7444", http.StatusOK},
		{[]string{"--profiling"}, "[::1]:7444", http.StatusOK},
	} {
		h := parse(t, tc.args...).MetricsHandler(prometheus.NewRegistry(), tc.addr, slog.New(slog.DiscardHandler))
		for path, code := range map[string]int{"/debug/pprof/": tc.want, "/metrics": http.StatusOK} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != code {
				t.Errorf("%v on %s: %s answers %d, want %d", tc.args, tc.addr, path, rec.Code, code)
			}
		}
	}
}

// Profiles off loopback are served when asked, with a warning that says
// who can read them.
func TestProfilesOffLoopbackWarn(t *testing.T) {
	var out bytes.Buffer
	parse(t, "--profiling").MetricsHandler(prometheus.NewRegistry(), "0.0.0.0:7444", slog.New(slog.NewTextHandler(&out, nil)))
	if !strings.Contains(out.String(), "level=WARN") || !strings.Contains(out.String(), "0.0.0.0:7444") {
		t.Errorf("no warning for profiles off loopback: %q", out.String())
	}
}

func TestLogFormats(t *testing.T) {
	var out bytes.Buffer
	log, err := parse(t, "--log-format", "json", "--log-level", "debug").Logger(&out)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("agent connected", "node", "node1")
	var line map[string]any
	if err := json.Unmarshal(out.Bytes(), &line); err != nil || line["msg"] != "agent connected" || line["node"] != "node1" || line["level"] != "DEBUG" {
		t.Errorf("--log-format json: %q (%v)", out.String(), err)
	}
	out.Reset()
	if log, err = parse(t).Logger(&out); err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Info("agent connected", "node", "node1")
	if got := out.String(); !strings.Contains(got, `level=INFO msg="agent connected" node=node1`) || strings.Contains(got, "hidden") {
		t.Errorf("default text at info: %q", got)
	}
	for _, args := range [][]string{{"--log-format", "xml"}, {"--log-level", "loud"}} {
		if _, err := parse(t, args...).Logger(&out); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}

// Once a daemon started, klog (client-go's logger) and the standard
// library's log write through the daemon's handler, in its format, and
// klog's verbosity follows --log-level: debug shows client-go's V(4)
// lines (its requests and retries), info its V(0) lines only.
func TestStartRoutesKlogAndTheStandardLog(t *testing.T) {
	t.Cleanup(func() { klog.ClearLogger(); slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil))) })
	for _, tc := range []struct {
		level      string
		shown, not []string
	}{
		{"info", []string{"klog error", "klog info", "std log"}, []string{"klog v1"}},
		{"debug", []string{"klog error", "klog info", "klog v4", "std log"}, []string{"klog v5"}},
		{"warn", []string{"klog error"}, []string{"klog info", "std log"}},
	} {
		var out bytes.Buffer
		if _, _, err := parse(t, "--log-format", "json", "--log-level", tc.level).Start("weir-server", "v0.2.0", io.Discard, &out); err != nil {
			t.Fatal(err)
		}
		klog.ErrorS(errors.New("connection refused"), "klog error", "resource", "services")
		klog.InfoS("klog info")
		klog.V(1).InfoS("klog v1")
		klog.V(4).InfoS("klog v4")
		klog.V(5).InfoS("klog v5")
		stdlog.Print("std log")
		msgs := map[string]bool{}
		for line := range strings.Lines(out.String()) {
			var obj map[string]any
			if err := json.Unmarshal([]byte(line), &obj); err != nil {
				t.Errorf("--log-level %s: a line is not JSON (%v): %s", tc.level, err, line)
				continue
			}
			msg, _ := obj["msg"].(string)
			msgs[msg] = true
			if msg == "klog error" && (obj["level"] != "ERROR" || obj["err"] != "connection refused" || obj["resource"] != "services") {
				t.Errorf("klog's error lost its level or values: %s", line)
			}
		}
		for _, m := range tc.shown {
			if !msgs[m] {
				t.Errorf("--log-level %s: %q not logged; got %q", tc.level, m, out.String())
			}
		}
		for _, m := range tc.not {
			if msgs[m] {
				t.Errorf("--log-level %s: %q logged", tc.level, m)
			}
		}
	}
}

func TestVersionStops(t *testing.T) {
	var out bytes.Buffer
	log, done, err := parse(t, "--version").Start("weir-agent", "v0.2.0", &out, &out)
	if !done || err != nil || log != nil || out.String() != "weir-agent v0.2.0\n" {
		t.Errorf("--version: done %v, err %v, printed %q", done, err, out.String())
	}
	if _, done, err := parse(t).Start("weir-agent", "v0.2.0", &out, &out); done || err != nil {
		t.Errorf("without --version: done %v, err %v", done, err)
	}
}

// A daemon's parts stop in the reverse of the order they started, as
// deferred calls would.
func TestUndoRunsTheLastFirst(t *testing.T) {
	var u Undo
	var got []int
	for i := range 3 {
		u.Add(func() { got = append(got, i) })
	}
	u.Run()
	if want := []int{2, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("stopped in the order %v, want %v", got, want)
	}
}
