package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// udpClient is a UDP socket bound to one source port inside a namespace,
// so that every datagram belongs to the same conntrack entry.
type udpClient struct{ conn *net.UDPConn }

func newUDPClient(t *testing.T, ns *lab.Netns, port int) *udpClient {
	t.Helper()
	var conn *net.UDPConn
	if err := ns.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &udpClient{conn}
}

// ask sends one datagram to dst and returns the pod that answered, or an
// error when nothing answers within 300 ms.
func (c *udpClient) ask(dst netip.AddrPort) (string, error) {
	if _, err := c.conn.WriteToUDPAddrPort([]byte("hello"), dst); err != nil {
		return "", err
	}
	c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 512)
	n, _, err := c.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", err
	}
	var r weirlab.Reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return "", err
	}
	return r.Pod, nil
}

func udpService(name string, nodePort int32, clusterIPs ...string) *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: name},
		Spec: &weirv1.ServiceSpec{
			Type:       weirv1.ServiceType_SERVICE_TYPE_NODE_PORT,
			ClusterIps: clusterIPs,
			Ports:      []*weirv1.ServicePort{{Name: "dns", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: weirlab.PodPort, NodePort: nodePort}},
		},
	}
}

func udpSlice(service string, fam family, pods ...*lab.Pod) *weirv1.EndpointSlice {
	s := &weirv1.EndpointSlice{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: service + "-" + strings.ToLower(fam.name)}, ServiceName: service,
		Ports: []*weirv1.EndpointPort{{Name: "dns", Protocol: weirv1.Protocol_PROTOCOL_UDP, Port: weirlab.PodPort}}}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, &weirv1.Endpoint{Addresses: []string{fam.pod(p).String()}, NodeName: p.Node.Name})
	}
	return s
}

// TestUDPFlowsFollowEndpointChanges: a UDP client that keeps its source
// port is not stuck on a removed endpoint, nor on the rejection cached while
// the service had none, in either family.
func TestUDPFlowsFollowEndpointChanges(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	n1p1, n2p1 := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: udpService("dns", 30053, "10.96.0.53", "fd00:96::53")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the agents program the rejection
	for i, fam := range families("10.96.0.53", "fd00:96::53", "203.0.113.53", "2001:db8:113::53") {
		t.Run(fam.name, func(t *testing.T) {
			dst := netip.AddrPortFrom(fam.node(c.Nodes[0]), 30053)
			client := newUDPClient(t, c.Client, 40053+i)
			// No endpoints yet: the client's datagrams are refused.
			for range 3 {
				if pod, err := client.ask(dst); err == nil {
					t.Fatalf("service without endpoints answered from %s", pod)
				}
			}
			if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: udpSlice("dns", fam, n1p1)}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the same UDP flow reaches the first endpoint", func() error {
				pod, err := client.ask(dst)
				if err != nil {
					return err
				}
				if pod != n1p1.Name {
					return fmt.Errorf("answered by %s", pod)
				}
				return nil
			})
			// Move the endpoint: the flow must follow, although n1p1
			// still answers whoever reaches it.
			if _, err := c.Registry.UpdateEndpointSlice(ctx, &weirv1.UpdateEndpointSliceRequest{EndpointSlice: udpSlice("dns", fam, n2p1)}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the same UDP flow moves to the new endpoint", func() error {
				pod, err := client.ask(dst)
				if err != nil {
					return err
				}
				if pod != n2p1.Name {
					return fmt.Errorf("still answered by %s", pod)
				}
				return nil
			})
		})
	}
}
