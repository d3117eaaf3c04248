// Package etcdstore keeps the server's state in an etcd cluster that every
// replica of the server shares (store.Backend).
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/weirlb/weir/server/store"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd keeps the state in an etcd cluster that every replica of the server
// shares. The registry's revisions are etcd's: a resource's version is the
// revision of the transaction that last wrote it, the same on every replica.
//
// Under the prefix:
//
//	PREFIX/r/KIND/KEY  one resource (JSON)
//	PREFIX/head        written by every commit: its mod revision is the
//	                   registry's revision, and comparing it makes a commit
//	                   conditional on the writer having seen every write
//	PREFIX/id          made with the store; names its history
//
// Other keys under the prefix (leases, elections, replicas' reports) are
// not the registry's and never move its revision.
type Etcd struct {
	client  *clientv3.Client
	prefix  string
	history string
	commits commitIDs
}

// Config says how to reach etcd.
type Config struct {
	Endpoints []string
	// Prefix is where Weir's keys live (default "/weir"): several Weir
	// control planes may share one etcd cluster under different prefixes.
	Prefix string
	TLS    *tls.Config // nil: plain text
}

// RequestTimeout bounds one etcd request: a store that does not answer
// within it is treated as away.
var RequestTimeout = 5 * time.Second

// Open connects to etcd and makes the store's identity if it has none.
func Open(ctx context.Context, cfg Config) (*Etcd, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoints")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/weir"
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	client, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints,
		TLS:       cfg.TLS,
		// A member that stops answering is left within seconds for
		// another: the client fails over between the endpoints.
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
		Context:              context.Background(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	e := &Etcd{client: client, prefix: cfg.Prefix}
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	idKey := e.prefix + "/id"
	resp, err := client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(idKey), "=", 0)).
		Then(clientv3.OpPut(idKey, store.NewHistoryID())).
		Commit()
	if err == nil {
		var got *clientv3.GetResponse
		if got, err = client.Get(ctx, idKey); err == nil && len(got.Kvs) == 1 {
			// The cluster's ID changes when a snapshot is restored into a
			// new cluster: revisions after it are of a new history.
			e.history = fmt.Sprintf("%x/%s", resp.Header.ClusterId, got.Kvs[0].Value)
		}
	}
	if err != nil || e.history == "" {
		client.Close()
		return nil, fmt.Errorf("etcd %s: reading the store's identity: %v", strings.Join(cfg.Endpoints, ","), err)
	}
	return e, nil
}

// Client is the etcd client, for what replicas share besides the registry
// (elections, reports).
func (e *Etcd) Client() *clientv3.Client { return e.client }

// Prefix is the prefix of Weir's keys.
func (e *Etcd) Prefix() string { return e.prefix }

func (e *Etcd) Close() error { return e.client.Close() }

// HistoryAt names the store (etcd's cluster ID and the store's own ID) and
// the commit that made revision rev (the ID every commit writes into the
// head). A restore from a backup, even one that keeps the cluster's ID (a
// copy of a member's data, or a snapshot restored under the same cluster
// token), goes back to older revisions and makes the later ones again with
// other commits: an agent's version then names a commit the store does not
// hold, and it is sent a whole state. A revision whose commit cannot be
// read (compacted, ahead of the store, etcd away) gets a name nothing
// matches.
func (e *Etcd) HistoryAt(rev uint64) string {
	if rev == 0 {
		return ""
	}
	id, ok := e.commits.get(rev)
	if !ok {
		// A revision another replica made is read from etcd once: the
		// sessions that send it at the same moment wait for that read
		// rather than each making its own.
		e.commits.fetch.Lock()
		if id, ok = e.commits.get(rev); !ok {
			if id, ok = e.commitAt(rev); ok {
				e.commits.put(rev, id)
			}
		}
		e.commits.fetch.Unlock()
		if !ok {
			id = "unknown-" + store.NewHistoryID()
		}
	}
	return e.history + "/" + id
}

// commitAt reads the ID of the commit that made revision rev: the head
// now, when rev is the last (compaction never takes that), else the head
// as it was at rev.
func (e *Etcd) commitAt(rev uint64) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
	defer cancel()
	for _, opts := range [][]clientv3.OpOption{nil, {clientv3.WithRev(int64(rev))}} {
		resp, err := e.client.Get(ctx, e.head(), opts...)
		if err != nil {
			continue
		}
		if len(resp.Kvs) == 1 && uint64(resp.Kvs[0].ModRevision) == rev {
			return string(resp.Kvs[0].Value), true
		}
	}
	return "", false
}

