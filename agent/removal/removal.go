// Package removal tells an agent that runs as a DaemonSet's pod whether it
// is stopping because Weir is being uninstalled, or only restarted.
//
// `helm uninstall` and `kubectl delete -k` delete the agents' DaemonSet,
// then the garbage collector deletes its pods; an upgrade, a deleted pod or
// a drained node leave the DaemonSet in place. So the agent watches its own
// DaemonSet from the start, and when it stops, Stop says whether the
// DaemonSet was deleted: only then does the agent remove what it programmed
// on the node. The watch must be established before the uninstall: the
// uninstall deletes the agent's RBAC objects at the same time as the
// DaemonSet, and an established watch keeps delivering where a new request
// would be refused. Whatever the watch could not see keeps the node
// forwarding.
//
// It speaks the Kubernetes watch protocol over HTTP itself, with the pod's
// service-account token, so that the agent does not carry client-go.
package removal

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// In-cluster defaults, as Kubernetes mounts them in a pod.
const (
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// Config says which DaemonSet to watch and how to reach the apiserver.
type Config struct {
	// Namespace and Name are the agent's own DaemonSet.
	Namespace, Name string
	// APIServer is the apiserver's URL (https://HOST:PORT); empty: the
	// in-cluster address (KUBERNETES_SERVICE_HOST and _PORT).
	APIServer string
	// TokenFile holds the bearer token, read again for every request (the
	// kubelet renews it); CAFile the CA the apiserver's certificate is
	// checked against.
	TokenFile, CAFile string
	Log               *slog.Logger
}

// Verdict is what the agent does with what it programmed when it stops.
type Verdict struct {
	// Removed: the DaemonSet was deleted; remove everything.
	Removed bool
	// Reason says why, for the log.
	Reason string
}

// Watch follows the DaemonSet until Stop.
type Watch struct {
	cfg    Config
	client *http.Client
	base   string // the DaemonSets' URL in the namespace
	cancel context.CancelFunc
	done   chan struct{}

	stopOnce sync.Once
	verdict  Verdict

	mu sync.Mutex // guards st
	st state
}

// state is what the watch has seen so far.
type state struct {
	connected bool      // a watch is established now
	reached   bool      // the apiserver answered at least once
	seen      bool      // the DaemonSet existed at some point
	deleted   bool      // the DaemonSet last seen was being deleted, or is gone
	uid       string    // the DaemonSet last seen
	lastErr   error     // why the watch is down
	since     time.Time // when the watch went down
}

// decide is the one rule: the DaemonSet the agent saw was deleted (and
// none of its name came back, as `helm upgrade --force` recreates it), as
// the watch last saw it. Anything unknown keeps the node forwarding.
func decide(st state, what string) Verdict {
	switch {
	case st.deleted:
		return Verdict{Removed: true, Reason: what + " was deleted: Weir is being uninstalled"}
	case !st.reached:
		return Verdict{Reason: fmt.Sprintf("the apiserver never answered (%v): whether %s was deleted is not known", st.lastErr, what)}
	case !st.connected:
		return Verdict{Reason: fmt.Sprintf("the watch of %s is down since %s (%v) and saw no deletion before", what, st.since.Format(time.RFC3339), st.lastErr)}
	case !st.seen:
		return Verdict{Reason: what + " does not exist and never did: not the agent's own DaemonSet?"}
	}
	return Verdict{Reason: what + " is in place: a restart or an upgrade"}
}

// Start checks cfg and starts watching.
func Start(cfg Config) (*Watch, error) {
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("removal: the DaemonSet's namespace and name are both needed")
	}
	if cfg.APIServer == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("removal: no apiserver given and not in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)")
		}
		cfg.APIServer = "https://" + net.JoinHostPort(host, port)
	}
	if cfg.TokenFile == "" {
		cfg.TokenFile = DefaultTokenFile
	}
	if cfg.CAFile == "" {
		cfg.CAFile = DefaultCAFile
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	pemData, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("removal: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("removal: no certificate in %s", cfg.CAFile)
	}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		return nil, fmt.Errorf("removal: %w", err)
	}
	w := &Watch{
		cfg: cfg,
		// No overall timeout: a watch is a long request. Dialing and the
		// answer's headers are bounded instead.
		client: &http.Client{Transport: &http.Transport{
			TLSClientConfig:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
		}},
		base: strings.TrimSuffix(cfg.APIServer, "/") + "/apis/apps/v1/namespaces/" + url.PathEscape(cfg.Namespace) + "/daemonsets",
		done: make(chan struct{}),
	}
	w.st.since = time.Now()
	w.st.lastErr = errors.New("not tried yet")
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.run(ctx)
	return w, nil
}

// what names the DaemonSet in messages.
func (w *Watch) what() string { return "DaemonSet " + w.cfg.Namespace + "/" + w.cfg.Name }

// Stop ends the watch and says what to do; the first call decides, later
// calls return the same verdict, so that every part stopping after it
// acts on one answer.
func (w *Watch) Stop() Verdict {
	w.stopOnce.Do(func() {
		w.confirm()
		w.mu.Lock()
		w.verdict = decide(w.st, w.what())
		w.mu.Unlock()
		w.cancel()
		<-w.done
		w.client.CloseIdleConnections()
	})
	return w.verdict
}

// confirmTimeout bounds the list Stop makes.
const confirmTimeout = 2 * time.Second

