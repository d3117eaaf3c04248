package kubecluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/test/kubecluster"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/wait"
)

// The lab itself: two kubelets register and run a Deployment's pods, which
// answer on their pod addresses from another node and from the router.
func TestClusterRunsPods(t *testing.T) {
	lab.RequireRoot(t, "the cluster lab", "it runs kubelets and containerd in network namespaces",
		"ip", "nft", "containerd", "runc", "ctr")
	c := kubecluster.StartForTest(t, kubecluster.Config{Nodes: 2})
	ctx := t.Context()

	kubecluster.ApplyEcho(t, c, "default", "echo", 2, nil)
	pods := kubecluster.WaitPodsReady(t, c, "default", "app=echo", 2)
	nodes := map[string]bool{}
	for _, p := range pods {
		nodes[p.Spec.NodeName] = true
		ip := netip.MustParseAddr(p.Status.PodIP)
		// From the node that does not hold the pod, and from the router.
		for _, from := range []*lab.Netns{c.Nodes[0].Netns, c.Nodes[1].Netns, c.Router} {
			got := get(t, from, netip.AddrPortFrom(ip, 8080))
			if got.Pod != p.Name {
				t.Errorf("GET %s from %s answered by %q, want %q", ip, from, got.Pod, p.Name)
			}
		}
	}
	if len(nodes) != 2 {
		t.Errorf("pods on nodes %v, want both nodes (spread by the scheduler)", nodes)
	}
	list, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		t.Logf("node %s %v %s", n.Name, n.Status.Addresses, n.Status.NodeInfo.ContainerRuntimeVersion)
	}
}

type echoReply struct{ Pod, Remote, Local string }

func get(t *testing.T, from *lab.Netns, to netip.AddrPort) echoReply {
	t.Helper()
	var r echoReply
	wait.For(t, 30*time.Second, fmt.Sprintf("GET %s from %s", to, from), func() error {
		var err error
		r, err = tryGet(from, to)
		return err
	})
	return r
}

// tryGet makes one request on a new connection.
func tryGet(from *lab.Netns, to netip.AddrPort) (echoReply, error) {
	var r echoReply
	resp, err := from.HTTPClient(2 * time.Second).Get("http://" + to.String() + "/")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}
