package bgpspeaker_test

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/weirlb/weir/internal/bgpspeaker"
	"github.com/weirlb/weir/internal/bgpspeaker/bgpfake"
)

// The rule both speakers follow: less at once, more only when rising.
func TestReconcileSaysLessAtOnceAndMoreWhenRising(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	via := func(hop string, weight uint32) bgpspeaker.Announcement {
		return bgpspeaker.Announcement{NextHop: netip.MustParseAddr(hop), Weight: weight}
	}
	self := func(k netip.Prefix) netip.Prefix { return k }
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		what    string
		had     map[netip.Prefix]bgpspeaker.Announcement
		want    map[netip.Prefix]bgpspeaker.Announcement
		rise    bool
		calls   []string
		changed bool
	}{
		{"a path no longer wanted goes, rising or not",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 2)}, nil, false,
			[]string{"withdraw 203.0.113.1/32 via 192.0.2.11"}, true},
		{"less weight is said at once",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 3)},
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 1)}, false,
			[]string{"announce 203.0.113.1/32 via 192.0.2.11 weight 1"}, true},
		{"more weight and new paths wait while not rising",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 1)},
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 3), p("203.0.113.2/32"): via("192.0.2.11", 1)}, false,
			nil, false},
		{"and go out when rising",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 1)},
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 3), p("203.0.113.2/32"): via("192.0.2.11", 1)}, true,
			[]string{"announce 203.0.113.1/32 via 192.0.2.11 weight 3", "announce 203.0.113.2/32 via 192.0.2.11 weight 1"}, true},
		{"another next hop while not rising: the old one is withdrawn",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 1)},
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.21", 1)}, false,
			[]string{"withdraw 203.0.113.1/32 via 192.0.2.11"}, true},
		{"another next hop when rising: replaced, never absent",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 3)},
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.21", 1)}, true,
			[]string{"announce 203.0.113.1/32 via 192.0.2.21 weight 1"}, true},
		{"what is announced already is not said again",
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 1)},
			map[netip.Prefix]bgpspeaker.Announcement{p("203.0.113.1/32"): via("192.0.2.11", 1)}, true,
			nil, false},
	} {
		var rec bgpfake.Recorder
		for k, a := range tc.had {
			if err := rec.Announce(context.Background(), k, a); err != nil {
				t.Fatal(err)
			}
		}
		rec.Calls() // what the test set up
		announced := map[netip.Prefix]bgpspeaker.Announcement{}
		for k, a := range tc.had {
			announced[k] = a
		}
		changed, failed := bgpspeaker.Reconcile(context.Background(), &rec, announced, tc.want, self, tc.rise, log)
		calls := rec.Calls()
		slices.Sort(calls)
		if !slices.Equal(calls, tc.calls) || changed != tc.changed || failed {
			t.Errorf("%s: told %q (changed %v, failed %v); want %q (changed %v)", tc.what, calls, changed, failed, tc.calls, tc.changed)
		}
		for k, a := range announced {
			if got, ok := rec.Routes()[bgpfake.Path{Prefix: k}]; !ok || !got.Same(a) {
				t.Errorf("%s: kept %s as announced via %s; the speaker has %v", tc.what, k, a.NextHop, got.NextHop)
			}
		}
	}
}

// A refused call leaves announced as it was, for the next round.
func TestReconcileKeepsWhatFailed(t *testing.T) {
	var rec bgpfake.Recorder
	rec.Fail(true)
	k := netip.MustParsePrefix("203.0.113.1/32")
	had := bgpspeaker.Announcement{NextHop: netip.MustParseAddr("192.0.2.11")}
	announced := map[netip.Prefix]bgpspeaker.Announcement{k: had}
	changed, failed := bgpspeaker.Reconcile(context.Background(), &rec, announced, nil, func(k netip.Prefix) netip.Prefix { return k }, true, slog.New(slog.DiscardHandler))
	if changed || !failed || !announced[k].Same(had) {
		t.Fatalf("changed %v, failed %v, announced %v; want the path still counted as announced", changed, failed, announced)
	}
}
