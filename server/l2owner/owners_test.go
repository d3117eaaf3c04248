package l2owner

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/weirlb/weir/test/wait"
)

const (
	testTTL    = 600 * time.Millisecond
	testMargin = 150 * time.Millisecond
)

var vip = netip.MustParseAddr("192.0.2.80")

// leading is Owners leading on a fake clock until the test ends, having
// heard from the nodes.
func leading(t *testing.T) (*Owners, *clocktesting.FakeClock) {
	t.Helper()
	o, clk, warm := leadingCold(t)
	warm()
	return o, clk
}

// leadingCold is Owners leading that has not heard from the nodes until
// warm is called.
func leadingCold(t *testing.T) (o *Owners, clk *clocktesting.FakeClock, warm func()) {
	t.Helper()
	clk = clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	o = NewOwners(clk, testTTL, testMargin, slog.New(slog.DiscardHandler), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done, heard := make(chan struct{}), make(chan struct{})
	go func() { o.Lead(ctx, heard); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wait.Until(t, 5*time.Second, "leading", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.table != nil && clk.HasWaiters()
	})
	return o, clk, func() {
		close(heard)
		wait.Until(t, 5*time.Second, "warm", func() bool {
			o.mu.Lock()
			defer o.mu.Unlock()
			return o.warm
		})
	}
}

func open(t *testing.T, o *Owners, node string) *Stream {
	t.Helper()
	s, err := o.Open(node, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// step moves the fake clock and lets the timer loop look.
func step(o *Owners, clk *clocktesting.FakeClock, d time.Duration) {
	clk.Step(d)
	o.poke()
}

func nudged(t *testing.T, s *Stream) bool {
	t.Helper()
	select {
	case <-s.Nudged():
		return true
	case <-time.After(2 * time.Second):
		return false
	}
}

func drain(s *Stream) {
	select {
	case <-s.Nudged():
	default:
	}
}

func holds(grants []Grant, a netip.Addr) (uint64, bool) {
	for _, g := range grants {
		if g.Addr == a {
			return g.Epoch, true
		}
	}
	return 0, false
}

// A server that starts (or a new leader) grants nothing before a lease an
// earlier one gave may have ended; then the chosen node gets the address
// and keeps it while it asks, and the other never gets it.
func TestTheChosenNodeIsGrantedAfterTheStartFence(t *testing.T) {
	o, clk := leading(t)
	a, b := open(t, o, "a"), open(t, o, "b")
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
	a.Ask(Asked{})
	b.Ask(Asked{})
	owner := o.ReportOn(vip).Chosen
	if owner == "" {
		t.Fatal("no owner chosen among two live candidates")
	}
	streams := map[string]*Stream{"a": a, "b": b}
	if g := streams[owner].Ask(Asked{}); len(g) != 0 {
		t.Fatalf("granted %v before the start fence ended", g)
	}
	drain(streams[owner])
	step(o, clk, testTTL+testMargin)
	if !nudged(t, streams[owner]) {
		t.Fatal("the owner was not told to ask when the fence ended")
	}
	other := map[string]string{"a": "b", "b": "a"}[owner]
	for range 10 {
		if _, ok := holds(streams[owner].Ask(Asked{}), vip); !ok {
			t.Fatal("the chosen node was not granted, or lost the address while asking")
		}
		if g := streams[other].Ask(Asked{}); len(g) != 0 {
			t.Fatalf("the other node was granted %v", g)
		}
		step(o, clk, testTTL/4)
	}
}

// grantedOwner is a running pair of nodes past the start fence, with the
// owner holding vip.
func grantedOwner(t *testing.T) (o *Owners, clk *clocktesting.FakeClock, owner, other *Stream) {
	o, clk = leading(t)
	a, b := open(t, o, "a"), open(t, o, "b")
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
	step(o, clk, testTTL+testMargin)
	a.Ask(Asked{})
	b.Ask(Asked{})
	owner, other = a, b
	if o.ReportOn(vip).Chosen == "b" {
		owner, other = b, a
	}
	if _, ok := holds(owner.Ask(Asked{}), vip); !ok {
		t.Fatal("the owner was not granted")
	}
	drain(owner)
	drain(other)
	return o, clk, owner, other
}

// An owner whose stream ends (its agent was killed) loses the address to
// the other node only once its lease has ended, plus the margin: the
// other node is told to ask exactly then, and not granted before.
func TestADeadOwnersAddressMovesOnlyOnceItsLeaseEnded(t *testing.T) {
	o, clk, owner, other := grantedOwner(t)
	asked := clk.Now()
	owner.Close()
	if o.ReportOn(vip).Chosen != other.node {
		t.Fatalf("owner %q after the old one's stream ended; want %s", o.ReportOn(vip).Chosen, other.node)
	}
	for clk.Since(asked) < testTTL+testMargin {
		if g := other.Ask(Asked{}); len(g) != 0 {
			t.Fatalf("granted %v at %v after the old owner's last ask; its lease and the margin last %v", g, clk.Since(asked), testTTL+testMargin)
		}
		step(o, clk, 50*time.Millisecond)
	}
	if !nudged(t, other) {
		t.Fatal("the new owner was not told to ask when the lease became free")
	}
	if _, ok := holds(other.Ask(Asked{}), vip); !ok {
		t.Fatal("the new owner was not granted once the lease became free")
	}
	other.Ask(Asked{}) // a renewal is no change
	if got := testutil.ToFloat64(o.metrics.changes); got != 2 {
		t.Errorf("weir_l2_owner_changes_total %v; want 2 (the first owner, the takeover)", got)
	}
	var m dto.Metric
	if err := o.metrics.takeover.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("%d takeover durations; want 1", got)
	}
}

// An owner cut off from the server (its stream open, its asks lost) is
// treated alike: once it has not asked for a lease's life it is no longer
// chosen, and the address moves after its lease and the margin.
func TestAnOwnerThatStopsAskingLosesItsAddress(t *testing.T) {
	o, clk, owner, other := grantedOwner(t)
	asked := clk.Now()
	for clk.Since(asked) < testTTL+testMargin {
		if _, ok := holds(other.Ask(Asked{}), vip); ok {
			t.Fatalf("granted to the other node %v after the owner's last ask", clk.Since(asked))
		}
		step(o, clk, 50*time.Millisecond)
	}
	wait.Until(t, 2*time.Second, "the silent owner replaced", func() bool { return o.ReportOn(vip).Chosen == other.node })
	if _, ok := holds(other.Ask(Asked{}), vip); !ok {
		t.Fatal("the other node was not granted after the silent owner's lease ended")
	}
	// The old owner asking again is not given the address back while
	// the new one holds it.
	if g := owner.Ask(Asked{}); len(g) != 0 {
		t.Fatalf("the old owner was granted %v back", g)
	}
}

// A restarted server takes the leases the nodes report as its own: the
// holder keeps the address without a gap, and the other node is not
// given it. Before it has heard from the nodes (their candidacy unknown)
// it keeps what it is told and grants nothing new.
func TestARestartedServerKeepsTheHeldLeases(t *testing.T) {
	o, clk, warm := leadingCold(t)
	a, b := open(t, o, "a"), open(t, o, "b")
	other := netip.MustParseAddr("192.0.2.82")
	// Cold, a node's candidacy is unknown (it rests on reports): the
	// holder's claim counts on any L2 address.
	o.SetCandidates(map[netip.Addr][]string{vip: {"b"}})
	step(o, clk, testTTL+testMargin) // past the start fence: still nothing new
	if got, ok := holds(a.Ask(Asked{Held: []Held{{vip, 5}}}), vip); !ok || got <= 5 {
		t.Fatalf("cold: the holder's lease of epoch 5 was not kept under a newer epoch (%v, epoch %d)", ok, got)
	}
	if g := b.Ask(Asked{}); len(g) != 0 {
		t.Fatalf("cold: granted %v to a node holding nothing", g)
	}
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}, other: {"b"}})
	if g := b.Ask(Asked{}); len(g) != 0 {
		t.Fatalf("cold: granted %v before the server heard from the nodes", g)
	}
	warm()
	if _, ok := holds(a.Ask(Asked{Held: []Held{{vip, 5}}}), vip); !ok {
		t.Fatal("warm: the holder lost its address")
	}
	if _, ok := holds(b.Ask(Asked{}), other); !ok {
		t.Fatal("warm: nothing new granted")
	}
}

