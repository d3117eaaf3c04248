package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
)

// scaleState is the datapath issue's workload: n services with one TCP port
// and 10 ready endpoints each, 1 % of them also LoadBalancer, IPv4.
func scaleState(n int) NodeState {
	st := nodeState()
	for i := range n {
		svc := &Service{
			Key:        ServiceKey{"bench", fmt.Sprintf("svc-%d", i)},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: uint16(30000 + i%2768)}},
		}
		if i%100 == 0 {
			svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, byte(113 + i>>16), byte(i >> 8)})}
		}
		if svc.Ports[0].NodePort != 0 && i >= 2768 {
			svc.Ports[0].NodePort = 0 // node ports are scarce; the rest are ClusterIP
		}
		for j := range 10 {
			svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints,
				Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + j), byte(i >> 8), byte(i)}), Port: 8080, Ready: true, Serving: true})
		}
		st.Services[svc.Key] = svc
	}
	return st
}

// BenchmarkFullSync10k loads 10,000 services into a real nftables table.
//
//	go test ./datapath -run '^$' -bench FullSync -benchtime 3x
func BenchmarkFullSync10k(b *testing.B) {
	benchInNetns(b)
	st := scaleState(10000)
	ctx := context.Background()
	for b.Loop() {
		dp, err := NewForNode(Config{})
		if err != nil {
			b.Fatal(err)
		}
		if err := dp.Apply(ctx, st); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEndpointChange10k changes one endpoint of one service on a
// table holding 10,000 services: the cost of a partial sync at scale.
//
//	go test ./datapath -run '^$' -bench EndpointChange -benchtime 50x
func BenchmarkEndpointChange10k(b *testing.B) {
	benchInNetns(b)
	st := scaleState(10000)
	ctx := context.Background()
	dp, err := NewForNode(Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := dp.Apply(ctx, st); err != nil {
		b.Fatal(err)
	}
	key := ServiceKey{"bench", "svc-4242"}
	i := 0
	for b.Loop() {
		i++
		svc := *st.Services[key]
		port := svc.Ports[0]
		port.Endpoints = append([]Endpoint(nil), port.Endpoints...)
		port.Endpoints[3].Addr = netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})
		svc.Ports = []ServicePort{port}
		st.Services[key] = &svc
		if err := dp.Apply(ctx, st); err != nil {
			b.Fatal(err)
		}
	}
}

func benchInNetns(b *testing.B) {
	b.Helper()
	inNewNetnsTB(b)
}
