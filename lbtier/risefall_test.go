package lbtier

import "testing"

// A target's verdict follows its probes as a load balancer's does: the
// first probe decides; then rise successes in a row bring it up and fall
// failures in a row take it down, and a streak broken starts again.
func TestRiseAndFall(t *testing.T) {
	r := riseFall{rise: 2, fall: 3}
	for i, step := range []struct {
		ok          bool
		up, changed bool
	}{
		{false, false, true}, // the first decides: down, and now known
		{true, false, false}, // one success of two
		{false, false, false},
		{true, false, false},
		{true, true, true}, // two in a row: up
		{false, true, false},
		{false, true, false},
		{true, true, false}, // the streak of failures broken
		{false, true, false},
		{false, true, false},
		{false, false, true}, // three in a row: down
	} {
		changed := r.observe(step.ok, "outcome")
		if r.state.Up != step.up || changed != step.changed || !r.state.Known || r.state.Last != "outcome" {
			t.Fatalf("step %d (ok %v): up %v, changed %v, state %+v; want up %v, changed %v", i, step.ok, r.state.Up, changed, r.state, step.up, step.changed)
		}
	}
}
