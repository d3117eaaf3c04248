package bgpspeaker

import (
	"context"
	"iter"
	"log/slog"
	"maps"
	"net/netip"
)

// Paths is where Reconcile announces and withdraws: GoBGP, or a fake.
type Paths interface {
	Announce(ctx context.Context, prefix netip.Prefix, a Announcement) error
	Withdraw(ctx context.Context, prefix netip.Prefix, a Announcement) error
}

// Reconcile brings announced toward want through sp, by one rule for a
// node's own speaker and for the load-balancer tier: what takes traffic
// away from a next hop happens at once, what brings it more only when
// rise. At once: a path no longer wanted is withdrawn, a path wanted with
// less weight is announced with it, and a path whose next hop changed is
// replaced when rising and else withdrawn. When rise: every path new or
// changed is announced. Keys are prefixes, or prefixes with a path ID
// (ADD-PATH); prefix reads the prefix from a key.
//
// announced keeps what succeeded. changed says whether announced moved;
// failed whether a call failed (logged), for the next Reconcile to retry.
func Reconcile[K comparable](ctx context.Context, sp Paths, announced, want map[K]Announcement, prefix func(K) netip.Prefix, rise bool, log *slog.Logger) (changed, failed bool) {
	lookup := func(k K) (Announcement, bool) { w, ok := want[k]; return w, ok }
	return reconcile(ctx, sp, announced, lookup, maps.Keys(announced), maps.Keys(want), prefix, rise, log)
}

// ReconcileKeys is Reconcile for the keys in keys alone, with what is
// wanted read through want: for a caller that knows which keys may have
// changed, so that the cost follows the change, not the table.
func ReconcileKeys[K comparable](ctx context.Context, sp Paths, announced map[K]Announcement, want func(K) (Announcement, bool), keys iter.Seq[K], prefix func(K) netip.Prefix, rise bool, log *slog.Logger) (changed, failed bool) {
	return reconcile(ctx, sp, announced, want, keys, keys, prefix, rise, log)
}

// reconcile is Reconcile over the keys of announced and of want that it
// is given.
func reconcile[K comparable](ctx context.Context, sp Paths, announced map[K]Announcement, want func(K) (Announcement, bool), announcedKeys, wantedKeys iter.Seq[K], prefix func(K) netip.Prefix, rise bool, log *slog.Logger) (changed, failed bool) {
	withdraw := func(k K, had Announcement) {
		if err := sp.Withdraw(ctx, prefix(k), had); err != nil {
			log.Error("BGP withdraw failed", "prefix", prefix(k), "path_id", had.PathID, "next_hop", had.NextHop, "error", err)
			failed = true
			return
		}
		delete(announced, k)
		changed = true
		log.Debug("path withdrawn", "prefix", prefix(k), "path_id", had.PathID, "next_hop", had.NextHop)
	}
	announce := func(k K, w Announcement) {
		if err := sp.Announce(ctx, prefix(k), w); err != nil {
			log.Error("BGP announce failed", "prefix", prefix(k), "path_id", w.PathID, "next_hop", w.NextHop, "error", err)
			failed = true
			return
		}
		announced[k] = w
		changed = true
		log.Debug("path announced", "prefix", prefix(k), "path_id", w.PathID, "next_hop", w.NextHop, "weight", w.Weight)
	}
	for k := range announcedKeys {
		had, ok := announced[k]
		if !ok {
			continue
		}
		w, ok := want(k)
		switch {
		case !ok || (w.NextHop != had.NextHop && !rise):
			withdraw(k, had)
		case w.Weight < had.Weight && w.NextHop == had.NextHop:
			// Less weight now: say so at once, like a withdrawal.
			announce(k, w)
		}
	}
	if !rise {
		return changed, failed
	}
	for k := range wantedKeys {
		w, ok := want(k)
		if !ok {
			continue
		}
		if had, ok := announced[k]; ok && had.Same(w) {
			continue
		}
		announce(k, w)
	}
	return changed, failed
}
