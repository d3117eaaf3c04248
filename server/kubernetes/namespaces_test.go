package kubernetes_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// A pool scoped by namespace labels (MetalLB's namespaceSelectors) gives
// addresses to the services of the namespaces labelled so, and a
// namespace relabelled later has its services allocated again: a
// service that waited for an address gets one.
func TestNamespaceSelectorFollowsNamespaceLabels(t *testing.T) {
	_, kc := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := registrytest.Open(t)
	r, _ := model.ParseAddressRange("203.0.113.200/30")
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "tenant-a"}, Ranges: []model.AddressRange{r},
		Allocation: &model.ServiceAllocation{NamespaceSelector: map[string]string{"tenant": "a"}}}); err != nil {
		t.Fatal(err)
	}
	defer runSourceAndAllocator(t, ctx, cancel, kc, reg, kubernetes.Classes{Default: true})()
	for _, ns := range []struct{ name, tenant string }{{"shop", "a"}, {"blog", "b"}} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.name,
			Labels: map[string]string{"tenant": ns.tenant}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns.name, Name: "lb"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := kc.CoreV1().Services(ns.name).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ingress := func(ns string) (string, error) {
		got, err := kc.CoreV1().Services(ns).Get(ctx, "lb", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if ing := got.Status.LoadBalancer.Ingress; len(ing) == 1 {
			return ing[0].IP, nil
		}
		return "", nil
	}
	eventually(t, "tenant a's service given the pool's first address, tenant b's refused", func() error {
		a, err := ingress("shop")
		if err != nil || a != "203.0.113.200" {
			return fmt.Errorf("shop/lb has %q (%v)", a, err)
		}
		m, err := reg.Services.Get("blog/lb")
		if err != nil || m.AddressReason == "" {
			return fmt.Errorf("blog/lb not refused yet: %v %v", m, err)
		}
		return nil
	})
	if b, _ := ingress("blog"); b != "" {
		t.Fatalf("blog/lb in tenant b has %s from tenant a's pool", b)
	}
	ns, err := kc.CoreV1().Namespaces().Get(ctx, "blog", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["tenant"] = "a"
	if _, err := kc.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the relabelled namespace's service given an address", func() error {
		b, err := ingress("blog")
		if err != nil || b != "203.0.113.201" {
			return fmt.Errorf("blog/lb has %q (%v)", b, err)
		}
		return nil
	})
}
