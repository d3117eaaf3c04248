package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/weirlb/weir/datapath"
	"github.com/weirlb/weir/internal/nodewire"
	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// recordingObserver keeps a copy of every state it receives.
type recordingObserver struct{ received []datapath.NodeState }

func (o *recordingObserver) Received(st datapath.NodeState) {
	st.Services = maps.Clone(st.Services)
	o.received = append(o.received, st)
}
func (o *recordingObserver) Applied(time.Duration)      {}
func (o *recordingObserver) Report(bool) *report.Report { return nil }

// refModel is the syncer's state worked out the plain way: a copy of the
// whole state per message, the copy from before a version's first part
// kept to go back to when a part is refused.
type refModel struct {
	node     datapath.NodeInfo
	services map[datapath.ServiceKey]*datapath.Service
	// before is the state when the version being assembled began.
	beforeNode     datapath.NodeInfo
	beforeServices map[datapath.ServiceKey]*datapath.Service
	assembling     uint64
	partial        bool
	pieces         map[datapath.ServiceKey]bool
	rejected       uint64
	missing        uint64 // a version refused since the last whole state
	// named since the last apply and since the last Received; nil: a
	// whole state came since.
	sinceApply, sinceReceived map[datapath.ServiceKey]bool
}

// step folds msg in; whole says the version is complete (to be applied),
// refused that msg is refused.
func (m *refModel) step(t *testing.T, msg *weirv1.SyncResponse) (whole, refused, ignored bool) {
	t.Helper()
	if m.rejected != 0 && msg.GetVersion() == m.rejected {
		return false, false, true
	}
	if m.missing != 0 && !msg.GetFull() && (!m.partial || msg.GetVersion() != m.assembling) {
		m.rejected = msg.GetVersion()
		return false, true, false
	}
	if !m.partial || msg.GetVersion() != m.assembling {
		m.assembling, m.pieces = msg.GetVersion(), map[datapath.ServiceKey]bool{}
		m.beforeNode, m.beforeServices = m.node, maps.Clone(m.services)
	}
	next := maps.Clone(m.services)
	if msg.GetFull() {
		next = map[datapath.ServiceKey]*datapath.Service{}
	}
	node := m.node
	bad := func() (bool, bool, bool) {
		m.node, m.services = m.beforeNode, m.beforeServices
		if msg.GetMore() || m.partial {
			m.partial = true
		}
		m.rejected, m.missing = msg.GetVersion(), msg.GetVersion()
		return false, true, false
	}
	if msg.GetNode() != nil {
		n, err := nodewire.DecodeNode(msg.GetNode())
		if err != nil {
			return bad()
		}
		node = n
	}
	var named []datapath.ServiceKey
	for _, ws := range msg.GetUpserts() {
		svc, err := nodewire.DecodeService(ws, "node1")
		if err != nil {
			return bad()
		}
		if prev := next[svc.Key]; m.pieces[svc.Key] && prev != nil {
			svc = joinPieces(prev, svc)
		}
		next[svc.Key] = svc
		m.pieces[svc.Key] = true
		named = append(named, svc.Key)
	}
	for _, r := range msg.GetRemovals() {
		var key datapath.ServiceKey
		if _, err := fmt.Sscanf(r, "default/%s", &key.Name); err != nil {
			return bad()
		}
		key.Namespace = "default"
		delete(next, key)
		named = append(named, key)
	}
	m.node, m.services = node, next
	if msg.GetFull() {
		m.missing = 0
		m.sinceApply, m.sinceReceived = nil, nil
	}
	for _, key := range named {
		if m.sinceApply != nil {
			m.sinceApply[key] = true
		}
		if m.sinceReceived != nil {
			m.sinceReceived[key] = true
		}
	}
	if msg.GetMore() {
		m.partial = true
		return false, false, false
	}
	m.partial = false
	return true, false, false
}

