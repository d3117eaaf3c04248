package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/ipam"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// noNodes is a cluster whose nodes have not connected.
type noNodes struct{}

func (noNodes) Status() []observed.Node { return nil }

// TestNothingIsWrittenOnAnotherControllersService: on a real apiserver,
// two class-less LoadBalancer Services whose addresses another controller
// set (outside Weir's pools) get no condition, no Event and no status
// change from Weir, while Weir's own Service gets its address, its
// conditions and its Events from the same writers: with Weir not the
// default load balancer (the two share an address and port, a conflict
// the nodes report), and with Weir the default (the addresses were set
// by another controller all the same).
func TestNothingIsWrittenOnAnotherControllersService(t *testing.T) {
	t.Run("not the default", func(t *testing.T) {
		nothingWrittenOnTheirs(t, kubernetes.Classes{Class: kubernetes.DefaultLoadBalancerClass}, "198.51.100.7", "198.51.100.7")
	})
	t.Run("the default", func(t *testing.T) {
		nothingWrittenOnTheirs(t, kubernetes.Classes{Class: kubernetes.DefaultLoadBalancerClass, Default: true}, "198.51.100.7", "198.51.100.8")
	})
}

// nothingWrittenOnTheirs runs the source, the allocator and the reporter
// with classes beside two class-less Services another controller gave
// the addresses a and b, and checks Weir writes nothing on them.
func nothingWrittenOnTheirs(t *testing.T, classes kubernetes.Classes, a, b string) {
	ctx, cancel, kc, reg := clusterWithPublicPool(t)
	lb := func(name string, class *string, ingress string) *corev1.Service {
		s, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class, Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ingress == "" {
			return s
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ingress}}
		if s, err = kc.CoreV1().Services("default").UpdateStatus(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	theirs := []*corev1.Service{lb("theirs-a", nil, a), lb("theirs-b", nil, b)}
	lb("mine", ptr(kubernetes.DefaultLoadBalancerClass), "")

	recorder, err := kubernetes.NewRecorder(ctx, kc)
	if err != nil {
		t.Fatal(err)
	}
	writer := kubernetes.StatusWriter{Client: kc, Events: recorder, Log: slog.New(slog.DiscardHandler)}
	defer runLeader(t, ctx, cancel, kc, reg, classes, writer)()

	// The writers work: Weir's own Service is told what Weir did.
	regarding := func(name string) ([]string, error) {
		evs, err := kc.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, e := range evs.Items {
			if e.Regarding.Name == name {
				out = append(out, e.Reason+": "+e.Note)
			}
		}
		return out, nil
	}
	eventually(t, "Weir's Service has its address, its Announced condition and Events", func() error {
		got, err := kc.CoreV1().Services("default").Get(ctx, "mine", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(got.Status.LoadBalancer.Ingress) != 1 || len(got.Status.Conditions) != 2 {
			return fmt.Errorf("status %+v", got.Status)
		}
		evs, err := regarding("mine")
		if err != nil || len(evs) < 2 {
			return fmt.Errorf("events %v, %v", evs, err)
		}
		return nil
	})
	eventually(t, "the registry holds the other controller's Services", func() error {
		for _, s := range theirs {
			if _, err := reg.Services.Get("default/" + s.Name); err != nil {
				return err
			}
		}
		return nil
	})
	time.Sleep(time.Second) // rounds of the allocator and the reporter
	for _, s := range theirs {
		got, err := kc.CoreV1().Services("default").Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != s.ResourceVersion || len(got.Status.Conditions) != 0 {
			t.Errorf("%s was written to (resourceVersion %s, was %s): %+v", s.Name, got.ResourceVersion, s.ResourceVersion, got.Status)
		}
		evs, err := regarding(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 0 {
			t.Errorf("Weir recorded Events on %s, another controller's: %v", s.Name, evs)
		}
	}
}

// TestWeirsConditionsLeaveWithTheService: a Service Weir addressed, moved
// away (to ClusterIP, then to another controller's class, as a move to
// MetalLB goes), loses Weir's conditions: its status says nothing of Weir
// once it is not Weir's.
func TestWeirsConditionsLeaveWithTheService(t *testing.T) {
	ctx, cancel, kc, reg := clusterWithPublicPool(t)
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr(kubernetes.DefaultLoadBalancerClass),
			Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writer := kubernetes.StatusWriter{Client: kc, Log: slog.New(slog.DiscardHandler)}
	defer runLeader(t, ctx, cancel, kc, reg, kubernetes.Classes{Class: kubernetes.DefaultLoadBalancerClass}, writer)()

	conditions := func() ([]string, error) {
		got, err := kc.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, c := range got.Status.Conditions {
			out = append(out, c.Type)
		}
		return out, nil
	}
	eventually(t, "Weir's conditions on its Service", func() error {
		got, err := conditions()
		if err == nil && len(got) != 2 {
			err = fmt.Errorf("conditions %v", got)
		}
		return err
	})
	move := func(typ corev1.ServiceType, class *string) {
		t.Helper()
		s, err := kc.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.Type, s.Spec.LoadBalancerClass = typ, class
		if typ == corev1.ServiceTypeClusterIP {
			for i := range s.Spec.Ports {
				s.Spec.Ports[i].NodePort = 0
			}
			s.Spec.ExternalTrafficPolicy, s.Spec.AllocateLoadBalancerNodePorts = "", nil
		}
		if _, err := kc.CoreV1().Services("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	move(corev1.ServiceTypeClusterIP, nil)
	eventually(t, "no Weir condition on the ClusterIP Service", func() error {
		got, err := conditions()
		if err == nil && len(got) != 0 {
			err = fmt.Errorf("conditions %v", got)
		}
		return err
	})
	move(corev1.ServiceTypeLoadBalancer, ptr("metallb.io/metallb"))
	time.Sleep(time.Second) // rounds of the allocator and the reporter
	if got, err := conditions(); err != nil || len(got) != 0 {
		t.Errorf("another controller's Service has conditions %v (%v)", got, err)
	}
}

// runLeader runs what a leading server runs for Kubernetes services (the
// source, the allocator and the reporter, writing through writer) until
// the returned stop, which cancels ctx and waits for all three.
func runLeader(t *testing.T, ctx context.Context, cancel func(), kc clientset.Interface, reg *registry.Registry, classes kubernetes.Classes, writer kubernetes.StatusWriter) (stop func()) {
	t.Helper()
	src, err := kubernetes.New(kubernetes.Config{Classes: classes}, kc, reg)
	if err != nil {
		t.Fatal(err)
	}
	alloc := ipam.New(reg, map[string]ipam.Writer{model.SourceKubernetes: writer}, nil)
	reporter := kubernetes.NewReporter(kubernetes.ReporterConfig{Registry: reg, Status: noNodes{}, Services: writer, Custom: src,
		Period: 50 * time.Millisecond, Settle: 100 * time.Millisecond})
	done := make(chan struct{}, 3)
	go func() { src.Run(ctx); done <- struct{}{} }()
	go func() { alloc.Run(ctx); done <- struct{}{} }()
	go func() { reporter.Run(ctx); done <- struct{}{} }()
	return func() { cancel(); <-done; <-done; <-done }
}

// clusterWithPublicPool starts an apiserver and a registry holding the
// pool public (203.0.113.200/30), with a context that its cancel, or the
// test's end, ends.
func clusterWithPublicPool(t *testing.T) (context.Context, context.CancelFunc, clientset.Interface, *registry.Registry) {
	t.Helper()
	_, kc := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg := registrytest.Open(t)
	r, _ := model.ParseAddressRange("203.0.113.200/30")
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: []model.AddressRange{r}}); err != nil {
		t.Fatal(err)
	}
	return ctx, cancel, kc, reg
}
