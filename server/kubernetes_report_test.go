package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/servertest"
)

// TestKubernetesServicesAreToldWhatHappened: a Kubernetes Service's users
// see in kubectl describe what Weir did with it: the address assigned or
// why none could be (Events and the AddressAssigned condition, written
// once, not at every round), and which nodes receive it or why none does
// (the Announced condition and Events, following the nodes). A service of
// another controller gets nothing from Weir.
func TestKubernetesServicesAreToldWhatHappened(t *testing.T) {
	c, kc, _ := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	file := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(file, []byte("kind: AddressPool\nmetadata:\n  name: public\naddresses:\n- 203.0.113.220/32\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.AnnouncePeriod, cfg.AnnounceSettle = 100*time.Millisecond, 300*time.Millisecond
		cfg.ResourcesFile = file
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Classes: kubernetes.Classes{Class: kubernetes.DefaultLoadBalancerClass, Default: true}}
	})

	node, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		_, err := ts.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "node1"})
		return err
	})
	// A healthy agent on node1 that applies what it is sent.
	a := connectAgent(t, ctx, ts, "node1", 0)
	var sendMu sync.Mutex
	go a.ackAll(&sendMu)
	sendMu.Lock()
	err = a.stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: &weirv1.Report{
		Full: true, NodeHealth: &weirv1.NodeHealth{HealthzCode: 200, LivezCode: 200, NodeEligible: true}}}})
	sendMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}

	lb := func(name, class string) {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}
		if class != "" {
			s.Spec.LoadBalancerClass = &class
		}
		if _, err := kc.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// events lists Weir's Events on the service as "Type Reason: note".
	events := func(name string) []string {
		list, err := kc.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range list.Items {
			// The apiserver's own controllers report on Services too.
			if e.Regarding.Name == name && e.Regarding.Kind == "Service" && e.ReportingController == kubernetes.ReportingController {
				out = append(out, e.Type+" "+e.Reason+": "+e.Note)
			}
		}
		return out
	}
	hasEvent := func(name, prefix string) error {
		got := events(name)
		for _, e := range got {
			if strings.HasPrefix(e, prefix) {
				return nil
			}
		}
		return fmt.Errorf("%s's Events %q; want one starting %q", name, got, prefix)
	}
	condition := func(name, typ string) (*metav1.Condition, *corev1.Service) {
		svc, err := kc.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return apimeta.FindStatusCondition(svc.Status.Conditions, typ), svc
	}
	hasCondition := func(name, typ string, status metav1.ConditionStatus, reason, message string) error {
		c, _ := condition(name, typ)
		if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, message) {
			return fmt.Errorf("%s's %s condition %+v; want %s %s with %q", name, typ, c, status, reason, message)
		}
		return nil
	}

	lb("first", "")
	eventually(t, 15*time.Second, func() error {
		if err := hasEvent("first", "Normal IPAllocated: Assigned IP 203.0.113.220"); err != nil {
			return err
		}
		return hasCondition("first", kubernetes.ConditionAddressAssigned, metav1.ConditionTrue, "Assigned", "203.0.113.220")
	})
	eventually(t, 15*time.Second, func() error {
		if err := hasCondition("first", kubernetes.ConditionAnnounced, metav1.ConditionTrue, "Announced", "203.0.113.220 received by node1"); err != nil {
			return err
		}
		return hasEvent("first", "Normal Announced: 203.0.113.220 received by node1")
	})

	// The pool is empty now: the next service is told why, once.
	lb("second", "")
	eventually(t, 15*time.Second, func() error {
		if err := hasEvent("second", "Warning AllocationFailed: PoolExhausted: "); err != nil {
			return err
		}
		return hasCondition("second", kubernetes.ConditionAddressAssigned, metav1.ConditionFalse, "PoolExhausted", "assigned")
	})
	_, before := condition("second", kubernetes.ConditionAddressAssigned)
	time.Sleep(time.Second)
	if _, after := condition("second", kubernetes.ConditionAddressAssigned); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the refusal was written again (resourceVersion %s, then %s): a refusal is written once", before.ResourceVersion, after.ResourceVersion)
	}

	// node1 labelled out of external load balancers: no node receives
	// the first service's address, and it says why.
	node.Labels = map[string]string{"node.kubernetes.io/exclude-from-external-load-balancers": ""}
	if _, err := kc.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		if err := hasCondition("first", kubernetes.ConditionAnnounced, metav1.ConditionFalse, "NotAnnounced", "203.0.113.220: no node receives it (node1: NodeExcluded)"); err != nil {
			return err
		}
		return hasEvent("first", "Warning NotAnnounced: 203.0.113.220: no node receives it (node1: NodeExcluded)")
	})
	if c, _ := condition("first", kubernetes.ConditionAddressAssigned); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("the Announced patch lost the AddressAssigned condition: %+v", c)
	}

	// A Service the nodes leave part of out: an external IP the server's
	// rules do not allow.
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "outside"},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{"198.51.100.7"}, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		return hasEvent("outside", "Warning Conflict: not programmed: spec.external_ips[0]: ")
	})

	// Another controller's service: no Event, no condition, no address.
	lb("theirs", "example.com/another")
	time.Sleep(time.Second)
	if got := events("theirs"); len(got) > 0 {
		t.Errorf("another controller's service got Events %q", got)
	}
	if _, svc := condition("theirs", kubernetes.ConditionAddressAssigned); len(svc.Status.Conditions) > 0 || len(svc.Status.LoadBalancer.Ingress) > 0 {
		t.Errorf("another controller's service was written to: %+v", svc.Status)
	}
}
