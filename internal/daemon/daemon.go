// Package daemon holds what Weir's long-running binaries (weir-server,
// weir-agent, weir-speaker) share on their command lines: logging, the
// version, and the metrics endpoint with its opt-in profiles.
package daemon

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/weirlb/weir/internal/memlimit"
	"k8s.io/klog/v2"
)

// Flags are the shared flags, once parsed.
type Flags struct {
	level, format *string
	profiling     *bool
	version       *bool
}

// AddFlags adds --log-level, --log-format, --profiling and --version to fs.
func AddFlags(fs *flag.FlagSet) *Flags {
	return &Flags{
		level:     fs.String("log-level", "info", "debug, info, warn or error"),
		format:    fs.String("log-format", "text", "text (logfmt) or json (one object a line)"),
		profiling: fs.Bool("profiling", false, "also serve Go's profiles (/debug/pprof/) on --metrics-bind-address: unauthenticated, they show memory and cost CPU while taken; keep that address on loopback"),
		version:   fs.Bool("version", false, "print the version and exit"),
	}
}

// Start is what every daemon does first: with --version it prints
// "NAME VERSION" to out and says to stop; otherwise it returns the logger
// the flags ask for, writing to logs, and makes it the process's only
// logger (see logEverythingThrough), and keeps the Go heap under the
// cgroup's memory limit (see memlimit).
func (f *Flags) Start(name, version string, out, logs io.Writer) (log *slog.Logger, stop bool, err error) {
	if *f.version {
		fmt.Fprintln(out, name, version)
		return nil, true, nil
	}
	if log, err = f.Logger(logs); err != nil {
		return nil, false, err
	}
	logEverythingThrough(log)
	memlimit.Apply(log)
	return log, false, nil
}

// started is the logger Start made, nil before: Exit reports through it.
var started atomic.Pointer[slog.Logger]

// logEverythingThrough makes log the process's logger for the code that
// does not take one: klog (client-go's reflectors, leader election), the
// standard library's log package (net/http's server errors) and slog's
// default. A log collector that parses --log-format json would drop or
// mangle a plain-text line, and those are the lines that say why a daemon
// cannot reach the cluster.
func logEverythingThrough(log *slog.Logger) {
	started.Store(log)
	slog.SetDefault(log)
	klog.SetSlogLogger(log)
	// klog checks its own verbosity before it calls the logger: let its
	// V(n) lines through as far as the handler takes them. A logr V(n)
	// line is slog level -n, so --log-level debug (-4) shows klog's V(4)
	// (client-go's requests and retries), info shows V(0) only, and
	// debug-2 shows V(6).
	v := 0
	for log.Enabled(context.Background(), slog.Level(-v-1)) && v < maxKlogVerbosity {
		v++
	}
	var level klog.Level
	_ = level.Set(strconv.Itoa(v)) // a decimal integer always parses
}

// maxKlogVerbosity bounds klog's verbosity when the handler takes every
// level: past 10, Kubernetes' code logs nothing more.
const maxKlogVerbosity = 10

// Exit ends a daemon whose run failed with err, with status 1. The error
// is logged through the daemon's logger once Start made one, so that the
// last line of a crashing pod is in the format the flags ask for; before
// (a bad flag, --log-format itself) it is written as "NAME: err".
func Exit(name string, err error) {
	if log := started.Load(); log != nil {
		log.Error("stopped", "error", err)
	} else {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	os.Exit(1)
}

// Logger is the logger the flags ask for, writing to w.
func (f *Flags) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(*f.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch *f.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", *f.format)
}

// MetricsHandler serves reg's /metrics and, with --profiling, Go's
// profiles; addr is where it listens (a profile served off loopback is
// logged as a warning).
func (f *Flags) MetricsHandler(reg prometheus.Gatherer, addr string, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if *f.profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		if !Loopback(addr) {
			log.Warn("serving /debug/pprof/ off loopback (--profiling): anyone who reaches the address can read the process's memory layout and load its CPU", "address", addr)
		}
	}
	return mux
}

// Loopback reports whether a HOST:PORT listens on a loopback address only.
func Loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// Undo is what a daemon's parts leave to do when it stops, done in
// reverse: the part started last is stopped first, as deferred calls
// would be. The zero Undo is ready to use.
type Undo struct{ fs []func() }

// Add adds f, to be done before everything added earlier.
func (u *Undo) Add(f func()) { u.fs = append(u.fs, f) }

// Run does what was added, the last first.
func (u *Undo) Run() {
	for _, f := range slices.Backward(u.fs) {
		f()
	}
}