// Right after a restart with the candidates known: the holder keeps its
// lease, the other node is not given it, and a node that is no candidate
// cannot claim an address.
func TestAWarmServerAdoptsOnlyCandidates(t *testing.T) {
	o, _ := leading(t)
	a, b := open(t, o, "a"), open(t, o, "b")
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
	b.Ask(Asked{})
	got, ok := holds(a.Ask(Asked{Held: []Held{{vip, 7}}}), vip)
	if !ok || got <= 7 {
		t.Fatalf("the holder's lease of epoch 7 was not kept under a newer epoch (granted %v, epoch %d)", ok, got)
	}
	if g := b.Ask(Asked{}); len(g) != 0 {
		t.Fatalf("the other node was granted %v", g)
	}
	// A node that is not a candidate cannot claim an address.
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}, netip.MustParseAddr("192.0.2.81"): {"a"}})
	if g := b.Ask(Asked{Held: []Held{{netip.MustParseAddr("192.0.2.81"), 9}}}); len(g) != 0 {
		t.Fatalf("a claim by a node that is no candidate was granted: %v", g)
	}
}

// Without leadership nothing is answered, and a stream ends with it.
func TestOnlyTheLeaderAnswers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	o := NewOwners(clk, testTTL, testMargin, slog.New(slog.DiscardHandler), nil)
	if _, err := o.Open("a", false); err != ErrNotLeading {
		t.Fatalf("Open before Lead: %v; want ErrNotLeading", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.Lead(ctx, nil); close(done) }()
	wait.Until(t, 5*time.Second, "leading", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.table != nil
	})
	s := open(t, o, "a")
	cancel()
	<-done
	select {
	case <-s.Done():
	default:
		t.Fatal("the stream did not end with the leadership")
	}
}

