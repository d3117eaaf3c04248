package replicas

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/weirlb/weir/server/agentsync"
)

// Each replica publishes the status of the agents connected to it under
// PREFIX/agents/NODE, with its lease: a replica that dies takes its
// agents' entries with it, and they publish again from their new replica.

func statusPrefix(cfg Config) string { return cfg.Store.Prefix() + "/agents/" }

// PublishPeriod bounds how often a replica publishes what changed.
var PublishPeriod = 200 * time.Millisecond

// statusBatch is how many nodes' status one transaction publishes (etcd
// takes 128 operations in one by default).
const statusBatch = 100

func publishStatus(ctx context.Context, cfg Config, sess *concurrency.Session) {
	cli := cfg.Store.Client()
	done := map[string]string{}
	for {
		changed := cfg.Hub.StatusChanged()
		now, failed := map[string]string{}, false
		for _, st := range cfg.Hub.LocalStatus() {
			b, err := json.Marshal(published{Replica: cfg.Name, Status: st})
			if err != nil {
				continue
			}
			now[st.Node] = string(b)
		}
		// What changed goes in transactions of statusBatch: one etcd
		// proposal (and fsync) each, not one a node.
		var nodes []string
		var puts []clientv3.Op
		flush := func() {
			if len(puts) == 0 || failed {
				return
			}
			if _, err := cli.Txn(ctx).Then(puts...).Commit(); err != nil {
				failed = true
				return
			}
			for _, node := range nodes {
				done[node] = now[node]
			}
			nodes, puts = nodes[:0], puts[:0]
		}
		for node, v := range now {
			if done[node] != v {
				nodes = append(nodes, node)
				puts = append(puts, clientv3.OpPut(statusPrefix(cfg)+node, v, clientv3.WithLease(sess.Lease())))
				if len(puts) == statusBatch {
					flush()
				}
			}
		}
		flush()
		for node := range maps.Clone(done) {
			if _, ok := now[node]; ok {
				continue
			}
			// Only if still ours: the agent may have published from its
			// new replica already.
			key := statusPrefix(cfg) + node
			if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", sess.Lease())).Then(clientv3.OpDelete(key)).Commit(); err == nil {
				delete(done, node)
			} else {
				failed = true
			}
		}
		if failed {
			// etcd away: try again in a second, changed or not.
			sleep(ctx, time.Second)
		} else {
			select {
			case <-ctx.Done():
			case <-changed:
			}
		}
		if ctx.Err() != nil {
			return
		}
		sleep(ctx, PublishPeriod)
	}
}

// watchStatus feeds the hub the status other replicas publish.
func watchStatus(ctx context.Context, cfg Config) {
	cli := cfg.Store.Client()
	prefix := statusPrefix(cfg)
	for ctx.Err() == nil {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		seen := map[string]bool{}
		for _, kv := range resp.Kvs {
			node := strings.TrimPrefix(string(kv.Key), prefix)
			seen[node] = true
			setRemote(cfg, node, kv.Value)
		}
		for _, st := range cfg.Hub.Status() {
			if !seen[st.Node] {
				cfg.Hub.SetRemoteStatus(st.Node, nil)
			}
		}
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				node := strings.TrimPrefix(string(ev.Kv.Key), prefix)
				if ev.Type == clientv3.EventTypeDelete {
					cfg.Hub.SetRemoteStatus(node, nil)
				} else {
					setRemote(cfg, node, ev.Kv.Value)
				}
			}
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// published is one node's status as a replica publishes it.
type published struct {
	Replica string
	Status  agentsync.NodeStatus
}

func setRemote(cfg Config, node string, value []byte) {
	var p published
	if err := json.Unmarshal(value, &p); err != nil {
		return
	}
	if p.Replica == cfg.Name {
		// This replica's own, which its hub has; what another said of
		// the node before it came here is past.
		cfg.Hub.SetRemoteStatus(node, nil)
		return
	}
	cfg.Hub.SetRemoteStatus(node, &p.Status)
}
