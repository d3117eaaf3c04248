package server_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	clientset "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/lbctl/convert"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/servertest"
	"github.com/weirlb/weir/test/kubeapi"
)

// setDuring sets *p to v for the rest of the test, and back once the
// cleanups registered after it have run: a server the test starts later
// has stopped by then, so none of its goroutines reads *p as it changes.
func setDuring[T any](t *testing.T, p *T, v T) {
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

// startKube runs a real apiserver (apiserverArgs added to its flags) and
// returns clients for it.
func startKube(t *testing.T, apiserverArgs ...string) (*kubeapi.Cluster, clientset.Interface, dynamic.Interface) {
	t.Helper()
	c := kubeapi.StartForTest(t, apiserverArgs...)
	rc, err := kubernetes.RestConfig(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 500, 1000 // a test makes hundreds of objects at once
	kc, err := clientset.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c, kc, dyn
}

// installCRDs creates the shipped CustomResourceDefinitions and waits
// until the apiserver serves them.
func installCRDs(t *testing.T, ctx context.Context, dyn dynamic.Interface) {
	t.Helper()
	crdRes := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	files, _ := filepath.Glob("../deploy/kubernetes/crds/*.yaml")
	if len(files) != 2 {
		t.Fatalf("CRD files %v", files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(data, &obj); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(crdRes).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, func() error {
		for _, r := range []schema.GroupVersionResource{v1alpha1.AddressPools, v1alpha1.BGPPeers} {
			if _, err := dyn.Resource(r).List(ctx, metav1.ListOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestCustomResourcesOnARealAPIServer: Weir's CRDs refuse at create time
// what one object can tell is wrong, naming the field; the server mirrors
// the rest into its registry, says in each object's status whether it
// took it (an overlap with another pool, a missing password Secret: with
// the reason), how much of a pool is in use and how many sessions a peer
// has, as kubectl get shows them; deleting an object removes it.
func TestCustomResourcesOnARealAPIServer(t *testing.T) {
	setDuring(t, &kubernetes.RetryPeriod, 200*time.Millisecond)
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	create := func(resource schema.GroupVersionResource, doc string) error {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		_, err := dyn.Resource(resource).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
		return err
	}
	pool := func(name, spec string) string {
		return "apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: " + name + "\nspec:\n" + spec
	}
	peer := func(name, spec string) string {
		return "apiVersion: weir.dev/v1alpha1\nkind: WeirBGPPeer\nmetadata:\n  name: " + name + "\nspec:\n" + spec
	}

	// Refused by the apiserver, the field named.
	for _, tc := range []struct {
		res        schema.GroupVersionResource
		doc, field string
	}{
		{v1alpha1.AddressPools, pool("bad-cidr", "  addresses: [203.0.113.0/33]\n"), "spec.addresses"},
		{v1alpha1.AddressPools, pool("mixed-range", "  addresses: [203.0.113.1-2001:db8::1]\n"), "spec.addresses"},
		{v1alpha1.AddressPools, pool("no-addresses", "  addresses: []\n"), "spec.addresses"},
		{v1alpha1.AddressPools, pool("both", "  addresses: [203.0.113.0/28]\n  bgpAdvertisement: {}\n  l2Advertisement: {}\n"), "by its bgpAdvertisements"},
		{v1alpha1.AddressPools, pool("bad-iface", "  addresses: [203.0.113.0/28]\n  l2Advertisement:\n    interfaces: [eth0/1]\n"), "spec.l2Advertisement.interfaces[0]"},
		{v1alpha1.AddressPools, pool("bad-community", "  addresses: [203.0.113.0/28]\n  bgpAdvertisement:\n    communities: [\"65536\"]\n"), "spec.bgpAdvertisement.communities[0]"},
		{v1alpha1.AddressPools, pool("long-aggregate", "  addresses: [203.0.113.0/28]\n  bgpAdvertisement:\n    aggregationLength: 33\n"), "spec.bgpAdvertisement.aggregationLength"},
		{v1alpha1.AddressPools, pool("one-and-several", "  addresses: [203.0.113.0/28]\n  bgpAdvertisement: {}\n  bgpAdvertisements: [{}]\n"), "bgpAdvertisements is exclusive"},
		{v1alpha1.AddressPools, pool("bad-several", "  addresses: [203.0.113.0/28]\n  bgpAdvertisements:\n  - communities: [\"65536\"]\n"), "spec.bgpAdvertisements[0].communities[0]"},
		{v1alpha1.BGPPeers, peer("bad-address", "  address: router.example\n  asn: 64500\n  myASN: 64512\n"), "spec.address"},
		{v1alpha1.BGPPeers, peer("bad-hold", "  address: 192.0.2.1\n  asn: 64500\n  myASN: 64512\n  holdTimeSeconds: 2\n"), "spec.holdTimeSeconds"},
		{v1alpha1.BGPPeers, peer("no-asn", "  address: 192.0.2.1\n  myASN: 64512\n"), "spec.asn"},
	} {
		err := create(tc.res, tc.doc)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v; want a refusal naming %s", strings.SplitN(tc.doc, "name: ", 2)[1][:12], err, tc.field)
		}
	}

	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.AnnouncePeriod = 100 * time.Millisecond
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default", Classes: kubernetes.Classes{Default: true}}
	})
	if err := create(v1alpha1.AddressPools, pool("public", "  addresses: [203.0.113.220/31, \"2001:db8::/120\"]\n  bgpAdvertisement:\n    communities: [\"64512:100\"]\n")); err != nil {
		t.Fatal(err)
	}
	if err := create(v1alpha1.AddressPools, pool("other", "  addresses: [198.51.100.0/28]\n  autoAssign: false\n")); err != nil {
		t.Fatal(err)
	}
	// Of two overlapping pools the older is held, the name breaking a tie
	// of creation times (whole seconds): overlap is made a second later.
	time.Sleep(1100 * time.Millisecond)
	if err := create(v1alpha1.AddressPools, pool("overlap", "  addresses: [203.0.113.221-203.0.113.222]\n")); err != nil {
		t.Fatal(err)
	}
	if err := create(v1alpha1.BGPPeers, peer("tor-a", "  address: 192.0.2.1\n  asn: 64500\n  myASN: 64512\n  passwordSecretRef:\n    name: tor-a\n")); err != nil {
		t.Fatal(err)
	}
	get := func(res schema.GroupVersionResource, name string) *unstructured.Unstructured {
		u, err := dyn.Resource(res).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	condition := func(u *unstructured.Unstructured) (status, message string) {
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == kubernetes.ConditionAccepted {
				return m["status"].(string), m["message"].(string)
			}
		}
		return "", ""
	}
	eventually(t, 15*time.Second, func() error {
		got, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "public"})
		if err != nil {
			return err
		}
		if c := got.GetAddressPool().GetBgpAdvertisement().GetCommunities(); len(c) != 1 || c[0] != "64512:100" {
			return fmt.Errorf("pool public in the registry: %v", got)
		}
		if st, msg := condition(get(v1alpha1.AddressPools, "public")); st != "True" {
			return fmt.Errorf("public's Accepted: %s %s", st, msg)
		}
		if st, msg := condition(get(v1alpha1.AddressPools, "overlap")); st != "False" || !strings.Contains(msg, "overlaps pool public") {
			return fmt.Errorf("overlap's Accepted: %s %q; want False, overlapping public", st, msg)
		}
		if st, msg := condition(get(v1alpha1.BGPPeers, "tor-a")); st != "False" || !strings.Contains(msg, "spec.passwordSecretRef: no Secret default/tor-a") {
			return fmt.Errorf("tor-a's Accepted: %s %q; want False, no Secret", st, msg)
		}
		return nil
	})

	// Several advertisements with selectors, avoidBuggyIPs and a
	// namespace selector reach the registry; a service selector with an
	// aggregate is refused by the server, naming the field.
	if err := create(v1alpha1.AddressPools, pool("split", "  addresses: [198.51.100.64/28]\n  avoidBuggyIPs: true\n"+
		"  serviceAllocation:\n    namespaceSelector: {tenant: a}\n  bgpAdvertisements:\n"+
		"  - serviceSelector: {env: prod}\n    communities: [\"64512:1\"]\n  - nodeSelector: {rack: r1}\n    serviceSelector: {env: dev}\n    localPreference: 4000000000\n")); err != nil {
		t.Fatal(err)
	}
	if err := create(v1alpha1.AddressPools, pool("aggregated-split", "  addresses: [198.51.100.128/28]\n  bgpAdvertisements:\n  - serviceSelector: {env: prod}\n    aggregationLength: 28\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		got, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "split"})
		if err != nil {
			return err
		}
		p := got.GetAddressPool()
		advs := p.GetBgpAdvertisements()
		if !p.GetAvoidBuggyIps() || p.GetServiceAllocation().GetNamespaceSelector()["tenant"] != "a" || len(advs) != 2 ||
			advs[0].GetServiceSelector()["env"] != "prod" || advs[0].GetCommunities()[0] != "64512:1" ||
			advs[1].GetNodeSelector()["rack"] != "r1" || advs[1].GetLocalPreference() != 4000000000 {
			return fmt.Errorf("pool split in the registry: %v", p)
		}
		if st, msg := condition(get(v1alpha1.AddressPools, "aggregated-split")); st != "False" || !strings.Contains(msg, "spec.bgp_advertisements[0].service_selector") {
			return fmt.Errorf("aggregated-split's Accepted: %s %q; want False, naming the service selector", st, msg)
		}
		return nil
	})
	// The Secret comes: the peer is taken, with its password.
	if _, err := kc.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tor-a"},
		Data: map[string][]byte{"password": []byte("s3cret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		if st, msg := condition(get(v1alpha1.BGPPeers, "tor-a")); st != "True" {
			return fmt.Errorf("tor-a's Accepted: %s %s", st, msg)
		}
		return nil
	})
	if _, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "tor-a"}); err != nil {
		t.Errorf("tor-a not in the registry: %v", err)
	}

	// A Service takes an address: the pool's columns count it.
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		row, err := tableRow(ctx, kc, v1alpha1.AddressPools.Resource, "public")
		if err != nil {
			return err
		}
		if want := "Mode=BGP IPv4 In Use=1 IPv4 Free=1 IPv6 In Use=0 IPv6 Free=256 Accepted=True"; !strings.Contains(row, want) {
			return fmt.Errorf("kubectl get weiraddresspools public: %s; want %s", row, want)
		}
		return nil
	})
	// An L2 pool announced over BGP too (MetalLB's pool with both kinds
	// of advertisement) is taken, its mode saying both.
	if err := create(v1alpha1.AddressPools, pool("lan", "  addresses: [192.0.2.200/30]\n  l2Advertisement: {nodeSelector: {rack: a}}\n  bgpAdvertisements:\n  - nodeSelector: {rack: b}\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		row, err := tableRow(ctx, kc, v1alpha1.AddressPools.Resource, "lan")
		if err != nil {
			return err
		}
		if want := "Mode=L2+BGP IPv4 In Use=0 IPv4 Free=4"; !strings.Contains(row, want) {
			return fmt.Errorf("kubectl get weiraddresspools lan: %s; want %s", row, want)
		}
		return nil
	})
	row, err := tableRow(ctx, kc, v1alpha1.BGPPeers.Resource, "tor-a")
	if err != nil || !strings.Contains(row, "Address=192.0.2.1 Interface=<nil> ASN=64500 My ASN=64512 Sessions=0 Established=0 Accepted=True") {
		t.Errorf("kubectl get weirbgppeers tor-a: %s, %v", row, err)
	}

	// Deleting public lets overlap in; deleting a peer removes it.
	if err := dyn.Resource(v1alpha1.AddressPools).Delete(ctx, "public", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(v1alpha1.BGPPeers).Delete(ctx, "tor-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		if st, msg := condition(get(v1alpha1.AddressPools, "overlap")); st != "True" {
			return fmt.Errorf("overlap's Accepted after public went: %s %s", st, msg)
		}
		if _, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "tor-a"}); err == nil {
			return fmt.Errorf("tor-a still in the registry")
		}
		return nil
	})

	// An update the server refuses (onto the older pool other's
	// addresses) leaves the version it took in force, and says so.
	u := get(v1alpha1.AddressPools, "overlap")
	unstructured.SetNestedStringSlice(u.Object, []string{"203.0.113.221-203.0.113.222", "198.51.100.5/32"}, "spec", "addresses")
	if _, err := dyn.Resource(v1alpha1.AddressPools).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		if st, msg := condition(get(v1alpha1.AddressPools, "overlap")); st != "False" || !strings.Contains(msg, "overlaps pool other (the last version taken stays in force)") {
			return fmt.Errorf("overlap's Accepted after a refused update: %s %q", st, msg)
		}
		return nil
	})
	got, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "overlap"})
	if err != nil || len(got.GetAddressPool().GetAddresses()) != 1 {
		t.Errorf("the registry's overlap after a refused update: %v, %v; want the version taken before", got, err)
	}
}

