package replicas

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/observed"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
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

// Bytes: etcd refuses a request past 1.5 MiB by default, and a refused
// transaction would keep every node in it from being shared. One node's
// status is cut to what fits in MaxStatusBytes (its services, sessions
// and announcements show on its own replica only, and the rest say why),
// and a transaction carries at most statusBatchBytes.
const (
	MaxStatusBytes   = 256 << 10
	statusBatchBytes = 1 << 20
)

// encodeStatus is a node's status as published, cut when too large.
func encodeStatus(replica string, st observed.Node) (value []byte, cut bool) {
	b, err := json.Marshal(published{Replica: replica, Status: wireNode(st)})
	if err != nil || len(b) <= MaxStatusBytes {
		return b, false
	}
	full := len(b)
	st.Services, st.BGPSessions, st.BGPAnnouncements = nil, nil, nil
	b, err = json.Marshal(published{Replica: replica, Status: wireNode(st),
		Cut: fmt.Sprintf("the node's report (%d bytes) is larger than replicas share (%d): its services, BGP sessions and announcements show on replica %s only", full, MaxStatusBytes, replica)})
	if err != nil {
		return nil, true
	}
	return b, true
}

func publishStatus(ctx context.Context, cfg Config, sess *concurrency.Session) {
	p := &publisher{cfg: cfg, cli: cfg.Store.Client(), lease: sess.Lease(), done: map[string]string{}, cutLogged: map[string]bool{}}
	for {
		changed := cfg.Hub.StatusChanged()
		now := p.encode()
		failed := !p.putChanged(ctx, now)
		failed = !p.deleteGone(ctx, now) || failed
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

// publisher is a replica publishing its agents' status, round after
// round; only publishStatus's goroutine uses it.
type publisher struct {
	cfg       Config
	cli       *clientv3.Client
	lease     clientv3.LeaseID
	done      map[string]string // node: the value etcd holds from this replica
	cutLogged map[string]bool   // node: its status was too large, and it was said
	lastErr   string            // the last failed transaction's, said once
}

// encode is every local node's status as published, by node.
func (p *publisher) encode() map[string]string {
	now := map[string]string{}
	for _, st := range p.cfg.Hub.LocalStatus() {
		b, cut := encodeStatus(p.cfg.Name, st)
		if b == nil {
			continue
		}
		if cut && !p.cutLogged[st.Node] {
			p.cfg.Log.Warn("a node's status is too large to share with the other replicas: they show it without its services, sessions and announcements", "node", st.Node, "limit_bytes", MaxStatusBytes)
		}
		p.cutLogged[st.Node] = cut
		now[st.Node] = string(b)
	}
	return now
}

// putChanged publishes what changed since the last round in transactions
// of statusBatch nodes and statusBatchBytes: one etcd proposal (and
// fsync) each, not one a node. It stops at the first that fails.
func (p *publisher) putChanged(ctx context.Context, now map[string]string) bool {
	var nodes []string
	var puts []clientv3.Op
	bytes := 0
	for node, v := range now {
		if p.done[node] == v {
			continue
		}
		if len(puts) > 0 && bytes+len(v) > statusBatchBytes {
			if !p.commit(ctx, nodes, puts, now) {
				return false
			}
			nodes, puts, bytes = nodes[:0], puts[:0], 0
		}
		nodes = append(nodes, node)
		puts = append(puts, clientv3.OpPut(statusPrefix(p.cfg)+node, v, clientv3.WithLease(p.lease)))
		bytes += len(v)
		if len(puts) == statusBatch {
			if !p.commit(ctx, nodes, puts, now) {
				return false
			}
			nodes, puts, bytes = nodes[:0], puts[:0], 0
		}
	}
	return p.commit(ctx, nodes, puts, now)
}

// commit is one transaction of puts, for nodes; a failure is logged once
// until a transaction succeeds or fails differently.
func (p *publisher) commit(ctx context.Context, nodes []string, puts []clientv3.Op, now map[string]string) bool {
	if len(puts) == 0 {
		return true
	}
	if _, err := p.cli.Txn(ctx).Then(puts...).Commit(); err != nil {
		if err.Error() != p.lastErr && ctx.Err() == nil {
			p.cfg.Log.Warn("publishing agents' status failed; trying again every second", "nodes", len(nodes), "error", err)
		}
		p.lastErr = err.Error()
		return false
	}
	p.lastErr = ""
	for _, node := range nodes {
		p.done[node] = now[node]
	}
	return true
}

// deleteGone withdraws what this replica published of nodes no longer
// connected to it, only where the entry is still its own: the agent may
// have published from its new replica already.
func (p *publisher) deleteGone(ctx context.Context, now map[string]string) bool {
	ok := true
	for node := range maps.Clone(p.done) {
		if _, here := now[node]; here {
			continue
		}
		key := statusPrefix(p.cfg) + node
		if _, err := p.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", p.lease)).Then(clientv3.OpDelete(key)).Commit(); err == nil {
			delete(p.done, node)
		} else {
			ok = false
		}
	}
	return ok
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
	Status  publishedNode
	// Cut says why the status lacks its largest parts; empty when whole.
	Cut string `json:",omitempty"`
}

// publishedNode is a node's status as etcd holds it: the speaker's
// sessions and announcements in their wire form, the format every
// version of the server shares with the others while replicas upgrade
// one by one.
type publishedNode struct {
	observed.Node
	BGPSessions      []*weirv1.BgpSession
	BGPAnnouncements []*weirv1.BgpAnnouncement
}

func wireNode(st observed.Node) publishedNode {
	p := publishedNode{Node: st}
	if st.BGPSessions != nil {
		p.BGPSessions = sharedSessions(nodewire.EncodeSessions(st.BGPSessions))
	}
	p.BGPAnnouncements = nodewire.EncodeAnnouncements(st.BGPAnnouncements)
	return p
}

// sharedSessions is sessions as replicas share them: the state and the
// families in words only, without the enums, so that what a replica
// publishes stays byte for byte what every version of the server reads.
func sharedSessions(sessions []*weirv1.BgpSession) []*weirv1.BgpSession {
	for _, s := range sessions {
		s.SessionState = weirv1.BgpSessionState_BGP_SESSION_STATE_UNSPECIFIED
		for _, f := range s.Families {
			f.AddressFamily = weirv1.AddressFamily_ADDRESS_FAMILY_UNSPECIFIED
		}
	}
	return sessions
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
	st := p.Status.Node
	st.BGPSessions = nodewire.DecodeSessions(p.Status.BGPSessions)
	st.BGPAnnouncements = nodewire.DecodeAnnouncements(p.Status.BGPAnnouncements)
	cfg.Hub.SetRemoteStatus(node, &st)
}