// randomMessages is one version: a whole state or a change, in one part
// or several, one part perhaps one the agent cannot decode.
func randomMessages(rng *rand.Rand, version uint64) []*weirv1.SyncResponse {
	name := func() string { return fmt.Sprintf("s%d", rng.IntN(12)) }
	service := func() *weirv1.NodeService {
		s := svc(name(), fmt.Sprintf("10.96.0.%d", rng.IntN(4)))
		for range rng.IntN(3) {
			s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, &weirv1.NodeEndpoint{
				Address: fmt.Sprintf("10.244.0.%d", rng.IntN(250)), Port: 8080, Ready: true, NodeName: fmt.Sprintf("node%d", rng.IntN(2))})
		}
		return s
	}
	full := rng.IntN(8) == 0
	parts := 1 + rng.IntN(3)
	badPart := -1
	if rng.IntN(6) == 0 {
		badPart = rng.IntN(parts)
	}
	var out []*weirv1.SyncResponse
	for p := range parts {
		m := &weirv1.SyncResponse{Version: version, Full: full && p == 0, More: p < parts-1}
		if rng.IntN(5) == 0 {
			m.Node = &weirv1.NodeInfo{Name: "node1", Addresses: []string{fmt.Sprintf("192.0.2.%d", 1+rng.IntN(2))}}
		}
		for range rng.IntN(4) {
			m.Upserts = append(m.Upserts, service())
		}
		if !m.Full {
			for range rng.IntN(2) {
				m.Removals = append(m.Removals, "default/"+name())
			}
		}
		if p == badPart {
			switch rng.IntN(3) {
			case 0:
				m.Upserts = append(m.Upserts, svc(name(), "not-an-ip"))
			case 1:
				m.Removals = append(m.Removals, "no-slash")
			default:
				m.Node = &weirv1.NodeInfo{Name: "node1", Addresses: []string{"not-an-ip"}}
			}
		}
		out = append(out, m)
	}
	return out
}

// TestMergeMatchesCopyingTheWholeState: over random versions (whole
// states and changes, in parts, some refused, some failing to apply),
// the state the syncer applies and hands its observers is the one a copy
// of the whole state per message gives, a refused part leaves the state
// of before its version, and Changed names exactly the services the
// messages named since the last apply (or the last Received).
func TestMergeMatchesCopyingTheWholeState(t *testing.T) {
	same := cmp.Options{cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
		cmpopts.EquateEmpty()}
	// nil (every service) and empty (none) differ.
	keysOf := func(m map[datapath.ServiceKey]bool) []datapath.ServiceKey {
		if m == nil {
			return nil
		}
		return slices.AppendSeq([]datapath.ServiceKey{}, maps.Keys(m))
	}
	sameKeys := cmp.Options{cmpopts.SortSlices(func(a, b datapath.ServiceKey) bool { return a.Compare(b) < 0 })}
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 31))
		dp, obs := &fakeApplier{}, &recordingObserver{}
		s := New(Config{NodeName: "node1"}, nil, dp, obs, slog.New(slog.DiscardHandler))
		ref := &refModel{services: map[datapath.ServiceKey]*datapath.Service{}}
		for version := uint64(1); version <= 150; version++ {
			failApply := rng.IntN(10) == 0
			if failApply {
				dp.setFail(errors.New("nft: refused"))
			}
			for _, msg := range randomMessages(rng, version) {
				applies, heard := len(dp.applied), len(obs.received)
				answer := s.handle(context.Background(), msg)
				whole, refused, ignored := ref.step(t, msg)
				at := fmt.Sprintf("seed %d, version %d", seed, version)
				switch {
				case ignored:
					if answer != nil {
						t.Fatalf("%s: a part of a refused version was answered %v", at, answer)
					}
				case refused:
					if answer.GetNack() == nil {
						t.Fatalf("%s: answer %v, want NACK", at, answer)
					}
				case !whole:
					if answer != nil {
						t.Fatalf("%s: answer %v before the last part", at, answer)
					}
				default:
					if len(obs.received) != heard+1 {
						t.Fatalf("%s: observers told %d times, want once", at, len(obs.received)-heard)
					}
					got := obs.received[len(obs.received)-1]
					if diff := cmp.Diff(ref.services, got.Services, same); diff != "" {
						t.Fatalf("%s: observers received (-want +got):\n%s", at, diff)
					}
					if diff := cmp.Diff(keysOf(ref.sinceReceived), got.Changed, sameKeys); diff != "" {
						t.Fatalf("%s: observers' Changed (-want +got):\n%s", at, diff)
					}
					ref.sinceReceived = map[datapath.ServiceKey]bool{}
					if failApply {
						if answer.GetNack() == nil {
							t.Fatalf("%s: answer %v with a failing datapath, want NACK", at, answer)
						}
						continue
					}
					if answer.GetAck() == nil || len(dp.applied) != applies+1 {
						t.Fatalf("%s: answer %v, applies %d; want ACK and one apply", at, answer, len(dp.applied)-applies)
					}
					applied := dp.last()
					if diff := cmp.Diff(ref.services, applied.Services, same); diff != "" {
						t.Fatalf("%s: applied (-want +got):\n%s", at, diff)
					}
					if diff := cmp.Diff(ref.node, applied.Node, same); diff != "" {
						t.Fatalf("%s: applied node (-want +got):\n%s", at, diff)
					}
					if diff := cmp.Diff(keysOf(ref.sinceApply), applied.Changed, sameKeys); diff != "" {
						t.Fatalf("%s: applied Changed (-want +got):\n%s", at, diff)
					}
					ref.sinceApply = map[datapath.ServiceKey]bool{}
				}
			}
			dp.setFail(nil)
			// The state kept matches too, refused or not.
			s.mu.Lock()
			diff := cmp.Diff(ref.services, s.state.Services, same)
			s.mu.Unlock()
			if diff != "" {
				t.Fatalf("seed %d, version %d: state kept (-want +got):\n%s", seed, version, diff)
			}
		}
	}
}

