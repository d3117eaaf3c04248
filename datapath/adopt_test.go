package datapath

import (
	"context"
	"math/rand/v2"
	"testing"

	"sigs.k8s.io/knftables"
)

// TestDigestKeptUpToDate: the digest a table carries after any series of
// changes is the one a fresh agent works out for the same state, both from
// its bookkeeping and without it (shapeOf): what a restarted agent
// compares.
func TestDigestKeptUpToDate(t *testing.T) {
	ctx := context.Background()
	fresh := func() *Datapath {
		return New(knftables.NewFake(knftables.IPv4Family, TableName), knftables.NewFake(knftables.IPv6Family, TableName), Config{})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	dp := fresh()
	state := randomState(rng)
	if err := dp.Apply(ctx, state); err != nil {
		t.Fatal(err)
	}
	changed := 0
	for step := range 60 {
		before := dp.tables[&ipv4].digest
		state = mutate(rng, state)
		if err := dp.Apply(ctx, state); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if dp.tables[&ipv4].digest != before {
			changed++
		}
		other := fresh()
		if err := other.Apply(ctx, state); err != nil {
			t.Fatalf("step %d: fresh agent: %v", step, err)
		}
		shape := other.shapeOf(state)
		for _, f := range []*family{&ipv4, &ipv6} {
			got, want := dp.tables[f].digest, other.tables[f].digest
			if got != want {
				t.Fatalf("step %d: %s digest after changes %s, a fresh agent's %s", step, f, got, want)
			}
			if shape.digests[f] != want {
				t.Fatalf("step %d: %s digest worked out without bookkeeping %s, with it %s", step, f, shape.digests[f], want)
			}
			if dp.tables[f].marker != markerOf(dp.tables[f].gen, got) {
				t.Fatalf("step %d: %s marker %s does not carry the digest %s", step, f, dp.tables[f].marker, got)
			}
		}
	}
	// A state large enough to be worked out in parts, on every core.
	big := benchState(3000)
	other := fresh()
	if got, want := other.shapeOf(big).digests[&ipv4], other.desire(big, nil).digest(&ipv4, other.cfg); got != want {
		t.Errorf("3,000 services: digest worked out in parts %s, with the bookkeeping %s", got, want)
	}
	// A walk in which the digest never moved would prove nothing.
	if changed < 30 {
		t.Errorf("the digest changed at %d of 60 steps; want most", changed)
	}
}

func TestLiveMarker(t *testing.T) {
	for _, tc := range []struct {
		chains []string
		want   marker
		ok     bool
	}{
		{[]string{"services", "generation_a_0123"}, marker{name: "generation_a_0123", gen: genA, digest: "0123"}, true},
		{[]string{"generation_b"}, marker{name: "generation_b", gen: genB}, true}, // an older agent's
		{[]string{"generation_a_01", "generation_b_02"}, marker{}, false},
		{[]string{"generation_a", "generation_a_01"}, marker{}, false},
		{[]string{"services"}, marker{}, false},
		{[]string{"generation_c_01"}, marker{}, false},
	} {
		got, ok := liveMarker(tc.chains)
		if got != tc.want || ok != tc.ok {
			t.Errorf("liveMarker(%v) = %+v, %v; want %+v, %v", tc.chains, got, ok, tc.want, tc.ok)
		}
	}
}