// A node that cannot answer for an address (no such interface) gives it
// up to another node, and the reason is kept for the status.
func TestARefusingNodeIsPassedOver(t *testing.T) {
	o, clk, owner, other := grantedOwner(t)
	epoch, _ := holds(owner.Ask(Asked{}), vip)
	refusal := map[netip.Addr]string{vip: `interface "eth9" does not exist`}
	if g := owner.Ask(Asked{Released: []Held{{vip, epoch}}, Refused: refusal}); len(g) != 0 {
		t.Fatalf("a refusing node was granted %v", g)
	}
	if o.ReportOn(vip).Chosen != other.node {
		t.Fatalf("owner %q; want %s", o.ReportOn(vip).Chosen, other.node)
	}
	if _, ok := holds(other.Ask(Asked{}), vip); !ok {
		t.Fatal("the other node was not granted the released address")
	}
	if got := o.ReportOn(vip).Refused; got[owner.node] != refusal[vip] {
		t.Errorf("refusals %v; want %s's", got, owner.node)
	}
	step(o, clk, testTTL/4)
	other.Ask(Asked{})
	if g := owner.Ask(Asked{Refused: refusal}); len(g) != 0 {
		t.Fatalf("granted %v to the node still refusing", g)
	}
}

// An agent that stops may give its addresses up at once (agents before
// handovers did): another node is granted them at once, and the stopping
// node is not given them back.
func TestAStoppingNodeHandsOverAtOnce(t *testing.T) {
	o, _, owner, other := grantedOwner(t)
	epoch, _ := holds(owner.Ask(Asked{}), vip)
	if g := owner.Stop(Asked{Released: []Held{{vip, epoch}}}); len(g) != 0 {
		t.Fatalf("a node that gave everything up was granted %v", g)
	}
	if o.ReportOn(vip).Chosen != other.node {
		t.Fatalf("owner %q after a stop; want %s", o.ReportOn(vip).Chosen, other.node)
	}
	if !nudged(t, other) {
		t.Fatal("the new owner was not told to ask")
	}
	if _, ok := holds(other.Ask(Asked{}), vip); !ok {
		t.Fatal("the new owner was not granted at once")
	}
	if g := owner.Ask(Asked{}); len(g) != 0 {
		t.Fatalf("the stopping node was granted %v", g)
	}
}