// commitIDs remembers the commit IDs of the last revisions this replica
// made or named, so that naming them again asks etcd nothing.
type commitIDs struct {
	fetch sync.Mutex // held while a missing ID is read from etcd
	mu    sync.Mutex
	byRev map[uint64]string
	order []uint64
}

const rememberedCommits = 1024

func (c *commitIDs) get(rev uint64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.byRev[rev]
	return id, ok
}

func (c *commitIDs) put(rev uint64, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byRev == nil {
		c.byRev = map[uint64]string{}
	}
	if _, ok := c.byRev[rev]; ok {
		return
	}
	if len(c.order) >= rememberedCommits {
		delete(c.byRev, c.order[0])
		c.order = c.order[1:]
	}
	c.byRev[rev] = id
	c.order = append(c.order, rev)
}

func (e *Etcd) head() string { return e.prefix + "/head" }

func (e *Etcd) resourceKey(kind, key string) string { return e.prefix + "/r/" + kind + "/" + key }

// parseKey splits PREFIX/r/KIND/KEY.
func (e *Etcd) parseKey(k []byte) (kind, key string, ok bool) {
	rest, ok := strings.CutPrefix(string(k), e.prefix+"/r/")
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, "/")
}

func (e *Etcd) Commit(base uint64, ops ...store.Op) (uint64, error) {
	return e.CommitGuarded(store.Guard{}, base, ops...)
}

// CommitGuarded is Commit, also conditional on g.
//
// A commit whose answer is lost (a member that dies, an election in etcd)
// may or may not have been made. Every commit writes its own ID into the
// head, so the first head written after base tells: the commit was made
// if it holds this ID, and can no longer be made otherwise (it was
// conditional on base). While the head is still at base the commit is
// tried again, as the same commit.
func (e *Etcd) CommitGuarded(g store.Guard, base uint64, ops ...store.Op) (uint64, error) {
	id := store.NewHistoryID()
	deadline := time.Now().Add(CommitTimeout)
	for {
		rev, err := e.commitOnce(g, base, id, ops)
		if !errors.Is(err, errUnanswered) {
			if err == nil {
				e.commits.put(rev, id)
			}
			return rev, err
		}
		rev, made, known := e.outcome(base, id)
		switch {
		case known && made:
			e.commits.put(rev, id)
			return rev, nil
		case known && rev != base:
			// Another write came first: decide again after it.
			return 0, &store.StaleError{Revision: rev}
		case time.Now().After(deadline):
			return 0, unavailable(err)
		}
	}
}

// errUnanswered: a commit sent whose outcome is not known.
var errUnanswered = errors.New("no answer")

// AttemptTimeout bounds one try of a commit, and CommitTimeout all of them.
var (
	AttemptTimeout = 2 * time.Second
	CommitTimeout  = 10 * time.Second
)

func (e *Etcd) commitOnce(g store.Guard, base uint64, id string, ops []store.Op) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), AttemptTimeout)
	defer cancel()
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(e.head()), "=", int64(base))}
	if g.Key != "" {
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(g.Key), "=", g.Rev))
	}
	writes := make([]clientv3.Op, 0, len(ops)+1)
	for _, op := range ops {
		if op.Value == nil {
			writes = append(writes, clientv3.OpDelete(e.resourceKey(op.Kind, op.Key)))
		} else {
			writes = append(writes, clientv3.OpPut(e.resourceKey(op.Kind, op.Key), string(op.Value)))
		}
	}
	writes = append(writes, clientv3.OpPut(e.head(), id))
	elses := []clientv3.Op{clientv3.OpGet(e.head())}
	if g.Key != "" {
		elses = append(elses, clientv3.OpGet(g.Key))
	}
	resp, err := e.client.Txn(ctx).If(conds...).Then(writes...).Else(elses...).Commit()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errUnanswered, err)
	}
	if resp.Succeeded {
		return uint64(resp.Header.Revision), nil
	}
	if g.Key != "" {
		if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != g.Rev {
			return 0, store.ErrNotLeader
		}
	}
	var cur int64
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
		cur = kvs[0].ModRevision
	}
	return 0, &store.StaleError{Revision: uint64(cur)}
}

