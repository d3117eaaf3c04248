package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// failingNFT fails the transactions fail picks, by their place in the
// order they come (from 1).
type failingNFT struct {
	*knftables.Fake
	runs atomic.Int32
	fail func(run int32) bool
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail(f.runs.Add(1)) {
		return errors.New("injected failure")
	}
	return f.Fake.Run(ctx, tx)
}

// TestAFailedStreamFallsBackToARebuild: a full sync loads elements while
// the state is still being worked out. When the switch's first
// transaction or a batch of elements fails, the rest of the state must
// neither wait on a loader that gave up nor be lost: the family's table
// is rebuilt whole, and forwards the state.
func TestAFailedStreamFallsBackToARebuild(t *testing.T) {
	ctx := context.Background()
	// Many more batches than the channel holds.
	state := nodeState(webService(ep("10.244.1.11", true)))
	for i := range 400 {
		s := &Service{
			Key:        ServiceKey{"bulk", fmt.Sprintf("svc%d", i)},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})},
			Ports: []ServicePort{{Name: "p", Protocol: TCP, Port: 80, Endpoints: []Endpoint{
				{Addr: netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)}), Port: 8080, Ready: true, Serving: true},
				{Addr: netip.AddrFrom4([4]byte{10, 246, byte(i >> 8), byte(i)}), Port: 8080, Ready: true, Serving: true},
			}}},
		}
		state.Services[s.Key] = s
	}
	for _, tc := range []struct {
		name string
		fail func(run int32) bool
	}{
		{"the first transaction", func(run int32) bool { return run == 1 }},
		{"the first batch of elements", func(run int32) bool { return run == 2 }},
		{"a later batch", func(run int32) bool { return run == 6 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v4 := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, TableName), fail: tc.fail}
			dp := New(v4, nil, Config{})
			dp.chunk = 100
			done := make(chan error, 1)
			go func() { done <- dp.Apply(ctx, state) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the sync failed; want a rebuild: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the full sync is stuck")
			}
			for dst, want := range map[string][]string{
				"10.96.0.10:80": {"10.244.1.11:8080"},
				"10.97.1.9:80":  {"10.245.1.9:8080", "10.246.1.9:8080"},
			} {
				if got := trace(t, v4.Fake, podSource, "tcp", netip.MustParseAddrPort(dst)); !cmp.Equal(verdict{Endpoints: want}, got) {
					t.Errorf("%s: got %+v, want %v", dst, got, want)
				}
			}
		})
	}
}
