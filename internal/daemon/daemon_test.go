package daemon

import (
	"bytes"
	"encoding/json"
	"flag"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