// outcome finds out whether the commit id based on base was made: rev is
// the head's revision now (the commit's own when made); known is false
// when the store could not say.
func (e *Etcd) outcome(base uint64, id string) (rev uint64, made, known bool) {
	ctx, cancel := context.WithTimeout(context.Background(), AttemptTimeout)
	defer cancel()
	head, err := e.client.Get(ctx, e.head())
	if err != nil {
		return 0, false, false
	}
	if len(head.Kvs) == 0 || uint64(head.Kvs[0].ModRevision) == base {
		return base, false, true
	}
	// The first head written after base is the commit that followed it.
	return e.firstAfter(ctx, base, uint64(head.Kvs[0].ModRevision), id)
}

// firstAfter looks for the first head write after base, up to cur.
func (e *Etcd) firstAfter(ctx context.Context, base, cur uint64, id string) (uint64, bool, bool) {
	wch := e.client.Watch(ctx, e.head(), clientv3.WithRev(int64(base)+1))
	for resp := range wch {
		if resp.Err() != nil {
			return 0, false, false
		}
		for _, ev := range resp.Events {
			if uint64(ev.Kv.ModRevision) > base {
				if string(ev.Kv.Value) == id {
					return uint64(ev.Kv.ModRevision), true, true
				}
				return cur, false, true
			}
		}
	}
	return 0, false, false
}

func unavailable(err error) error { return fmt.Errorf("%w: %v", store.ErrUnavailable, err) }

// pageSize bounds one read of a Load, so that a large store is not read in
// one message (etcd's default limit is 2 MiB a request).
const pageSize = 1000

func (e *Etcd) Load(fn func(kind, key string, rev uint64, value []byte) error) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*RequestTimeout)
	defer cancel()
	head, err := e.client.Get(ctx, e.head())
	if err != nil {
		return 0, unavailable(err)
	}
	var rev uint64
	if len(head.Kvs) == 1 {
		rev = uint64(head.Kvs[0].ModRevision)
	}
	// Every page at the revision of the first read: one consistent view.
	at := head.Header.Revision
	from, end := e.prefix+"/r/", clientv3.GetPrefixRangeEnd(e.prefix+"/r/")
	for {
		page, err := e.client.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(at), clientv3.WithLimit(pageSize))
		if err != nil {
			return 0, unavailable(err)
		}
		for _, kv := range page.Kvs {
			kind, key, ok := e.parseKey(kv.Key)
			if !ok {
				continue
			}
			if err := fn(kind, key, uint64(kv.ModRevision), kv.Value); err != nil {
				return 0, err
			}
		}
		if !page.More || len(page.Kvs) == 0 {
			return rev, nil
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

func (e *Etcd) Watch(ctx context.Context, after uint64, fn func(rev uint64, ops []store.Op) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Without a leader the member's view is not current: end the watch
	// rather than wait quietly on a member cut off from the others.
	ctx = clientv3.WithRequireLeader(ctx)
	wch := e.client.Watch(ctx, e.prefix+"/r/", clientv3.WithPrefix(), clientv3.WithRev(int64(after)+1), clientv3.WithPrevKV())
	for resp := range wch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return store.ErrCompacted
		}
		if err := resp.Err(); err != nil {
			return unavailable(err)
		}
		// A transaction's events come together, one revision each run.
		var ops []store.Op
		var rev int64
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision != rev && ops != nil {
				if err := fn(uint64(rev), ops); err != nil {
					return err
				}
				ops = nil
			}
			rev = ev.Kv.ModRevision
			kind, key, ok := e.parseKey(ev.Kv.Key)
			if !ok {
				continue
			}
			op := store.Op{Kind: kind, Key: key}
			if ev.Type == clientv3.EventTypePut {
				op.Value = ev.Kv.Value
			}
			ops = append(ops, op)
		}
		if ops != nil {
			if err := fn(uint64(rev), ops); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return unavailable(errors.New("watch ended"))
}

// Head reads the revision of the registry's last write with a
// linearizable read: it fails when this replica cannot reach a member that
// has a leader. A replica that can, and holds that revision, is current.
func (e *Etcd) Head(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := e.client.Get(ctx, e.head())
	if err != nil {
		return 0, unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return uint64(resp.Kvs[0].ModRevision), nil
}