// TestARefusedPartTakesBackTheVersion: when a later part of a version
// cannot be decoded, the parts before it leave nothing behind: the next
// version applies over the last good state.
func TestARefusedPartTakesBackTheVersion(t *testing.T) {
	dp := &fakeApplier{}
	s := New(Config{NodeName: "node1"}, nil, dp, nil, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	for _, m := range []*weirv1.SyncResponse{
		{Version: 1, Full: true, Upserts: []*weirv1.NodeService{svc("web", "10.96.0.10")}},
		{Version: 2, Upserts: []*weirv1.NodeService{svc("db", "10.96.0.20")}, Removals: []string{"default/web"}, More: true},
		{Version: 2, Upserts: []*weirv1.NodeService{svc("cache", "not-an-ip")}},
	} {
		s.handle(ctx, m)
	}
	applied := func() []string {
		var got []string
		for key, svc := range dp.last().Services {
			got = append(got, key.Name+" "+svc.ClusterIPs[0].String())
		}
		slices.Sort(got)
		return got
	}
	if got, want := applied(), []string{"web 10.96.0.10"}; !slices.Equal(got, want) {
		t.Errorf("applied %q after a refused version, want %q: the refused version's first part left behind", got, want)
	}
	// A later delta lacks version 2 and is refused; a whole state is
	// applied.
	if a := s.handle(ctx, &weirv1.SyncResponse{Version: 3, Upserts: []*weirv1.NodeService{svc("api", "10.96.0.30")}}); a.GetNack().GetVersion() != 3 {
		t.Errorf("answer to a delta after a refused version: %v, want NACK 3", a)
	}
	s.handle(ctx, &weirv1.SyncResponse{Version: 4, Full: true, Upserts: []*weirv1.NodeService{svc("api", "10.96.0.30"), svc("db", "10.96.0.20")}})
	if got, want := applied(), []string{"api 10.96.0.30", "db 10.96.0.20"}; !slices.Equal(got, want) {
		t.Errorf("applied %q after a whole state, want %q", got, want)
	}
}
