package datapath

import (
	"fmt"
	"net/netip"
	"testing"
)

func endpointAddrs(n int) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for i := range out {
		out[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(1 + i%250)}), 8080)
	}
	return out
}

// TestFlowTablesShareEvenly: every endpoint holds ⌊m/n⌋ or ⌈m/n⌉ slots
// of a table, at every size a table takes.
func TestFlowTablesShareEvenly(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7, 15, 16, 100, 1000, 5000} {
		m := flowTableSize(n)
		held := make([]int, n)
		for _, e := range flowTable(endpointAddrs(n), m) {
			held[e]++
		}
		for i, h := range held {
			if h != m/n && h != m/n+1 {
				t.Fatalf("n=%d, m=%d: endpoint %d holds %d slots; want %d or %d", n, m, i, h, m/n, m/n+1)
			}
		}
		if m < flowTableSlotsPerEndpoint*n {
			t.Errorf("n=%d: %d slots, under %d per endpoint", n, m, flowTableSlotsPerEndpoint)
		}
	}
}

// TestFlowTablesMoveLittle: an endpoint added moves a few times the share
// it takes (Maglev trades that for its even shares), where a modulus over
// the endpoints would move most flows; the flows it moves are the slots
// that change.
func TestFlowTablesMoveLittle(t *testing.T) {
	for _, n := range []int{1, 3, 4, 10, 40, 100} {
		eps := endpointAddrs(n + 1)
		m := flowTableSize(n + 1)
		if flowTableSize(n) != m {
			continue // a size change moves everything: only when n doubles
		}
		before, after := flowTable(eps[:n], m), flowTable(eps, m)
		moved := 0
		for s := range m {
			if eps[before[s]] != eps[after[s]] {
				moved++
			}
		}
		share := float64(m) / float64(n+1)
		t.Logf("n=%d -> %d, %d slots: %d moved, the new endpoint's share %.1f", n, n+1, m, moved, share)
		// Maglev moves a few times the least it could; a modulus over the
		// endpoints would move n/(n+1) of the flows.
		if float64(moved) > 5*share+2 {
			t.Errorf("%d endpoints to %d: %d of %d slots moved; want a few times the new one's share, %.0f, at most", n, n+1, moved, m, share)
		}
	}
}

// TestFlowTablesAreFixed: a table is a function of its endpoints' addresses
// and ports alone, the same in every release: changed, it would send the
// flows a router moves during an upgrade to other endpoints.
func TestFlowTablesAreFixed(t *testing.T) {
	got := fmt.Sprint(flowTable(endpointAddrs(3), 251)[:12])
	if want := "[1 0 0 1 1 1 2 1 1 2 0 0]"; got != want {
		t.Errorf("the table of 10.244.0.1-3:8080 begins %s; want %s", got, want)
	}
}