// A lease given up in an ask is not granted back in its answer.
func TestAReleaseIsNotUndoneByItsOwnAnswer(t *testing.T) {
	_, _, owner, _ := grantedOwner(t)
	epoch, _ := holds(owner.Ask(Asked{}), vip)
	if g := owner.Ask(Asked{Released: []Held{{vip, epoch}}}); len(g) != 0 {
		t.Fatalf("granted %v in the answer to its release", g)
	}
}

// A lease that lapsed while no server answered (a long outage, a leader
// change) is given back to its node by the next server, once no lease of
// an earlier server can still run: the address does not move. Before
// then it is not, since another node may still hold a running lease.
func TestALapsedLeaseIsGivenBackAfterTheStartFence(t *testing.T) {
	o, clk, warm := leadingCold(t)
	a, b := open(t, o, "a"), open(t, o, "b")
	warm()
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
	b.Ask(Asked{})
	lapsed := []Held{{vip, 4}}
	if g := a.Ask(Asked{Lapsed: lapsed}); len(g) != 0 {
		t.Fatalf("granted %v on a lapsed claim within the start fence", g)
	}
	step(o, clk, testTTL+testMargin)
	got, ok := holds(a.Ask(Asked{Lapsed: lapsed}), vip)
	if !ok || got <= 4 {
		t.Fatalf("the lapsed lease of epoch 4 was not given back under a newer epoch (%v, epoch %d)", ok, got)
	}
	if g := b.Ask(Asked{Lapsed: []Held{{vip, 3}}}); len(g) != 0 {
		t.Fatalf("a second claim was granted too: %v", g)
	}
}

// The choice keeps a lapsed lease with its node from the moment it is
// claimed: when the fence ends the claimant, not another node, is told to
// ask, and another node asking first is not granted.
func TestALapsedClaimIsChosenBeforeTheFenceEnds(t *testing.T) {
	for _, claimant := range []string{"a", "b"} {
		t.Run(claimant, func(t *testing.T) {
			o, clk, warm := leadingCold(t)
			streams := map[string]*Stream{"a": open(t, o, "a"), "b": open(t, o, "b")}
			warm()
			o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
			other := map[string]string{"a": "b", "b": "a"}[claimant]
			streams[other].Ask(Asked{})
			streams[claimant].Ask(Asked{Lapsed: []Held{{vip, 4}}})
			if got := o.ReportOn(vip).Chosen; got != claimant {
				t.Fatalf("chosen %q; want the claimant %s", got, claimant)
			}
			// Both keep asking, the other node first each time.
			for range 6 {
				step(o, clk, testTTL/4)
				if g := streams[other].Ask(Asked{}); len(g) != 0 {
					t.Fatalf("the other node, asking first, was granted %v", g)
				}
				g := streams[claimant].Ask(Asked{Lapsed: []Held{{vip, 4}}})
				o.mu.Lock()
				fencing := o.table.Fencing()
				o.mu.Unlock()
				if !fencing {
					if got, ok := holds(g, vip); !ok || got <= 4 {
						t.Fatalf("the claimant's lapsed lease was not given back after the fence (%v, %d)", ok, got)
					}
					return
				}
			}
			t.Fatal("the fence did not end")
		})
	}
}

