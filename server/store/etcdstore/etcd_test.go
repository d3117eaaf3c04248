package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/store"

	"github.com/weirlb/weir/test/etcdcluster"
)

func openEtcd(t *testing.T, c *etcdcluster.Cluster) *Etcd {
	t.Helper()
	e, err := Open(context.Background(), Config{Endpoints: c.Endpoints(), Prefix: "/test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestEtcdWritesFollowTheLastWrite: two replicas share one store; a commit
// based on a revision that is not the last is refused as stale, naming the
// last one; each reads the other's writes back, in order, with etcd's
// revisions; both name the same history.
func TestEtcdWritesFollowTheLastWrite(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	a, b := openEtcd(t, c), openEtcd(t, c)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type seen struct {
		rev uint64
		ops []store.Op
	}
	got := make(chan seen, 10)
	go b.Watch(ctx, 0, func(rev uint64, ops []store.Op) error {
		got <- seen{rev, ops}
		return nil
	})

	r1, err := a.Commit(0, store.Op{Kind: "services", Key: "default/web", Value: []byte(`{"a":1}`)}, store.Op{Kind: "nodes", Key: "n1", Value: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if a.HistoryAt(r1) != b.HistoryAt(r1) || a.HistoryAt(r1) == "" {
		t.Fatalf("histories %q and %q: want one, not empty", a.HistoryAt(r1), b.HistoryAt(r1))
	}
	_, err = b.Commit(0, store.Op{Kind: "services", Key: "default/web", Value: []byte(`{"b":1}`)})
	var stale *store.StaleError
	if !errors.As(err, &stale) || stale.Revision != r1 {
		t.Fatalf("commit on base 0 after a write at %d: %v, want stale at %d", r1, err, r1)
	}
	r2, err := b.Commit(r1, store.Op{Kind: "services", Key: "default/web"})
	if err != nil || r2 <= r1 {
		t.Fatalf("commit on the last revision: %d, %v", r2, err)
	}
	for i, want := range []seen{
		{r1, []store.Op{{Kind: "services", Key: "default/web", Value: []byte(`{"a":1}`)}, {Kind: "nodes", Key: "n1", Value: []byte(`{}`)}}},
		{r2, []store.Op{{Kind: "services", Key: "default/web"}}},
	} {
		select {
		case s := <-got:
			if s.rev != want.rev || len(s.ops) != len(want.ops) {
				t.Fatalf("watch event %d: %+v, want %+v", i, s, want)
			}
			for j := range s.ops {
				if s.ops[j].Kind != want.ops[j].Kind || s.ops[j].Key != want.ops[j].Key || string(s.ops[j].Value) != string(want.ops[j].Value) {
					t.Errorf("watch event %d op %d: %+v, want %+v", i, j, s.ops[j], want.ops[j])
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("watch event %d never came", i)
		}
	}

	loaded := map[string]uint64{}
	rev, err := a.Load(func(kind, key string, rev uint64, value []byte) error {
		loaded[kind+"/"+key] = rev
		return nil
	})
	if err != nil || rev != r2 || len(loaded) != 1 || loaded["nodes/n1"] != r1 {
		t.Fatalf("Load: rev %d (want %d), %v (want nodes/n1 at %d), %v", rev, r2, loaded, r1, err)
	}

	// Keys of other kinds under the prefix (an election) move etcd's
	// revision, not the registry's: a commit on r2 still succeeds.
	if _, err := a.Client().Put(context.Background(), "/test/election/x", "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Commit(r2, store.Op{Kind: "nodes", Key: "n2", Value: []byte(`{}`)}); err != nil {
		t.Fatalf("commit after an unrelated key: %v", err)
	}
}

// TestEtcdGuardedWritesEndWithTheLeadership: a write guarded by an
// election key goes through while the key is the one the leader made, and
// is refused once it is gone or made again by another.
func TestEtcdGuardedWritesEndWithTheLeadership(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	e := openEtcd(t, c)
	cli := e.Client()
	ctx := context.Background()
	put, err := cli.Put(ctx, "/test/leader", "a")
	if err != nil {
		t.Fatal(err)
	}
	g := store.Guard{Key: "/test/leader", Rev: put.Header.Revision}
	rev, err := e.CommitGuarded(g, 0, store.Op{Kind: "services", Key: "x", Value: []byte("1")})
	if err != nil {
		t.Fatalf("guarded write while leading: %v", err)
	}
	cli.Delete(ctx, "/test/leader")
	if _, err := cli.Put(ctx, "/test/leader", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.CommitGuarded(g, rev, store.Op{Kind: "services", Key: "x", Value: []byte("2")}); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("guarded write after the leadership passed on: %v, want store.ErrNotLeader", err)
	}
	if resp, _ := cli.Get(ctx, "/test/r/services/x"); len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "1" {
		t.Errorf("the refused write changed the store: %v", resp.Kvs)
	}
}

// TestEtcdWatchSaysWhenHistoryIsGone: a watch from a compacted revision
// ends with store.ErrCompacted (the registry then loads again).
func TestEtcdWatchSaysWhenHistoryIsGone(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	e := openEtcd(t, c)
	var rev uint64
	for i := range 3 {
		r, err := e.Commit(rev, store.Op{Kind: "nodes", Key: "n", Value: []byte{byte('0' + i)}})
		if err != nil {
			t.Fatal(err)
		}
		rev = r
	}
	if _, err := e.Client().Compact(context.Background(), int64(rev)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Watch(ctx, 1, func(uint64, []store.Op) error { return nil }); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %v, want store.ErrCompacted", err)
	}
}

// TestEtcdCommitSurvivesTheLeaderKilled: a commit made just after etcd's
// leader is killed gets no answer from the member that forwarded it; the
// store finds out whether it was made and answers for it: made, once.
func TestEtcdCommitSurvivesTheLeaderKilled(t *testing.T) {
	c := etcdcluster.StartForTest(t, 3, nil)
	e := openEtcd(t, c)
	rev, err := e.Commit(0, store.Op{Kind: "nodes", Key: "n0", Value: []byte("0")})
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i, m := range c.Members {
		st, err := e.Client().Status(context.Background(), m.ClientURL)
		if err == nil && st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no etcd member says it leads")
	}
	c.Members[leader].Kill()
	start := time.Now()
	got, err := e.Commit(rev, store.Op{Kind: "nodes", Key: "n1", Value: []byte("1")})
	if err != nil {
		t.Fatalf("a commit after etcd's leader was killed: %v (after %v)", err, time.Since(start))
	}
	t.Logf("committed at %d, %v after the leader was killed", got, time.Since(start).Round(time.Millisecond))
	var keys []string
	if _, err := e.Load(func(kind, key string, rev uint64, value []byte) error {
		keys = append(keys, key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("stored %v, want n0 and n1", keys)
	}
	if _, err := e.Commit(got, store.Op{Kind: "nodes", Key: "n2", Value: []byte("2")}); err != nil {
		t.Errorf("the next commit, on the revision the store answered: %v", err)
	}
}

// TestMigrateCopiesAnEmbeddedStore: every resource of a bbolt store,
// more than one transaction's worth, is in etcd after a migration, and a
// second migration into the same prefix is refused.
func TestMigrateCopiesAnEmbeddedStore(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	bolt, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	var rev uint64
	for i := range 250 {
		if rev, err = bolt.Commit(rev, store.Op{Kind: "services", Key: fmt.Sprintf("default/s%d", i), Value: []byte(fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err = bolt.Commit(rev, store.Op{Kind: "drains", Key: "n1", Value: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	e := openEtcd(t, c)
	n, err := Migrate(bolt, e)
	if err != nil || n != 251 {
		t.Fatalf("Migrate: %d, %v; want 251 copied", n, err)
	}
	got := map[string]string{}
	if _, err := e.Load(func(kind, key string, _ uint64, value []byte) error {
		got[kind+"/"+key] = string(value)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 251 || got["services/default/s249"] != `{"i":249}` || got["drains/n1"] != "\x01" {
		t.Errorf("etcd holds %d resources (s249: %q, drain: %q), want 251 as in bbolt", len(got), got["services/default/s249"], got["drains/n1"])
	}
	if _, err := Migrate(bolt, e); err == nil {
		t.Error("a second migration into a prefix that holds resources was accepted")
	}
}

// TestEtcdOverTLS: with etcd serving clients over TLS and asking for a
// client certificate, the store connects with --etcd-ca-file,
// --etcd-cert-file and --etcd-key-file's files and works; without a
// client certificate it is refused at Open, with the endpoints named.
func TestEtcdOverTLS(t *testing.T) {
	dir := t.TempDir()
	if err := certs.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := certs.IssueServer(dir, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := certs.IssueClient(dir, "weir-server", certs.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	c := etcdcluster.StartForTest(t, 1, &etcdcluster.TLS{
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key")})
	tlsCfg, err := tlsconfig.Client(tlsconfig.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "weir-server.crt"), Key: filepath.Join(dir, "weir-server.key")})
	if err != nil {
		t.Fatal(err)
	}
	e, err := Open(context.Background(), Config{Endpoints: c.Endpoints(), TLS: tlsCfg})
	if err != nil {
		t.Fatalf("Open over TLS: %v", err)
	}
	defer e.Close()
	if _, err := e.Commit(0, store.Op{Kind: "nodes", Key: "n1", Value: []byte("{}")}); err != nil {
		t.Fatalf("commit over TLS: %v", err)
	}

	noCert, err := tlsconfig.Client(tlsconfig.Files{CA: filepath.Join(dir, "ca.crt")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Open(ctx, Config{Endpoints: c.Endpoints(), TLS: noCert}); err == nil || !strings.Contains(err.Error(), c.Endpoints()[0]) {
		t.Errorf("Open without a client certificate: %v, want an error naming %s", err, c.Endpoints()[0])
	}
}

// TestEtcdRestoreKeepingTheClusterIDIsAnotherHistory: a backup of a
// member's data restored in place keeps etcd's cluster ID and the store's
// ID, and goes back to older revisions. A revision made after the backup
// must not be named as it was, neither while the store is behind it nor
// once new writes have made that revision again; revisions of the backup
// keep their names, on every replica; and the last revision stays
// nameable when etcd compacts.
func TestEtcdRestoreKeepingTheClusterIDIsAnotherHistory(t *testing.T) {
	c := etcdcluster.StartForTest(t, 1, nil)
	m := c.Members[0]
	ctx := context.Background()
	commit := func(e *Etcd, base uint64, v string) uint64 {
		t.Helper()
		r, err := e.Commit(base, store.Op{Kind: "nodes", Key: "n", Value: []byte(v)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	copyDir := func(from, to string) {
		t.Helper()
		os.RemoveAll(to)
		if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
	}
	restart := func() {
		t.Helper()
		if err := m.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}

	e := openEtcd(t, c)
	r1 := commit(e, 0, "backed up")
	backedUp := e.HistoryAt(r1)
	m.Kill()
	backup := filepath.Join(t.TempDir(), "backup")
	copyDir(m.DataDir(), backup)
	restart()

	e = openEtcd(t, c)
	r3 := commit(e, commit(e, r1, "after the backup"), "what the agent applied")
	agent := e.HistoryAt(r3)
	if other := openEtcd(t, c); other.HistoryAt(r3) != agent || other.HistoryAt(r1) != backedUp {
		t.Fatalf("another replica names revisions %d and %d %q and %q; want %q and %q, as the one that wrote them",
			r3, r1, other.HistoryAt(r3), other.HistoryAt(r1), agent, backedUp)
	}

	m.Kill()
	copyDir(backup, m.DataDir())
	restart()
	e = openEtcd(t, c)
	if got := e.HistoryAt(r3); got == agent {
		t.Fatalf("after a restore to revision %d, revision %d is named %q as before it: an agent would resume from content the store lost", r1, r3, got)
	}
	if got := e.HistoryAt(r1); got != backedUp {
		t.Errorf("after a restore, the backup's revision %d is named %q, want %q as before", r1, got, backedUp)
	}
	rev := r1
	for rev < r3 {
		rev = commit(e, rev, fmt.Sprintf("after the restore %d", rev))
	}
	if got := e.HistoryAt(r3); got == agent {
		t.Fatalf("revision %d made again by other writes is named %q as before the restore", r3, got)
	}

	head := e.HistoryAt(rev)
	if _, err := e.Client().Compact(ctx, int64(rev)); err != nil {
		t.Fatal(err)
	}
	if other := openEtcd(t, c); other.HistoryAt(rev) != head {
		t.Errorf("after compaction the last revision is named %q, want %q", other.HistoryAt(rev), head)
	}
}