// confirm lists the DaemonSet once more when the watch is up and saw no
// deletion: a deletion the watch has not delivered yet (the garbage
// collector was quicker) is then seen. A refused or failed list changes
// nothing: an uninstall may have deleted the agent's Role already, and
// only what the watch saw decides then.
func (w *Watch) confirm() {
	w.mu.Lock()
	ask := w.st.connected && !w.st.deleted
	w.mu.Unlock()
	if !ask {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), confirmTimeout)
	defer cancel()
	if _, err := w.list(ctx); err != nil {
		w.cfg.Log.Info("listing the agent's DaemonSet on stop; the watch decides", "daemonset", w.cfg.Namespace+"/"+w.cfg.Name, "error", err)
	}
}

// Retry delays after a failed list or watch.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	// watchTimeout is how long the apiserver holds one watch open; a
	// new one starts from where it ended.
	watchTimeout = 10 * time.Minute
)

// run lists and watches until ctx ends.
func (w *Watch) run(ctx context.Context) {
	defer close(w.done)
	backoff := minBackoff
	for ctx.Err() == nil {
		rv, err := w.list(ctx)
		for err == nil && ctx.Err() == nil {
			backoff = minBackoff
			rv, err = w.watch(ctx, rv)
		}
		if ctx.Err() != nil {
			return
		}
		w.down(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// down records why the watch ended.
func (w *Watch) down(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.st.connected {
		w.st.since = time.Now()
	}
	w.st.connected, w.st.lastErr = false, err
	w.cfg.Log.Warn("watching the agent's DaemonSet", "daemonset", w.cfg.Namespace+"/"+w.cfg.Name, "error", err)
}

// object is what the watch reads of a DaemonSet.
type object struct {
	Metadata struct {
		UID               string  `json:"uid"`
		ResourceVersion   string  `json:"resourceVersion"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
	} `json:"metadata"`
}

// errGone is the apiserver's 410: the watch's resource version is too
// old; list again.
var errGone = errors.New("resource version too old")

// get makes an authenticated GET of the DaemonSet's name in the namespace.
func (w *Watch) get(ctx context.Context, extra url.Values) (*http.Response, error) {
	token, err := os.ReadFile(w.cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	q := url.Values{"fieldSelector": {"metadata.name=" + w.cfg.Name}}
	for k, v := range extra {
		q[k] = v
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.base+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return resp, nil
}

// list reads the DaemonSet as it is now and returns the resource version
// to watch from.
func (w *Watch) list(ctx context.Context) (string, error) {
	resp, err := w.get(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("listing: %w", err)
	}
	defer resp.Body.Close()
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []object `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return "", fmt.Errorf("listing: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.st.reached = true
	w.listed(l.Items)
	return l.Metadata.ResourceVersion, nil
}

// listed records what a list found. Called with mu held.
func (w *Watch) listed(items []object) {
	if len(items) > 0 {
		w.saw(items[0], false)
		return
	}
	if w.st.seen {
		// Gone while the watch was down.
		w.saw(object{}, true)
		return
	}
	w.cfg.Log.Warn("the agent's DaemonSet does not exist: the agent will keep its tables when it stops", "daemonset", w.cfg.Namespace+"/"+w.cfg.Name)
}

// saw records the DaemonSet as an event or a list showed it. Called with
// mu held.
func (w *Watch) saw(o object, deleted bool) {
	deleted = deleted || o.Metadata.DeletionTimestamp != nil
	if deleted && !w.st.deleted {
		w.cfg.Log.Info("the agent's DaemonSet is deleted: the agent removes what it programmed when it stops", "daemonset", w.cfg.Namespace+"/"+w.cfg.Name)
	}
	if !deleted && w.st.deleted {
		w.cfg.Log.Info("the agent's DaemonSet is back", "daemonset", w.cfg.Namespace+"/"+w.cfg.Name, "uid", o.Metadata.UID)
	}
	w.st.seen, w.st.deleted, w.st.uid = true, deleted, o.Metadata.UID
}

// watch follows the DaemonSet from resource version rv until the
// apiserver ends the watch, and returns the version to go on from.
func (w *Watch) watch(ctx context.Context, rv string) (string, error) {
	resp, err := w.get(ctx, url.Values{
		"watch":               {"true"},
		"resourceVersion":     {rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {fmt.Sprint(int(watchTimeout.Seconds()))},
	})
	if err != nil {
		return rv, fmt.Errorf("watching: %w", err)
	}
	defer resp.Body.Close()
	w.mu.Lock()
	if !w.st.connected {
		w.cfg.Log.Info("watching the agent's DaemonSet: Weir's removal will be seen", "daemonset", w.cfg.Namespace+"/"+w.cfg.Name)
	}
	w.st.connected, w.st.reached = true, true
	w.mu.Unlock()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return rv, nil // the apiserver's timeout: watch again
			}
			return rv, fmt.Errorf("watching: %w", err)
		}
		if ev.Type == "ERROR" {
			var st struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(ev.Object, &st)
			if st.Code == http.StatusGone {
				return rv, errGone
			}
			return rv, fmt.Errorf("watching: %d %s", st.Code, st.Message)
		}
		var o object
		if err := json.Unmarshal(ev.Object, &o); err != nil {
			return rv, fmt.Errorf("watching: %s event: %w", ev.Type, err)
		}
		if o.Metadata.ResourceVersion != "" {
			rv = o.Metadata.ResourceVersion
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			w.mu.Lock()
			w.saw(o, ev.Type == "DELETED")
			w.mu.Unlock()
		}
	}
}