// What a node says is kept only for the L2 addresses (and, once the
// server has heard from the nodes, only those it is a candidate for):
// a node listing thousands of other addresses as held, lapsed or refused
// grows nothing the server keeps.
func TestWhatANodeClaimsIsBoundedByTheRegistry(t *testing.T) {
	o, clk, warm := leadingCold(t)
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
	a, c := open(t, o, "a"), open(t, o, "c")
	var junk []Held
	refused := map[netip.Addr]string{}
	for i := range 5000 {
		addr := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		junk = append(junk, Held{addr, uint64(i + 1)})
		refused[addr] = CannotAnswer
	}
	kept := func() (leases, lapsed, refusals int) {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, s := range o.streams {
			refusals += len(s.refused)
		}
		return len(o.table.leases), len(o.lapsed), refusals
	}
	cold := Asked{Held: junk, Lapsed: junk, Refused: refused}
	a.Ask(cold)
	step(o, clk, testTTL+testMargin) // past the start fence: lapsed claims count too
	a.Ask(cold)
	if l, lp, r := kept(); l != 0 || lp != 0 || r != 0 {
		t.Fatalf("cold: kept %d leases, %d lapsed claims, %d refusals on addresses that are not L2 addresses; want none", l, lp, r)
	}
	// Cold, the holder of an L2 address keeps it whoever it is.
	if _, ok := holds(c.Ask(Asked{Held: []Held{{vip, 9}}}), vip); !ok {
		t.Fatal("cold: a node's lease on an L2 address was not kept")
	}
	warm()
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}, netip.MustParseAddr("192.0.2.81"): {"b"}})
	// Warm, a node claims only what it is a candidate for.
	c.Ask(Asked{Lapsed: []Held{{netip.MustParseAddr("192.0.2.81"), 1 << 62}}, Refused: refused})
	if l, lp, r := kept(); l > 1 || lp != 0 || r != 0 {
		t.Fatalf("warm: kept %d leases, %d lapsed claims, %d refusals; want at most the one L2 lease, no lapsed claim of a non-candidate, no refusal of other addresses", l, lp, r)
	}
}

// handOver checks a planned move of vip from owner to other, whose
// asks go through ask (other's Ask, with what it says it can answer
// for): owner keeps the address, other is not granted it, until other
// asks listing it; then owner is told to give it up and no longer gets
// it, and other is granted it as soon as owner released it.
func handOver(t *testing.T, o *Owners, owner, other *Stream, ownerAsk func(Asked) []Grant) {
	t.Helper()
	epoch, ok := holds(ownerAsk(Asked{}), vip)
	if !ok {
		t.Fatal("the owner lost the address before the next owner could take it")
	}
	if o.ReportOn(vip).Chosen != other.node {
		t.Fatalf("chosen %q; want %s", o.ReportOn(vip).Chosen, other.node)
	}
	if !nudged(t, other) {
		t.Fatal("the next owner was not told to ask")
	}
	// An ask it sent before it was told to ask, held up on the way (TCP
	// retransmitting after a partition), proves nothing of its stream.
	if g := other.Ask(Asked{HasAnswerable: true, Answerable: []netip.Addr{vip}, Nudged: other.NudgeNumber() - 1}); len(g) != 0 {
		t.Fatalf("the next owner was granted %v on a stale ask", g)
	}
	if _, ok := holds(ownerAsk(Asked{}), vip); !ok {
		t.Fatal("the owner lost the address on an ask of the next owner that did not answer its request to ask")
	}
	// It asks, but says it cannot answer for vip yet (its state lags).
	if g := other.Ask(Asked{HasAnswerable: true, Nudged: other.NudgeNumber()}); len(g) != 0 {
		t.Fatalf("the next owner was granted %v while the owner holds the address", g)
	}
	if _, ok := holds(ownerAsk(Asked{}), vip); !ok {
		t.Fatal("the owner lost the address while the next owner could not take it")
	}
	drain(owner)
	// It can answer now, and answers the requests to ask it is sent
	// (becoming able is a change, which may send one more).
	told := false
	for range 3 {
		if g := other.Ask(Asked{HasAnswerable: true, Answerable: []netip.Addr{vip}, Nudged: other.NudgeNumber()}); len(g) != 0 {
			t.Fatalf("the next owner was granted %v before the owner gave the address up", g)
		}
		select {
		case <-owner.Nudged():
			told = true
		default:
		}
		if told {
			break
		}
	}
	if !told {
		t.Fatal("the owner was not told to give the address up once the next one could take it")
	}
	if _, ok := holds(ownerAsk(Asked{}), vip); ok {
		t.Fatal("the owner still holds the address once the next one can take it")
	}
	drain(other)
	ownerAsk(Asked{Released: []Held{{vip, epoch}}})
	if !nudged(t, other) {
		t.Fatal("the next owner was not told to ask once the address was given up")
	}
	if _, ok := holds(other.Ask(Asked{}), vip); !ok {
		t.Fatal("the next owner was not granted the address given up")
	}
	if _, ok := holds(ownerAsk(Asked{}), vip); ok {
		t.Fatal("the old owner got the address back")
	}
}