// tableRow is the row kubectl get prints for a weir.dev object, as
// "Column=value" pairs: the apiserver's server-side table, which the
// CRD's printer columns make.
func tableRow(ctx context.Context, kc clientset.Interface, resource, name string) (string, error) {
	var table metav1.Table
	err := kc.Discovery().RESTClient().Get().AbsPath("/apis/weir.dev/v1alpha1", resource, name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(&table)
	if err != nil {
		return "", err
	}
	if len(table.Rows) != 1 {
		return "", fmt.Errorf("%d rows", len(table.Rows))
	}
	var cells []string
	for i, col := range table.ColumnDefinitions {
		cells = append(cells, fmt.Sprintf("%s=%v", col.Name, table.Rows[0].Cells[i]))
	}
	return strings.Join(cells, " "), nil
}

// TestConvertedMetalLBIsAccepted: lbctl convert metallb --to crds of the
// example covering every MetalLB kind applies to a real apiserver (the
// CRDs' rules pass it), and the server takes every pool and peer, the
// password through its Secret.
func TestConvertedMetalLBIsAccepted(t *testing.T) {
	setDuring(t, &kubernetes.RetryPeriod, 200*time.Millisecond)
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	data, err := os.ReadFile("../lbctl/convert/testdata/metallb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := convert.FromMetalLB(string(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := convert.CustomResources(r.Pools, r.Peers, "default")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, doc := range strings.Split(out, "---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: obj}
		switch u.GetKind() {
		case "Secret":
			var s corev1.Secret
			if err := yaml.Unmarshal([]byte(doc), &s); err != nil {
				t.Fatal(err)
			}
			_, err = kc.CoreV1().Secrets(s.Namespace).Create(ctx, &s, metav1.CreateOptions{})
		case v1alpha1.AddressPoolKind:
			_, err = dyn.Resource(v1alpha1.AddressPools).Create(ctx, u, metav1.CreateOptions{})
			names = append(names, v1alpha1.AddressPools.Resource+"/"+u.GetName())
		case v1alpha1.BGPPeerKind:
			_, err = dyn.Resource(v1alpha1.BGPPeers).Create(ctx, u, metav1.CreateOptions{})
			names = append(names, v1alpha1.BGPPeers.Resource+"/"+u.GetName())
		default:
			t.Fatalf("converted a %s", u.GetKind())
		}
		if err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if len(names) != 6 {
		t.Fatalf("converted %v; want 4 pools and 2 peers", names)
	}
	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.AnnouncePeriod = 100 * time.Millisecond
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default"}
	})
	eventually(t, 15*time.Second, func() error {
		for _, n := range names {
			res, name, _ := strings.Cut(n, "/")
			u, err := dyn.Resource(v1alpha1.GroupVersion.WithResource(res)).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			if len(conds) != 1 || conds[0].(map[string]any)["status"] != "True" {
				return fmt.Errorf("%s: conditions %v", n, conds)
			}
		}
		return nil
	})
	if _, err := ts.Registry.GetBgpPeer(ctx, &weirv1.GetBgpPeerRequest{Name: "tor-a"}); err != nil {
		t.Error(err)
	}
}

