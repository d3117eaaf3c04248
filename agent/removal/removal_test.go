package removal

import (
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Only a DaemonSet seen deleted, and not back since, removes what the
// agent programmed; every other state keeps the node forwarding, and each
// says why.
func TestDecide(t *testing.T) {
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name    string
		st      state
		removed bool
		reason  string
	}{
		{"in place", state{connected: true, reached: true, seen: true}, false, "in place: a restart or an upgrade"},
		{"deleted, watch on", state{connected: true, reached: true, seen: true, deleted: true}, true, "was deleted"},
		// Seen deleted, then the uninstall took the agent's RBAC
		// (a new request is refused): still an uninstall.
		{"deleted, watch down since", state{reached: true, seen: true, deleted: true, lastErr: down}, true, "was deleted"},
		{"watch down, no deletion seen", state{reached: true, seen: true, lastErr: down, since: time.Unix(0, 0)}, false, "is down since"},
		{"apiserver never reached", state{lastErr: down}, false, "never answered (connection refused)"},
		{"never existed", state{connected: true, reached: true}, false, "never did"},
	} {
		v := decide(tc.st, "DaemonSet weir-system/weir-agent")
		if v.Removed != tc.removed || !strings.Contains(v.Reason, tc.reason) {
			t.Errorf("%s: %+v; want removed %v, a reason with %q", tc.name, v, tc.removed, tc.reason)
		}
	}
}

// What a list or an event shows moves the state: a deletion (an event, a
// deletion timestamp, or gone from a list after it was seen) marks it
// deleted; the DaemonSet back under its name (recreated by an upgrade
// with --force) unmarks it; gone from the first list is not a deletion.
func TestSaw(t *testing.T) {
	obj := func(uid string, deleting bool) object {
		var o object
		o.Metadata.UID = uid
		if deleting {
			ts := "2026-01-01T00:00:00Z"
			o.Metadata.DeletionTimestamp = &ts
		}
		return o
	}
	w := &Watch{cfg: Config{Namespace: "weir-system", Name: "weir-agent", Log: slog.New(slog.DiscardHandler)}}
	steps := []struct {
		do      func()
		deleted bool
	}{
		{func() { w.listed(nil) }, false}, // not there at the start
		{func() { w.saw(obj("a", false), false) }, false},
		{func() { w.saw(obj("a", true), false) }, true}, // foreground deletion
		{func() { w.saw(obj("a", false), true) }, true}, // DELETED
		{func() { w.saw(obj("b", false), false) }, false},
		{func() { w.listed([]object{obj("c", false)}) }, false},
		{func() { w.listed(nil) }, true}, // gone while the watch was down
	}
	for i, s := range steps {
		s.do()
		if w.st.deleted != s.deleted {
			t.Fatalf("step %d: deleted %v; want %v", i, w.st.deleted, s.deleted)
		}
	}
}

// On stop, a watch that is up but has not delivered a deletion yet (the
// garbage collector was quicker) is checked by one more list: gone from
// it is an uninstall; a refused list (the Role already deleted) leaves
// the decision to what the watch saw.
func TestStopListsOnceMore(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lastList  func(http.ResponseWriter)
		removed   bool
		reasonHas string
	}{
		{"gone from the list", func(rw http.ResponseWriter) { io.WriteString(rw, `{"metadata":{"resourceVersion":"9"},"items":[]}`) }, true, "was deleted"},
		{"list refused", func(rw http.ResponseWriter) { http.Error(rw, `{"code":403}`, http.StatusForbidden) }, false, "in place"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lists atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer secret" || r.URL.Query().Get("fieldSelector") != "metadata.name=weir-agent" {
					http.Error(rw, "unexpected request", http.StatusBadRequest)
					return
				}
				if r.URL.Query().Get("watch") == "true" {
					rw.WriteHeader(http.StatusOK)
					rw.(http.Flusher).Flush()
					<-r.Context().Done() // nothing delivered
					return
				}
				if lists.Add(1) == 1 {
					io.WriteString(rw, `{"metadata":{"resourceVersion":"5"},"items":[{"metadata":{"uid":"a","resourceVersion":"5"}}]}`)
					return
				}
				tc.lastList(rw)
			}))
			defer srv.Close()
			dir := t.TempDir()
			ca := filepath.Join(dir, "ca.crt")
			token := filepath.Join(dir, "token")
			if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			w, err := Start(Config{Namespace: "weir-system", Name: "weir-agent", APIServer: srv.URL, TokenFile: token, CAFile: ca})
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				w.mu.Lock()
				up := w.st.connected
				w.mu.Unlock()
				if up {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the watch never came up")
				}
			}
			v := w.Stop()
			if v.Removed != tc.removed || !strings.Contains(v.Reason, tc.reasonHas) {
				t.Errorf("Stop: %+v; want removed %v, a reason with %q", v, tc.removed, tc.reasonHas)
			}
			if again := w.Stop(); again != v {
				t.Errorf("a second Stop: %+v; want the first verdict %+v", again, v)
			}
		})
	}
}

// Start refuses what cannot work, before any request.
func TestStartRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]Config{
		"no name":        {Namespace: "weir-system", APIServer: "https://127.0.0.1:1"},
		"no CA file":     {Namespace: "weir-system", Name: "weir-agent", APIServer: "https://127.0.0.1:1", CAFile: filepath.Join(dir, "none")},
		"not in a pod":   {Namespace: "weir-system", Name: "weir-agent"},
		"no certificate": {Namespace: "weir-system", Name: "weir-agent", APIServer: "https://127.0.0.1:1", CAFile: os.DevNull},
	} {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		if _, err := Start(cfg); err == nil {
			t.Errorf("%s: started", name)
		}
	}
}