// A stopping agent keeps answering until the next owner can take over:
// the address is never left to a node that cannot answer yet.
func TestAStoppingNodeAnswersUntilTheNextCanTakeOver(t *testing.T) {
	o, _, owner, other := grantedOwner(t)
	epoch, _ := holds(owner.Ask(Asked{}), vip)
	if _, ok := holds(owner.Stop(Asked{Held: []Held{{vip, epoch}}}), vip); !ok {
		t.Fatal("a stopping node holding its address was not answered with it")
	}
	handOver(t, o, owner, other, owner.Stop)
}

// A drained owner (no candidate any more, still answering) hands over
// the same way.
func TestADrainedOwnerHandsOver(t *testing.T) {
	o, _, owner, other := grantedOwner(t)
	o.SetCandidates(map[netip.Addr][]string{vip: {other.node}})
	handOver(t, o, owner, other, owner.Ask)
}

// A next owner that never says what it can answer for (an older agent)
// is ready once it asks.
func TestAHandoverToAnOlderAgent(t *testing.T) {
	o, _, owner, other := grantedOwner(t)
	o.SetCandidates(map[netip.Addr][]string{vip: {other.node}})
	if !nudged(t, other) {
		t.Fatal("the next owner was not told to ask")
	}
	if _, ok := holds(owner.Ask(Asked{}), vip); !ok {
		t.Fatal("the owner lost the address before the next owner asked")
	}
	drain(owner)
	other.Ask(Asked{})
	if !nudged(t, owner) {
		t.Fatal("the owner was not told to give the address up")
	}
	if _, ok := holds(owner.Ask(Asked{}), vip); ok {
		t.Fatal("the owner still holds the address once the next one asked")
	}
}

// A handover whose holder dies meanwhile ends as a failover: the next
// owner is granted once the holder's lease ended, plus the margin.
func TestAHandoverWhoseHolderDies(t *testing.T) {
	o, clk, owner, other := grantedOwner(t)
	o.SetCandidates(map[netip.Addr][]string{vip: {other.node}})
	owner.Close()
	step(o, clk, testTTL+testMargin)
	if _, ok := holds(other.Ask(Asked{HasAnswerable: true, Answerable: []netip.Addr{vip}}), vip); !ok {
		t.Fatal("the next owner was not granted once the dead holder's lease ended")
	}
}