// TestAdmissionRefusesWhatTheServerWould: with the server's admission
// webhook registered, kubectl apply is refused at once, the field named,
// for what only the server can tell: a pool overlapping another, a
// password Secret that does not exist.
func TestAdmissionRefusesWhatTheServerWould(t *testing.T) {
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	ts := servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "default"}
	})
	// The webhook, over TLS on loopback, with a certificate of its own.
	dir := t.TempDir()
	if err := certs.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := certs.IssueServer(dir, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(kubernetes.AdmissionPath, ts.Server.Admission())
	hs := &http.Server{Handler: mux}
	go hs.Serve(lis)
	defer hs.Close()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	registerWebhook(t, ctx, kc, lis.Addr().String(), caPEM)
	create := func(res schema.GroupVersionResource, doc string, dryRun bool) error {
		return createDoc(t, ctx, dyn, res, doc, dryRun)
	}
	if err := create(v1alpha1.AddressPools, "apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: public\nspec:\n  addresses: [203.0.113.0/28]\n", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, func() error {
		_, err := ts.Registry.GetAddressPool(ctx, &weirv1.GetAddressPoolRequest{Name: "public"})
		return err
	})
	// The apiserver learns of the webhook within a moment: dry runs until
	// it answers.
	for _, tc := range []struct {
		res       schema.GroupVersionResource
		doc, want string
	}{
		{v1alpha1.AddressPools, "apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: overlap\nspec:\n  addresses: [198.51.100.0/28, 203.0.113.8-203.0.113.20]\n",
			"spec.addresses[1]: 203.0.113.8-203.0.113.20 overlaps pool public"},
		{v1alpha1.BGPPeers, "apiVersion: weir.dev/v1alpha1\nkind: WeirBGPPeer\nmetadata:\n  name: tor-a\nspec:\n  address: 192.0.2.1\n  asn: 64500\n  myASN: 64512\n  passwordSecretRef:\n    name: tor-a\n",
			"spec.passwordSecretRef: no Secret default/tor-a"},
	} {
		eventually(t, 15*time.Second, func() error {
			if err := create(tc.res, tc.doc, true); err == nil || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("dry run: %v; want a refusal with %q", err, tc.want)
			}
			return nil
		})
		if err := create(tc.res, tc.doc, false); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create: %v; want a refusal with %q", err, tc.want)
		}
	}
	// What the server takes passes.
	if err := create(v1alpha1.AddressPools, "apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: other\nspec:\n  addresses: [198.51.100.0/28]\n", false); err != nil {
		t.Errorf("a pool the server takes: %v", err)
	}
}

