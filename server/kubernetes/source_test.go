package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientset "k8s.io/client-go/kubernetes"

	"github.com/weirlb/weir/server/ipam"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
	"github.com/weirlb/weir/test/kubeapi"
	"github.com/weirlb/weir/test/wait"
)

func ptr[T any](v T) *T { return &v }

// startCluster runs a real apiserver and returns a client for it.
func startCluster(t *testing.T) (*kubeapi.Cluster, clientset.Interface) {
	t.Helper()
	c := kubeapi.StartForTest(t)
	rc, err := kubernetes.RestConfig(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := clientset.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c, client
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	wait.For(t, 15*time.Second, what, f)
}

func TestSourceMirrorsTheCluster(t *testing.T) {
	_, kc := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := registrytest.Open(t)

	// Left over from an earlier run: gone from the cluster, so the first
	// sync must remove it; a native service of the same kind stays.
	leftover := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "gone", Source: model.SourceKubernetes}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.9")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	if _, err := reg.Services.Create(leftover); err != nil {
		t.Fatal(err)
	}
	native := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "native", Source: model.SourceNative}, Type: model.ClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.10")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
		ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	if _, err := reg.Services.Create(native); err != nil {
		t.Fatal(err)
	}
	oldRange := &model.ServiceCIDR{Meta: model.Meta{Name: "old-range", Source: model.SourceKubernetes}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}}
	if _, err := reg.ServiceCIDRs.Create(oldRange); err != nil {
		t.Fatal(err)
	}

	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ClusterIP:             "10.96.1.10",
			ClusterIPs:            []string{"10.96.1.10"},
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			SessionAffinity:       corev1.ServiceAffinityClientIP,
		},
	}
	created, err := kc.CoreV1().Services("shop").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
	if _, err := kc.CoreV1().Services("shop").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "elsewhere", Labels: map[string]string{kubernetes.LabelServiceProxyName: "someone-else"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: "None", Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "alias"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.invalid"}},
	} {
		if _, err := kc.CoreV1().Services("shop").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.11"}, NodeName: ptr("node1"), Zone: ptr("a"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
			{Addresses: []string{"10.244.2.11"}, NodeName: ptr("node2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	if _, err := kc.DiscoveryV1().EndpointSlices("shop").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	headlessSlice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "headless-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "headless", kubernetes.LabelHeadless: ""}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.12"}}},
	}
	if _, err := kc.DiscoveryV1().EndpointSlices("shop").Create(ctx, headlessSlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{corev1.LabelTopologyZone: "a"}},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}, PodCIDR: "10.244.1.0/24", Taints: []corev1.Taint{{Key: kubernetes.TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}},
	}
	createdNode, err := kc.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createdNode.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "198.51.100.11"}, {Type: corev1.NodeInternalIP, Address: "192.0.2.11"}}
	if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, createdNode, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	src, err := kubernetes.New(kubernetes.Config{}, kc, reg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()

	eventually(t, "the service, its slice and the node mirrored", func() error {
		s, err := reg.Services.Get("shop/web")
		if err != nil {
			return err
		}
		if s.Source != model.SourceKubernetes || s.Type != model.LoadBalancer || s.ExternalTrafficPolicy != model.PolicyLocal ||
			s.HealthCheckNodePort == 0 || s.SessionAffinityTimeout != model.DefaultSessionAffinityTimeout ||
			len(s.LoadBalancerIPs) != 1 || s.LoadBalancerIPs[0].String() != "203.0.113.10" || s.Ports[0].TargetPort != 8080 || s.Ports[0].NodePort == 0 {
			return fmt.Errorf("service %+v", s)
		}
		sl, err := reg.EndpointSlices.Get("shop/web-abc")
		if err != nil {
			return err
		}
		if sl.ServiceName != "web" || len(sl.Endpoints) != 2 || sl.Endpoints[0].NodeName != "node1" || sl.Endpoints[0].Zone != "a" ||
			!sl.Endpoints[1].IsTerminating() || sl.Ports[0].Port != 8080 {
			return fmt.Errorf("slice %+v", sl)
		}
		nd, err := reg.Nodes.Get("node1")
		if err != nil {
			return err
		}
		if !nd.Deleting || nd.Zone != "a" || len(nd.Addresses) != 2 || nd.Addresses[0].String() != "192.0.2.11" || nd.PodCIDRs[0].String() != "10.244.1.0/24" {
			return fmt.Errorf("node %+v", nd)
		}
		return nil
	})
	eventually(t, "the first sync removes what the cluster no longer has", func() error {
		if _, err := reg.Services.Get("shop/gone"); !errors.Is(err, registry.ErrNotFound) {
			return fmt.Errorf("shop/gone still there: %v", err)
		}
		if _, err := reg.ServiceCIDRs.Get("old-range"); !errors.Is(err, registry.ErrNotFound) {
			return fmt.Errorf("service CIDR old-range still there: %v", err)
		}
		return nil
	})
	// The apiserver makes a ServiceCIDR of its --service-cluster-ip-range.
	eventually(t, "the apiserver's own ServiceCIDR mirrored", func() error {
		c, err := reg.ServiceCIDRs.Get("kubernetes")
		if err != nil {
			return err
		}
		if len(c.CIDRs) != 1 || c.CIDRs[0].String() != kubeapi.ServiceCIDR {
			return fmt.Errorf("service CIDR %+v", c)
		}
		return nil
	})
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/16", "fd00:100::/108"}}}
	if _, err := kc.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new ServiceCIDR mirrored", func() error {
		c, err := reg.ServiceCIDRs.Get("extra")
		if err != nil {
			return err
		}
		if len(c.CIDRs) != 2 || c.CIDRs[1].String() != "fd00:100::/108" {
			return fmt.Errorf("service CIDR %+v", c)
		}
		return nil
	})
	// Deleted, it stays (terminating) while the apiserver's finalizer
	// holds it, as kube-proxy keeps it; gone once the finalizer is.
	if err := kc.NetworkingV1().ServiceCIDRs().Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := kc.NetworkingV1().ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{}); err == nil && len(got.Finalizers) > 0 {
		got.Finalizers = nil
		if _, err := kc.NetworkingV1().ServiceCIDRs().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the ServiceCIDR's deletion mirrored", func() error {
		if _, err := reg.ServiceCIDRs.Get("extra"); !errors.Is(err, registry.ErrNotFound) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	for _, key := range []string{"shop/elsewhere", "shop/headless", "shop/alias"} {
		if _, err := reg.Services.Get(key); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("service %s is in the registry (%v); want it skipped", key, err)
		}
	}
	if _, err := reg.EndpointSlices.Get("shop/headless-abc"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("a headless service's slice was mirrored")
	}
	if _, err := reg.Services.Get("shop/native"); err != nil {
		t.Errorf("the first sync removed a native service: %v", err)
	}

	// A service is owned by one source: the native API cannot take it over.
	clash := *native
	clash.Meta = model.Meta{Namespace: "shop", Name: "web", Source: model.SourceNative}
	clash.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.9.11")}
	if _, err := reg.Services.Create(&clash); !errors.Is(err, registry.ErrAlreadyExists) || !strings.Contains(err.Error(), "kubernetes") {
		t.Errorf("native create over a kubernetes service: %v; want AlreadyExists naming the owner", err)
	}
	if _, err := reg.Services.Update(&clash); !errors.Is(err, registry.ErrInUse) {
		t.Errorf("native update of a kubernetes service: %v; want ErrInUse", err)
	}
	if _, err := reg.Services.Delete("shop/web", 0, model.SourceNative); !errors.Is(err, registry.ErrInUse) {
		t.Errorf("native delete of a kubernetes service: %v; want ErrInUse", err)
	}

	// Changes follow: an endpoint goes, then the service.
	slice.Endpoints = slice.Endpoints[:1]
	if _, err := kc.DiscoveryV1().EndpointSlices("shop").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slice update mirrored", func() error {
		sl, err := reg.EndpointSlices.Get("shop/web-abc")
		if err != nil || len(sl.Endpoints) != 1 {
			return fmt.Errorf("slice %+v, %v", sl, err)
		}
		return nil
	})
	if err := kc.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the service deletion mirrored", func() error {
		if _, err := reg.Services.Get("shop/web"); !errors.Is(err, registry.ErrNotFound) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}