// A node is chosen only for what it says it can answer for (its applied
// state serves it): a new address waits for a node that has programmed
// it, and goes to the first that has.
func TestANodeIsChosenOnlyForWhatItCanAnswerFor(t *testing.T) {
	o, clk := leading(t)
	a, b := open(t, o, "a"), open(t, o, "b")
	step(o, clk, testTTL+testMargin)
	a.Ask(Asked{HasAnswerable: true})
	b.Ask(Asked{HasAnswerable: true})
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b"}})
	if c := o.ReportOn(vip).Chosen; c != "" {
		t.Fatalf("%s chosen though no node can answer for the address yet", c)
	}
	if g := a.Ask(Asked{}); len(g) != 0 {
		t.Fatalf("granted %v to a node that cannot answer for the address", g)
	}
	able := Asked{HasAnswerable: true, Answerable: []netip.Addr{vip}}
	if _, ok := holds(b.Ask(able), vip); !ok {
		t.Fatal("b, the only node that can answer, was not granted")
	}
	if g := a.Ask(able); len(g) != 0 {
		t.Fatalf("a was granted %v once it could answer too", g)
	}
	if c := o.ReportOn(vip).Chosen; c != "b" {
		t.Fatalf("the address moved to %s when another node became able to answer; owners stay put", c)
	}
}

// A handover in progress keeps its target when another node becomes live
// meanwhile (its stream back after a partition), even one the ranking
// prefers: the address moves once, not twice.
func TestAHandoverKeepsItsTargetWhenAnotherNodeComesBack(t *testing.T) {
	o, clk := leading(t)
	nodes := map[string]*Stream{}
	for _, n := range []string{"a", "b", "c"} {
		nodes[n] = open(t, o, n)
	}
	step(o, clk, testTTL+testMargin)
	for _, s := range nodes {
		s.Ask(Asked{})
	}
	o.SetCandidates(map[netip.Addr][]string{vip: {"a", "b", "c"}})
	owner := nodes[o.ReportOn(vip).Chosen]
	if _, ok := holds(owner.Ask(Asked{}), vip); !ok {
		t.Fatal("the owner was not granted")
	}
	// One of the others goes quiet (its stream stalls), the owner stops:
	// the last one is chosen.
	var quiet, next *Stream
	for _, s := range nodes {
		if s == owner {
			continue
		}
		if quiet == nil {
			quiet = s
		} else {
			next = s
		}
	}
	step(o, clk, testTTL/2)
	owner.Ask(Asked{})
	next.Ask(Asked{})
	step(o, clk, testTTL/2+time.Millisecond)
	owner.Ask(Asked{})
	next.Ask(Asked{})
	owner.Stop(Asked{})
	if c := o.ReportOn(vip).Chosen; c != next.node {
		t.Fatalf("chosen %q while %s is quiet and %s stops; want %s", c, quiet.node, owner.node, next.node)
	}
	// The quiet node asks again: the handover keeps its target.
	quiet.Ask(Asked{})
	if c := o.ReportOn(vip).Chosen; c != next.node {
		t.Fatalf("the handover to %s turned to %s when %s came back", next.node, c, quiet.node)
	}
}

// What a node says it can answer for grows the server's memory only by
// the registry's L2 addresses and MaxUnknownAnswerable others, however
// many it lists; an address the server learns of after the node listed
// it still counts.
func TestWhatANodeCanAnswerForIsBounded(t *testing.T) {
	o, clk := leading(t)
	a := open(t, o, "a")
	step(o, clk, testTTL+testMargin)
	list := append([]netip.Addr{vip}, addrsOf(10*MaxUnknownAnswerable)...)
	a.Ask(Asked{HasAnswerable: true, Answerable: list})
	o.mu.Lock()
	kept := len(a.answerable)
	o.mu.Unlock()
	if kept > MaxUnknownAnswerable {
		t.Fatalf("kept %d addresses of %d listed; want at most %d", kept, len(list), MaxUnknownAnswerable)
	}
	o.SetCandidates(map[netip.Addr][]string{vip: {"a"}})
	if _, ok := holds(a.Ask(Asked{Nudged: a.NudgeNumber()}), vip); !ok {
		t.Fatal("an address listed before the server knew it was not granted once it did")
	}
}