// registerWebhook registers the ValidatingWebhookConfiguration weir.dev
// for the server's webhook at addr, trusted with caPEM, as the manifests
// do but with failurePolicy Fail: a write the webhook does not answer
// fails.
func registerWebhook(t *testing.T, ctx context.Context, kc clientset.Interface, addr string, caPEM []byte) {
	t.Helper()
	url := "https://" + addr + kubernetes.AdmissionPath
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	if _, err := kc.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "weir.dev"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "validate.weir.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"weir.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{v1alpha1.AddressPools.Resource, v1alpha1.BGPPeers.Resource}},
			}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestGettingStartedCustomResources follows docs/kubernetes.md's
// custom resources on a clean apiserver: its WeirAddressPool and WeirBGPPeer (the
// password's Secret made first) are taken, a Service gets the pool's first
// address and an IPAllocated Event, and kubectl get weiraddresspools counts it.
func TestGettingStartedCustomResources(t *testing.T) {
	doc, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Pools and peers as custom resources")
	_, block, ok2 := strings.Cut(section, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/kubernetes.md has no yaml block under \"Pools and peers as custom resources\"")
	}
	c, kc, dyn := startKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRDs(t, ctx, dyn)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "weir-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Secrets("weir-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rack-router-password"},
		StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pools, peers []string
	for _, d := range strings.Split(block, "---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: obj}
		res := v1alpha1.AddressPools
		if u.GetKind() == v1alpha1.BGPPeerKind {
			res, peers = v1alpha1.BGPPeers, append(peers, u.GetName())
		} else {
			pools = append(pools, u.GetName())
		}
		if _, err := dyn.Resource(res).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the documented %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if len(pools) != 1 || len(peers) != 1 {
		t.Fatalf("the documented block has pools %v and peers %v; want one of each", pools, peers)
	}
	servertest.Start(t, t.TempDir(), func(cfg *server.Config) {
		cfg.AnnouncePeriod = 100 * time.Millisecond
		cfg.Kubernetes = &kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: "weir-system", Classes: kubernetes.Classes{Default: true}}
	})
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		svc, err := kc.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ing := svc.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != "203.0.113.10" {
			return fmt.Errorf("web's ingress %v; want the pool's first address", ing)
		}
		events, err := kc.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "web" && e.Reason == kubernetes.EventIPAllocated && e.Note == "Assigned IP 203.0.113.10"
		}) {
			return fmt.Errorf("no IPAllocated Event on web")
		}
		row, err := tableRow(ctx, kc, v1alpha1.AddressPools.Resource, pools[0])
		if err != nil || !strings.Contains(row, "Mode=BGP IPv4 In Use=1 IPv4 Free=9 IPv6 In Use=0 IPv6 Free=10 Accepted=True") {
			return fmt.Errorf("kubectl get weiraddresspools: %s, %v", row, err)
		}
		row, err = tableRow(ctx, kc, v1alpha1.BGPPeers.Resource, peers[0])
		if err != nil || !strings.Contains(row, "Accepted=True") {
			return fmt.Errorf("kubectl get weirbgppeers: %s, %v", row, err)
		}
		return nil
	})
}

// createDoc creates the YAML document doc as a res, only validating it
// (webhook included) with dryRun.
func createDoc(t *testing.T, ctx context.Context, dyn dynamic.Interface, res schema.GroupVersionResource, doc string, dryRun bool) error {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := dyn.Resource(res).Create(ctx, &unstructured.Unstructured{Object: obj}, opts)
	return err
}