// TestAssignedAddressIsWrittenBack: a Kubernetes LoadBalancer service gets
// an address from a pool, written into its status.loadBalancer.ingress.
func TestAssignedAddressIsWrittenBack(t *testing.T) {
	_, kc := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := registrytest.Open(t)
	r, _ := model.ParseAddressRange("203.0.113.200/30")
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: []model.AddressRange{r}}); err != nil {
		t.Fatal(err)
	}
	defer runSourceAndAllocator(t, ctx, cancel, kc, reg, kubernetes.Classes{Default: true})()

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "lb"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := kc.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool's first address in the service's status, in Kubernetes and in the registry", func() error {
		got, err := kc.CoreV1().Services("default").Get(ctx, "lb", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ing := got.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != "203.0.113.200" {
			return fmt.Errorf("ingress %v", ing)
		}
		m, err := reg.Services.Get("default/lb")
		if err != nil || len(m.LoadBalancerIPs) != 1 || m.LoadBalancerIPs[0].String() != "203.0.113.200" {
			return fmt.Errorf("registry %v, %v", m, err)
		}
		return nil
	})
}

// TestOtherControllersServicesAreLeftAlone: beside another load-balancer
// controller (MetalLB, say), Weir assigns only the services of its own
// class; a class-less one is the cluster default's, which Weir is not
// here. The other controller's services are never written to, even when
// one holds an address of a Weir pool (which Weir then never hands out),
// and their addresses are still forwarded by the nodes. A service moved
// from MetalLB keeps asking with MetalLB's annotations.
func TestOtherControllersServicesAreLeftAlone(t *testing.T) {
	_, kc := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := registrytest.Open(t)
	r, _ := model.ParseAddressRange("203.0.113.200/30")
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "public"}, Ranges: []model.AddressRange{r}}); err != nil {
		t.Fatal(err)
	}
	lb := func(name, class string, annotations map[string]string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
		}
		if class != "" {
			s.Spec.LoadBalancerClass = ptr(class)
		}
		created, err := kc.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	// MetalLB's: it assigned an address that a Weir pool holds too.
	theirs := lb("theirs", "metallb.io/metallb", nil)
	theirs.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.200"}}
	theirs, err := kc.CoreV1().Services("default").UpdateStatus(ctx, theirs, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	classless := lb("classless", "", nil)
	lb("mine", kubernetes.DefaultLoadBalancerClass, nil)
	lb("moved", kubernetes.DefaultLoadBalancerClass, map[string]string{"metallb.io/loadBalancerIPs": "203.0.113.203", "metallb.io/allow-shared-ip": "web"})

	defer runSourceAndAllocator(t, ctx, cancel, kc, reg, kubernetes.Classes{Class: kubernetes.DefaultLoadBalancerClass})()

	ingress := func(name string) string {
		got, err := kc.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, ing := range got.Status.LoadBalancer.Ingress {
			ips = append(ips, ing.IP)
		}
		return strings.Join(ips, ",")
	}
	eventually(t, "Weir's services assigned, the taken address skipped", func() error {
		if got := ingress("mine"); got != "203.0.113.201" {
			return fmt.Errorf("mine has %q; want 203.0.113.201 (203.0.113.200 is MetalLB's)", got)
		}
		if got := ingress("moved"); got != "203.0.113.203" {
			return fmt.Errorf("moved has %q; want 203.0.113.203, asked with metallb.io/loadBalancerIPs", got)
		}
		return nil
	})
	m, err := reg.Services.Get("default/moved")
	if err != nil || m.AllowSharedIP != "web" || m.OtherController {
		t.Errorf("moved in the registry: %+v, %v; want Weir's, sharing key web from metallb.io/allow-shared-ip", m, err)
	}
	// The other controller's services: mirrored for the nodes to forward,
	// never written to.
	o, err := reg.Services.Get("default/theirs")
	if err != nil || !o.OtherController || o.LoadBalancerClass != "metallb.io/metallb" || len(o.LoadBalancerIPs) != 1 {
		t.Errorf("theirs in the registry: %+v, %v; want another controller's, with its address", o, err)
	}
	if c, err := reg.Services.Get("default/classless"); err != nil || !c.OtherController {
		t.Errorf("classless in the registry: %+v, %v; want another controller's (Weir is not the default)", c, err)
	}
	time.Sleep(200 * time.Millisecond) // ten allocation rounds
	for _, s := range []*corev1.Service{theirs, classless} {
		got, err := kc.CoreV1().Services("default").Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != s.ResourceVersion {
			t.Errorf("%s was written to (resourceVersion %s, was %s): %+v", s.Name, got.ResourceVersion, s.ResourceVersion, got.Status)
		}
	}
}

// runSourceAndAllocator mirrors the cluster into reg and assigns addresses
// to the services of classes, until the function it returns is called
// (which cancels ctx and waits for both).
func runSourceAndAllocator(t *testing.T, ctx context.Context, cancel context.CancelFunc, kc clientset.Interface, reg *registry.Registry, classes kubernetes.Classes) func() {
	t.Helper()
	src, err := kubernetes.New(kubernetes.Config{Classes: classes}, kc, reg)
	if err != nil {
		t.Fatal(err)
	}
	alloc := ipam.New(reg, map[string]ipam.Writer{
		model.SourceKubernetes: kubernetes.StatusWriter{Client: kc, Log: slog.New(slog.DiscardHandler)},
	}, nil)
	done := make(chan struct{}, 2)
	go func() { src.Run(ctx); done <- struct{}{} }()
	go func() { alloc.Run(ctx); done <- struct{}{} }()
	return func() { cancel(); <-done; <-done }
}
