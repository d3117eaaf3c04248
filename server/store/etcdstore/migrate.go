package etcdstore

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weirlb/weir/server/store"
)

// migrateBatch is how many resources one transaction of a migration
// writes: etcd refuses more than --max-txn-ops (128 by default) a
// transaction.
const migrateBatch = 100

// Migrate copies every resource of from into e, which must hold none yet,
// and returns how many it copied. The copy keeps no revisions: each
// resource's version becomes the revision etcd writes it at, and agents
// take a whole state from the new store, which is a new history.
func Migrate(from store.Backend, e *Etcd) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
	existing, err := e.client.Get(ctx, e.prefix+"/r/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return 0, unavailable(err)
	}
	if existing.Count > 0 {
		return 0, fmt.Errorf("etcd already holds %d resources under %s: a migration fills an empty prefix only", existing.Count, e.prefix)
	}
	var ops []store.Op
	if _, err := from.Load(func(kind, key string, _ uint64, value []byte) error {
		ops = append(ops, store.Op{Kind: kind, Key: key, Value: append([]byte(nil), value...)})
		return nil
	}); err != nil {
		return 0, err
	}
	head, err := e.Head(context.Background())
	if err != nil {
		return 0, err
	}
	for i := 0; i < len(ops); i += migrateBatch {
		if head, err = e.Commit(head, ops[i:min(i+migrateBatch, len(ops))]...); err != nil {
			// Half a copy must not look like a store: take it out, so
			// that the migration can be run again.
			ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
			_, derr := e.client.Delete(ctx, e.prefix+"/r/", clientv3.WithPrefix())
			cancel()
			if derr != nil {
				return 0, fmt.Errorf("writing to etcd: %w; removing the part written failed too (%v): remove %s/r/ before trying again", err, derr, e.prefix)
			}
			return 0, fmt.Errorf("writing to etcd: %w (nothing is left of the copy)", err)
		}
	}
	return len(ops), nil
}
