// Command echo is a tiny identify server for lab pods. Every HTTP request
// (any path) and every UDP datagram is answered with JSON naming the pod and
// the peer address as the server sees it, so tests can tell which backend
// answered and whether the client's address survived load balancing.
package main

import (
	"encoding/json"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

type reply struct {
	Pod    string `json:"pod"`
	Remote string `json:"remote"`
	Local  string `json:"local"`
}

// listenFlag collects -listen values; each may be a comma-separated list.
type listenFlag []string

func (l *listenFlag) String() string { return strings.Join(*l, ",") }

func (l *listenFlag) Set(s string) error {
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			*l = append(*l, a)
		}
	}
	return nil
}

func main() {
	var addrs listenFlag
	flag.Var(&addrs, "listen", `address for TCP (HTTP) and UDP; repeatable or comma-separated (default ":8080")`)
	name := flag.String("name", "", "pod name to report")
	flag.Parse()
	if len(addrs) == 0 {
		addrs = listenFlag{":8080"}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("pod", *name)

	errc := make(chan error)
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			log.Error("listen tcp", "addr", a, "err", err)
			os.Exit(1)
		}
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			log.Error("listen udp", "addr", a, "err", err)
			os.Exit(1)
		}
		log.Info("listening", "tcp", ln.Addr().String(), "udp", pc.LocalAddr().String())
		srv := &http.Server{Handler: handler(*name, log), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ln) }()
		go func() { errc <- serveUDP(pc, *name, log) }()
	}
	log.Error("serve", "err", <-errc)
	os.Exit(1)
}

func handler(name string, log *slog.Logger) http.Handler {
	var unready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("POST /readyz", func(w http.ResponseWriter, r *http.Request) {
		unready.Store(r.URL.Query().Get("ready") == "false")
		log.Info("readiness set", "ready", !unready.Load())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if unready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	})
	mux.Handle("/", identify(name, log))
	return mux
}

func identify(name string, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep := reply{Pod: name, Remote: r.RemoteAddr}
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			rep.Local = a.String()
		}
		log.Info("http", "remote", rep.Remote, "local", rep.Local, "path", r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	})
}

// serveUDP answers each datagram. Local is the bound address (the kernel does
// not tell a wildcard socket the destination without IP_PKTINFO).
func serveUDP(pc net.PacketConn, name string, log *slog.Logger) error {
	buf := make([]byte, 64<<10)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(reply{Pod: name, Remote: from.String(), Local: pc.LocalAddr().String()})
		log.Info("udp", "remote", from.String())
		if _, err := pc.WriteTo(append(b, '\n'), from); err != nil {
			log.Warn("udp reply", "remote", from.String(), "err", err)
		}
	}
}
