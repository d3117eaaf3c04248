package datapath

import (
	"testing"

	"sigs.k8s.io/knftables"
)

func BenchmarkDesire10k(b *testing.B) {
	st := benchState(10000)
	for b.Loop() {
		dp := New(discardNFT{knftables.NewFake(knftables.IPv4Family, TableName)}, nil, Config{})
		dp.desire(st, nil)
	}
}
