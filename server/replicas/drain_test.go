package replicas

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// A drained node's drain reaches the other replicas as its agent reported
// it; an undrained node's status carries no drain at all, so an older
// replica reads it as before (TestSharedStatusFormatIsUnchanged).
func TestSharedStatusCarriesTheDrain(t *testing.T) {
	counted := time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)
	for _, drain := range []observed.Drain{
		{ConnectionsLeft: 12, CountedAt: counted, Deadline: counted.Add(8 * time.Second)},
		{ConnectionsLeft: 0, CountedAt: counted, Deadline: counted.Add(-time.Second), EndedAtDeadline: 12},
		{ConnectionsLeft: 3, CountedAt: counted},
		{},
	} {
		b, _ := encodeStatus("r1", observed.Node{Node: "node1", Connected: true, Drain: drain})
		var wire struct{ Status map[string]any }
		if err := json.Unmarshal(b, &wire); err != nil {
			t.Fatal(err)
		}
		if _, ok := wire.Status["Drain"]; ok != (drain != observed.Drain{}) {
			t.Errorf("drain %+v published as %s", drain, b)
		}
		hub := agentsync.New(registrytest.Open(t), agentsync.Config{})
		setRemote(Config{Name: "r2", Hub: hub}, "node1", b)
		got := hub.Status()
		if len(got) != 1 {
			t.Fatalf("the status was not read: %v", got)
		}
		if d := cmp.Diff(drain, got[0].Drain, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); d != "" {
			t.Errorf("the drain read by another replica (-published +read):\n%s", d)
		}
	}
}