// TestTheChoiceOverSetsFollowsEveryStream: the choice works on sets of
// nodes that follow the candidates, the streams and what each says it
// can answer for as they change. Over random changes (candidates given
// again, nodes new to them, streams opened, replaced, closed and
// stopping, asks that list or refuse addresses, time passing so that
// nodes stop being live), it chooses at every step exactly what the rule
// over lists of names chooses from the same state.
func TestTheChoiceOverSetsFollowsEveryStream(t *testing.T) {
	o, clk := leading(t)
	r := rand.New(rand.NewPCG(50, 4))
	pool := names(90)
	as := addrs(40)
	subset := func(from []netip.Addr) []netip.Addr {
		var out []netip.Addr
		for _, a := range from {
			if r.IntN(3) > 0 {
				out = append(out, a)
			}
		}
		return out
	}
	streams := map[string]*Stream{}
	step(o, clk, testTTL+testMargin)
	for i := range 3000 {
		switch r.IntN(8) {
		case 0:
			if r.IntN(4) == 0 {
				pool = append(pool, fmt.Sprintf("late%03d", i)) // new to the index
			}
			c := map[netip.Addr][]string{}
			for _, a := range as {
				switch r.IntN(4) {
				case 0:
					c[a] = slices.Sorted(slices.Values(pool))
				case 1:
					var cs []string
					for _, n := range pool {
						if r.IntN(3) == 0 {
							cs = append(cs, n)
						}
					}
					slices.Sort(cs)
					c[a] = cs
				case 2:
					c[a] = nil
				}
			}
			o.SetCandidates(c)
		case 1:
			n := pool[r.IntN(len(pool))]
			streams[n] = open(t, o, n)
		case 2, 3, 4:
			for _, s := range streams {
				if r.IntN(3) == 0 {
					continue
				}
				q := Asked{}
				if r.IntN(4) > 0 {
					q.HasAnswerable, q.Answerable = true, append(subset(as), netip.MustParseAddr("203.0.113.9"))
				}
				if r.IntN(4) == 0 {
					q.Refused = map[netip.Addr]string{as[r.IntN(len(as))]: CannotAnswer}
				}
				s.Ask(q)
			}
		case 5:
			for n, s := range streams {
				if r.IntN(2) == 0 {
					s.Close()
				} else {
					s.Stop(Asked{})
				}
				delete(streams, n)
				break
			}
		case 6:
			clk.Step(time.Duration(r.IntN(int(testTTL))))
		case 7:
			o.poke()
		}
		o.mu.Lock()
		got, want := o.chooseLocked(), referenceChooseLocked(o)
		o.mu.Unlock()
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: the choice over sets is\n%v\nthe rule over lists\n%v", i, got, want)
		}
	}
}

// referenceChooseLocked is Owners' choice as it was written over lists of
// names, one (address, node) pair at a time.
func referenceChooseLocked(o *Owners) map[netip.Addr]string {
	live := map[netip.Addr][]string{}
	current := maps.Clone(o.owner)
	liveNodes := map[string]*Stream{}
	for n, s := range o.streams {
		if o.liveLocked(s) {
			liveNodes[n] = s
		}
	}
	out := func(a netip.Addr, n string) bool {
		s := liveNodes[n]
		if s == nil {
			return true
		}
		_, refused := s.refusedOf(a)
		return refused || !s.canAnswer(a)
	}
	for a, cs := range o.candidates {
		live[a] = slices.DeleteFunc(slices.Clone(cs), func(n string) bool { return out(a, n) })
		if l, ok := o.table.Holder(a); ok && slices.Contains(live[a], l.Node) {
			current[a] = l.Node
		} else if c, ok := o.lapsed[a]; ok && slices.Contains(live[a], c.node) {
			current[a] = c.node
		}
	}
	return assignReference(live, current)
}
