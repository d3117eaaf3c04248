package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/servertest"
)

// TestKubernetesReplicasAssignThroughTheLeaseHolder: two servers mirror one
// cluster, each into its own store, with leader election. Each reads a
// resources file with a pool of its own, so the address in a Service's
// status tells which replica wrote it, and a Service asking for the
// leader's address would be refused, its status cleared, by the other
// were it assigning too. Only the Lease holder writes, both serve what it
// wrote, and once it stops the other assigns the next Service's address.
func TestKubernetesReplicasAssignThroughTheLeaseHolder(t *testing.T) {
	c, kc, _ := startKube(t)
	ctx := context.Background()

	pools := map[string]string{"a": "203.0.113.200", "b": "203.0.113.210"}
	replicas := map[string]*servertest.Server{}
	for id, addr := range pools {
		file := filepath.Join(t.TempDir(), "resources.yaml")
		doc := fmt.Sprintf("kind: AddressPool\nmetadata:\n  name: pool-%s\naddresses:\n- %s/32\n", id, addr)
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		replicas[id] = servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
			cfg.ResourcesFile = file
			cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Classes: kubernetes.Classes{Default: true}, LeaderElection: &kubernetes.LeaderElection{
				Namespace: "default", Identity: id,
				LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond,
				Log: slog.New(slog.DiscardHandler),
			}}
		})
	}
	var leader string
	eventually(t, 15*time.Second, func() error {
		lease, err := kc.CoordinationV1().Leases("default").Get(ctx, kubernetes.LeaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if h := lease.Spec.HolderIdentity; h != nil && replicas[*h] != nil {
			leader = *h
			return nil
		}
		return fmt.Errorf("lease holder %v", lease.Spec.HolderIdentity)
	})
	other := map[string]string{"a": "b", "b": "a"}[leader]

	createLB := func(name string, annotations map[string]string) {
		t.Helper()
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
		}
		if _, err := kc.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// ingress is a Service's addresses and the version of the object.
	ingress := func(name string) (string, string) {
		svc, err := kc.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error(), ""
		}
		var ips []string
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, ing.IP)
		}
		return fmt.Sprint(ips), svc.ResourceVersion
	}

	createLB("first", map[string]string{kubernetes.AnnotationLoadBalancerIPs: pools[leader]})
	want := fmt.Sprintf("[%s]", pools[leader])
	var version string
	eventually(t, 15*time.Second, func() error {
		var got string
		if got, version = ingress("first"); got != want {
			return fmt.Errorf("first's ingress %s, want %s (the leader %s's pool)", got, want, leader)
		}
		return nil
	})
	time.Sleep(time.Second)
	if got, v := ingress("first"); got != want || v != version {
		t.Fatalf("first's ingress a second later: %s at version %s, want %s at %s still (written again)", got, v, want, version)
	}
	// Both replicas serve what the leader wrote.
	for _, ts := range replicas {
		assigned(t, ts, map[string]string{"first": want})
	}

	replicas[leader].Stop()
	createLB("second", nil)
	want = fmt.Sprintf("[%s]", pools[other])
	eventually(t, 5*time.Second, func() error {
		if got, _ := ingress("second"); got != want {
			return fmt.Errorf("second's ingress %s, want %s (replica %s's pool)", got, want, other)
		}
		return nil
	})
	assigned(t, replicas[other], map[string]string{"second": want})
}
