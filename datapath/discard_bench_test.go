package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// discardNFT renders transactions as nft would receive them and drops them:
// what a sync costs on the Go side, without the kernel.
type discardNFT struct{ *knftables.Fake }

func (d discardNFT) Run(_ context.Context, tx *knftables.Transaction) error {
	_ = tx.String()
	return nil
}

func (d discardNFT) List(context.Context, string) ([]string, error) { return nil, nil }

func benchState(n int) NodeState {
	st := NodeState{Node: NodeInfo{Name: "bench", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, Registered: true},
		Services: map[ServiceKey]*Service{}}
	for i := range n {
		svc := &Service{
			Key:        ServiceKey{"bench", fmt.Sprintf("svc-%d", i)},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})},
			Ports:      []ServicePort{{Name: "http", Protocol: TCP, Port: 80}},
		}
		if i%100 == 0 {
			svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, byte(113 + i>>16), byte(i >> 8)})}
			svc.Ports[0].NodePort = uint16(30000 + i/100)
		}
		for j := range 10 {
			svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, Endpoint{
				Addr: netip.AddrFrom4([4]byte{10, byte(128 + j), byte(i >> 8), byte(i)}), Port: 8080, Ready: true, Serving: true})
		}
		st.Services[svc.Key] = svc
	}
	return st
}

// BenchmarkFullSyncGoSide10k is the Go side of a full sync of 10,000
// services: computing, rendering, bookkeeping.
//
//	go test ./datapath -run '^$' -bench FullSyncGoSide -benchmem
func BenchmarkFullSyncGoSide10k(b *testing.B) {
	st := benchState(10000)
	for b.Loop() {
		dp := New(discardNFT{knftables.NewFake(knftables.IPv4Family, TableName)}, nil, Config{})
		if err := dp.Apply(context.Background(), st); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFullSyncEncode10k is what a full sync over the netlink socket
// costs on the Go side before the kernel: working out the elements of
// 10,000 services and laying them out as the netlink messages the kernel
// takes.
//
//	go test ./datapath -run '^$' -bench FullSyncEncode -benchmem
func BenchmarkFullSyncEncode10k(b *testing.B) {
	st := benchState(10000)
	for b.Loop() {
		dp := New(discardNFT{knftables.NewFake(knftables.IPv4Family, TableName)}, nil, Config{})
		w := dp.desire(st, nil)
		for chunk := range slices.Chunk(slices.Collect(w.elements(&ipv4)), loadBatch) {
			encodeElements(newBatch(), unix.NFT_MSG_NEWSETELEM, &ipv4, genA, chunk)
		}
	}
}
