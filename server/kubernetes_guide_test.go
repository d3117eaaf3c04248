package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/servertest"
)

// guideSection is the text of docs/kubernetes.md under heading, up to the
// next heading of its level.
func guideSection(t *testing.T, heading string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/kubernetes.md has no section %q", heading)
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	section, _, _ = strings.Cut(section, "\n"+level)
	return section
}

// TestKubernetesGuideMovesAServiceFromMetalLB follows docs/kubernetes.md
// on a real apiserver with the chart's defaults (the class weir.dev/weir,
// defaultLoadBalancer off): its pool and peer are taken; a Service
// MetalLB addressed is left alone; the guide's annotation and patches,
// read from the guide, move it to Weir with its address and its
// externalTrafficPolicy; the same patches without the class hand it back.
func TestKubernetesGuideMovesAServiceFromMetalLB(t *testing.T) {
	pool := guideSection(t, "## A pool and a peer")
	_, block, ok := strings.Cut(pool, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal(`docs/kubernetes.md has no yaml block under "A pool and a peer"`)
	}
	move := guideSection(t, "## Move one Service, keeping its address")
	annotate := regexp.MustCompile(`kubectl -n shop annotate service web (\S+)=(\S+)`).FindStringSubmatch(move)
	var patches []string
	for _, m := range regexp.MustCompile(`(?s)kubectl -n shop patch service web --type merge\s*\\?\s*-p '([^']*)'`).FindAllStringSubmatch(move, -1) {
		patches = append(patches, m[1])
	}
	if annotate == nil || len(patches) != 2 {
		t.Fatalf("the guide's move: annotation %q, merge patches %q; want one annotation and two patches", annotate, patches)
	}

	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	var poolName string
	for _, d := range strings.Split(block, "---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: obj}
		res := v1alpha1.AddressPools
		if u.GetKind() == v1alpha1.BGPPeerKind {
			res = v1alpha1.BGPPeers
		} else {
			poolName = u.GetName()
		}
		if _, err := dyn.Resource(res).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the guide's %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}

	// web as MetalLB left it: no class, an address in its status.
	const addr = "203.0.113.10"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := kc.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr}}
	if _, err := kc.CoreV1().Services("shop").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.AnnouncePeriod = 100 * time.Millisecond
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "weir-system",
			Classes: kubernetes.Classes{Class: kubernetes.DefaultLoadBalancerClass}}
	})
	// Weir counts MetalLB's address as in use, and leaves web alone.
	eventually(t, 20*time.Second, func() error {
		row, err := tableRow(ctx, kc, v1alpha1.AddressPools.Resource, poolName)
		if err != nil || !strings.Contains(row, "IPv4 In Use=1 IPv4 Free=9") || !strings.Contains(row, "Accepted=True") {
			return fmt.Errorf("kubectl get weiraddresspools: %s, %v", row, err)
		}
		return nil
	})
	if got := weirsEvents(t, ctx, kc); len(got) != 0 {
		t.Errorf("Weir wrote Events on MetalLB's Service: %v", got)
	}

	patch := func(body string) {
		t.Helper()
		if _, err := kc.CoreV1().Services("shop").Patch(ctx, "web", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatalf("the guide's patch %s: %v", body, err)
		}
	}
	patch(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotate[1], annotate[2]))
	for _, p := range patches {
		patch(p)
	}
	eventually(t, 20*time.Second, func() error {
		svc, err := kc.CoreV1().Services("shop").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ing := svc.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != addr {
			return fmt.Errorf("web's ingress %v; want MetalLB's address %s kept", ing, addr)
		}
		if svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
			return fmt.Errorf("web's externalTrafficPolicy %q; want Local kept", svc.Spec.ExternalTrafficPolicy)
		}
		if !slices.Contains(weirsEvents(t, ctx, kc), kubernetes.EventIPAllocated+": Assigned IP "+addr) {
			return fmt.Errorf("no IPAllocated Event on web")
		}
		return nil
	})

	// Back to MetalLB: the same patches, the class left out of the second.
	var back map[string]map[string]any
	if err := json.Unmarshal([]byte(patches[1]), &back); err != nil {
		t.Fatal(err)
	}
	delete(back["spec"], "loadBalancerClass")
	second, _ := json.Marshal(back)
	patch(patches[0])
	patch(string(second))
	time.Sleep(3 * time.Second) // Weir's assignments take well under a second
	svc, err = kc.CoreV1().Services("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.LoadBalancerClass != nil || len(svc.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("moved back, web has class %v and ingress %v; want no class and no address from Weir", svc.Spec.LoadBalancerClass, svc.Status.LoadBalancer.Ingress)
	}
}

// weirsEvents lists the Events on shop/web, as "REASON: NOTE".
func weirsEvents(t *testing.T, ctx context.Context, kc clientset.Interface) []string {
	t.Helper()
	events, err := kc.EventsV1().Events("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events.Items {
		if e.Regarding.Name == "web" {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}
