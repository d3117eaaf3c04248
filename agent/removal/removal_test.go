package removal

import (
	"errors"
	"log/slog"
	"strings"
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
