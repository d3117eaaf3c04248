package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/weirlab"
)

// lbService is a LoadBalancer service with the next free cluster IP, whose
// address the pools assign.
func assignedService(name string, i int) *weirv1.Service {
	return &weirv1.Service{
		Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: name},
		Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
			ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", 10+i/250, 1+i%250)},
			Ports:      []*weirv1.ServicePort{{Name: "http", Port: 80, TargetPort: weirlab.PodPort}}},
	}
}

// TestReplicasSurviveTheLeaderKilled: three replicas of the server on a
// three-member etcd cluster, the agents spread across them. The leading
// replica is killed (SIGKILL) in the middle of a stream of writes: no
// acknowledged write is lost, no address is assigned twice, another
// replica leads within the lease, every agent is connected and up to date
// again soon after, and connections through a node port and a VIP never
// fail. Then an etcd member is killed, and writes go on; then a second,
// and writes fail while reads and forwarding go on, until they are back.
func TestReplicasSurviveTheLeaderKilled(t *testing.T) {
	c := startClusterOn(t, 3, func(c *weirlab.Cluster) { c.Replicas = 3 })
	t.Cleanup(func() {
		if t.Failed() {
			for i, p := range c.Servers {
				t.Logf("replica %d log:\n%s", i, p.Log())
			}
		}
	})
	ctx := context.Background()
	createWeb(t, c)
	if _, err := c.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"100.64.0.0/22"}}}); err != nil {
		t.Fatal(err)
	}
	var leader int
	eventually(t, "a replica leads", func() error {
		if leader = c.Leader(); leader < 0 {
			return fmt.Errorf("no replica says it leads")
		}
		return nil
	})

	nodePortLoop := keepConnecting(c.Router, netip.AddrPortFrom(c.Nodes[0].IPv4, nodePort))
	vipLoop := keepConnecting(c.Router, netip.AddrPortFrom(lbIP, 80))

	// A stream of writes through any replica; the acknowledged ones must
	// all be there at the end.
	var mu sync.Mutex
	var acked []string
	var refused []error
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("w%d", i)
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.Registry.CreateService(wctx, &weirv1.CreateServiceRequest{Service: assignedService(name, i)})
			cancel()
			mu.Lock()
			if err == nil {
				acked = append(acked, name)
			} else {
				refused = append(refused, err)
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// ackedAtLeast waits until the stream has n acknowledged writes.
	ackedAtLeast := func(n int, when string) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d writes acknowledged %s", n, when), func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(acked) < n {
				return fmt.Errorf("%d acknowledged, %d refused (last: %v)", len(acked), len(refused), refused[max(0, len(refused)-1):])
			}
			return nil
		})
	}
	ackedAtLeast(10, "before the kill")

	before, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: assignedService("before", 997)})
	if err != nil {
		t.Fatal(err)
	}
	beforeRev, _ := strconv.ParseUint(before.GetService().GetMetadata().GetResourceVersion(), 10, 64)
	mu.Lock()
	ackedBeforeKill := len(acked)
	mu.Unlock()
	c.Servers[leader].Kill()
	killed := time.Now()
	// Watch for both at once: a new leader, and every agent of the dead
	// replica on another with everything written before the kill applied
	// (it notices at once: the connection is reset).
	statusOf := weirv1.NewStatusServiceClient(c.Conn)
	var newLeader, agentsBack time.Duration
	for newLeader == 0 || agentsBack == 0 {
		if l := c.Leader(); newLeader == 0 && l >= 0 && l != leader {
			newLeader = time.Since(killed)
		}
		if agentsBack == 0 {
			resp, err := statusOf.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
			back := err == nil && len(resp.GetNodes()) == len(c.Nodes)
			for _, n := range resp.GetNodes() {
				back = back && n.GetConnected() && n.GetAppliedVersion() >= beforeRev && n.GetLastSeen().AsTime().After(killed)
			}
			if back {
				agentsBack = time.Since(killed)
			}
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("10 s after the leader was killed: new leader after %v, agents back after %v (0: not yet)", newLeader, agentsBack)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("replica %d killed; replica %d leads %v later; every agent connected to a live replica and up to date %v after the kill",
		leader, c.Leader(), newLeader.Round(time.Millisecond), agentsBack.Round(time.Millisecond))
	// The lease is 2 s (--leader-lease), and the election follows its
	// expiry at once.
	if newLeader > 2500*time.Millisecond {
		t.Errorf("a new leader %v after the leader was killed, want within the 2 s lease", newLeader)
	}
	if agentsBack > time.Second {
		t.Errorf("agents back %v after the kill, want within a second", agentsBack)
	}

	// Every agent is programmed through a write made after the kill.
	createWithPods(t, c, assignedService("after", 999))
	t.Logf("every agent programmed a write made after the kill %v after it", time.Since(killed).Round(time.Millisecond))

	// The stream goes on through the new leader.
	ackedAtLeast(ackedBeforeKill+20, "after the kill")
	close(stop)
	<-writerDone

	// Nothing acknowledged is lost; every service gets its own address.
	mu.Lock()
	names := append([]string{"before", "after"}, acked...)
	mu.Unlock()
	eventually(t, "every acknowledged service is there with its own address", func() error {
		resp, err := c.Registry.ListServices(ctx, &weirv1.ListServicesRequest{})
		if err != nil {
			return err
		}
		owner := map[string]string{}
		byName := map[string]*weirv1.Service{}
		for _, s := range resp.GetServices() {
			byName[s.GetMetadata().GetName()] = s
			for _, ip := range s.GetStatus().GetLoadBalancerIps() {
				if o, ok := owner[ip]; ok {
					t.Fatalf("%s assigned to both %s and %s", ip, o, s.GetMetadata().GetName())
				}
				owner[ip] = s.GetMetadata().GetName()
			}
		}
		for _, n := range names {
			s := byName[n]
			if s == nil {
				t.Fatalf("acknowledged service %s is gone", n)
			}
			if len(s.GetStatus().GetLoadBalancerIps()) == 0 {
				return fmt.Errorf("%s has no address yet", n)
			}
		}
		return nil
	})
	t.Logf("%d writes acknowledged, none lost, each address assigned once; %d refused while the replica died: %v", len(names), len(refused), refused)

	// One etcd member down: the other two are a quorum.
	c.Etcd[0].Kill()
	createWithPods(t, c, assignedService("one-member-down", 998))

	// Two of three down: no quorum. Writes fail clearly, and so do reads
	// once the replicas see they are not current (what they hold may be
	// behind); nodes keep forwarding (the loops below); with the members
	// back, everything catches up without a restart.
	c.Etcd[1].Kill()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = c.Registry.CreateService(wctx, &weirv1.CreateServiceRequest{Service: assignedService("no-quorum", 996)})
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a write without etcd's quorum: %v, want Unavailable", err)
	}
	read := func() error {
		_, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
		return err
	}
	eventually(t, "a read without etcd's quorum is refused as not current", func() error {
		if err := read(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "replica not current") {
			return fmt.Errorf("a read: %v; want Unavailable, replica not current", err)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // agents go round the replicas, and forward on
	for _, i := range []int{0, 1} {
		if err := c.RestartEtcd(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "a replica is current again", read)
	createWithPods(t, c, assignedService("quorum-back", 995))

	for what, done := range map[string]func() (int64, int64){"the node port": nodePortLoop, "the VIP": vipLoop} {
		if fails, all := done(); fails != 0 || all < 100 {
			t.Errorf("connections through %s while the leader died: %d of %d failed", what, fails, all)
		}
	}
}

// createWithPods creates svc with every pod as its endpoints and waits
// until every node has programmed it, as every replica's status shows.
func createWithPods(t *testing.T, c *weirlab.Cluster, svc *weirv1.Service) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	for _, s := range endpointSlices(svc.GetMetadata().GetName(), c.Pods()) {
		if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: s}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitServiceProgrammed(ctx, "default", svc.GetMetadata().GetName()); err != nil {
		t.Fatal(err)
	}
}
