package deploy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	weirkube "github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/test/kubeapi"
)

// TestHelmTemplateNeedsNoFlags: `helm template` with no flags renders the
// chart (Helm then assumes its offline default, Kubernetes v1.20.0, which
// is no cluster), while a cluster older than 1.31 is refused, saying so.
func TestHelmTemplateNeedsNoFlags(t *testing.T) {
	if _, err := tryHelm(t, "template", "weir", chart); err != nil {
		t.Errorf("helm template with no flags: %v", err)
	}
	for _, v := range []string{"v1.30.0", "v1.29.4"} {
		_, err := tryHelm(t, "template", "weir", chart, "--kube-version", v)
		if err == nil || !strings.Contains(err.Error(), "Weir needs Kubernetes 1.31 or later") || !strings.Contains(err.Error(), v) {
			t.Errorf("helm template for Kubernetes %s: %v; want refused, naming the version", v, err)
		}
	}
	if _, err := tryHelm(t, "template", "weir", chart, "--kube-version", "v1.31.0"); err != nil {
		t.Errorf("helm template for Kubernetes v1.31.0: %v", err)
	}
}

// TestHelmValuesSchema: the chart's values.schema.json takes the defaults
// and values of the right kinds, and refuses a typo or a value of the
// wrong kind, naming it, before anything is rendered.
func TestHelmValuesSchema(t *testing.T) {
	for _, set := range [][]string{
		nil,
		{"bgp.asn=64512", "bgp.peers=192.0.2.1/64500\\,[2001:db8::1]:179/64500", "server.replicas=1", "image.pullPolicy=Never", "webhook.allowedCIDRs={192.0.2.10/32,2001:db8::10/128}"},
		{"bgp.asn=", "serviceCIDR=10.96.0.0/12\\,fd00:96::/112", "defaultLoadBalancer=true"},
	} {
		args := []string{"template", "weir", chart, "--kube-version", kubeVersion}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if _, err := tryHelm(t, args...); err != nil {
			t.Errorf("--set %v: %v; want taken", set, err)
		}
	}
	for _, tc := range []struct{ set, says string }{
		{"replicas=three", "additional properties 'replicas' not allowed"},
		{"defaultLoadBalacer=false", "additional properties 'defaultLoadBalacer' not allowed"},
		{"server.replicas=three", "/server/replicas"},
		{"server.replicas=0", "/server/replicas"},
		{"server.replica=2", "additional properties 'replica' not allowed"},
		{"defaultLoadBalancer=maybe", "/defaultLoadBalancer"},
		{"image.pullPolicy=Sometimes", "/image/pullPolicy"},
		{"clusterCIDR=10.244.0.0", "/clusterCIDR"},
		{"bgp.asn=AS64512", "/bgp/asn"},
		{"bgp.peers=192.0.2.1", "/bgp/peers"},
		{"loadBalancerClass=weir", "/loadBalancerClass"},
		{"webhook.allowedCIDRs={192.0.2.10}", "/webhook/allowedCIDRs/0"},
	} {
		_, err := tryHelm(t, "template", "weir", chart, "--kube-version", kubeVersion, "--set", tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("--set %s: %v; want refused, saying %q", tc.set, err, tc.says)
		}
	}
}

// TestDefaultsAssignNothing: as shipped (chart and plain manifests alike)
// Weir declares no pool and no peer, so it assigns and announces nothing
// until told to, and leaves class-less Services to the cluster's other
// load-balancer controller.
func TestDefaultsAssignNothing(t *testing.T) {
	for what, objs := range map[string]map[string]*unstructured.Unstructured{"the chart": render(t), "deploy/kubernetes": byName(manifests(t))} {
		if objs["ConfigMap/weir-resources"] != nil {
			t.Errorf("%s ships pools or peers (weir-resources)", what)
		}
		config, _, _ := unstructured.NestedStringMap(objs["ConfigMap/weir-config"].Object, "data")
		if config["WEIR_DEFAULT_LOAD_BALANCER"] != "false" || config["WEIR_BGP_PEERS"] != "" || config["WEIR_ALLOWED_EXTERNAL_IP_CIDRS"] != "" {
			t.Errorf("%s: WEIR_DEFAULT_LOAD_BALANCER %q, WEIR_BGP_PEERS %q, WEIR_ALLOWED_EXTERNAL_IP_CIDRS %q; want false, none and none", what,
				config["WEIR_DEFAULT_LOAD_BALANCER"], config["WEIR_BGP_PEERS"], config["WEIR_ALLOWED_EXTERNAL_IP_CIDRS"])
		}
		for name, o := range objs {
			if o.GetKind() == "AddressPool" || o.GetKind() == "BGPPeer" {
				t.Errorf("%s ships %s", what, name)
			}
		}
		containers, _, _ := unstructured.NestedSlice(objs["Deployment/weir-server"].Object, "spec", "template", "spec", "containers")
		if args := fmt.Sprint(containers[0].(map[string]any)["args"]); strings.Contains(args, "--resources-file") {
			t.Errorf("%s: the server reads a resources file: %s", what, args)
		}
	}
}

// helmOn runs helm against the apiserver c, in the namespace weir-system;
// no kubelet runs there, so nothing waits for pods.
func helmOn(t *testing.T, c *kubeapi.Cluster, args ...string) error {
	t.Helper()
	_, err := tryHelm(t, append(args, "--namespace", "weir-system", "--kubeconfig", c.Kubeconfig)...)
	return err
}

// restConfig is a client configuration for c.
func restConfig(t *testing.T, c *kubeapi.Cluster) *rest.Config {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// withImageTag is objs with every container image of theirs at tag.
func withImageTag(objs []*unstructured.Unstructured, tag string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		o = withoutImageTags(o)
		for _, field := range []string{"initContainers", "containers"} {
			containers, found, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			if !found {
				continue
			}
			for _, c := range containers {
				c.(map[string]any)["image"] = c.(map[string]any)["image"].(string) + ":" + tag
			}
			unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", field)
		}
		out = append(out, o)
	}
	return out
}

// TestUpgradesChangeTheImages: on a real apiserver, `helm upgrade` to new
// images, then `helm rollback`, go through, and so does applying
// deploy/kubernetes again with other image tags (kubectl apply -k after a
// tag change): nothing the chart or the manifests make is immutable in
// what an upgrade changes.
func TestUpgradesChangeTheImages(t *testing.T) {
	ctx, c := startAPI(t)
	if err := helmOn(t, c, "install", "weir", chart, "--create-namespace", "--set", "image.tag=v1"); err != nil {
		t.Fatal(err)
	}
	if err := helmOn(t, c, "upgrade", "weir", chart, "--set", "image.tag=v2"); err != nil {
		t.Errorf("helm upgrade to image tag v2: %v", err)
	}
	if err := helmOn(t, c, "rollback", "weir", "1"); err != nil {
		t.Errorf("helm rollback to image tag v1: %v", err)
	}
	rc := restConfig(t, c)
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	deploy, err := dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).Namespace("weir-system").Get(ctx, "weir-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := images(deploy); slices.ContainsFunc(got, func(img string) bool { return !strings.HasSuffix(img, ":v1") }) {
		t.Errorf("after the rollback the server runs %v; want tag v1 throughout", got)
	}

	// The plain manifests, in a namespace of their own name on another
	// apiserver: applied, then applied again with other tags.
	_, plain := startAPI(t)
	prc := restConfig(t, plain)
	for _, tag := range []string{"v1", "v2", "v1"} {
		for _, err := range apply(ctx, t, prc, withImageTag(manifests(t), tag)) {
			t.Errorf("deploy/kubernetes with image tag %s: %v", tag, err)
		}
	}
}

// TestUninstallLeavesNothing: on a real apiserver, `helm uninstall` and
// deleting what deploy/kubernetes lists (kubectl delete -k) remove every
// object installed, cluster-scoped ones too, and the certificate Secrets
// the server's init container made are owned by an object deleted with
// them, so the garbage collector removes them. The CRDs and the
// namespace stay, as Helm keeps them (crds/, --create-namespace).
func TestUninstallLeavesNothing(t *testing.T) {
	ctx, c := startAPI(t)
	rc := restConfig(t, c)
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if err := helmOn(t, c, "install", "weir", chart, "--create-namespace", "--set", "webhook.allowedCIDRs={192.0.2.10/32}", "--set", "monitoring.enabled=false"); err != nil {
		t.Fatal(err)
	}
	bootstrapAsTheServerPod(ctx, t, kc)
	if err := helmOn(t, c, "uninstall", "weir"); err != nil {
		t.Fatal(err)
	}
	for _, o := range leftovers(ctx, t, rc) {
		t.Errorf("after helm uninstall: %s", o)
	}

	_, plain := startAPI(t)
	prc := restConfig(t, plain)
	pkc, err := kubernetes.NewForConfig(prc)
	if err != nil {
		t.Fatal(err)
	}
	objs := manifests(t)
	for _, err := range apply(ctx, t, prc, objs) {
		t.Fatal(err)
	}
	bootstrapAsTheServerPod(ctx, t, pkc)
	dyn, mapper := dynamicClients(t, prc)
	for _, o := range slices.Backward(objs) {
		if o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition" {
			continue // left for the check below, as after helm uninstall
		}
		client, err := resourceFor(dyn, mapper, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	for _, o := range leftovers(ctx, t, prc) {
		t.Errorf("after deleting what deploy/kubernetes lists: %s", o)
	}
}

// bootstrapAsTheServerPod makes the certificate Secrets as the server
// pods' init container does (no kubelet runs the pods here), and checks
// it was allowed to, as the server's ServiceAccount.
func bootstrapAsTheServerPod(ctx context.Context, t *testing.T, kc kubernetes.Interface) {
	t.Helper()
	owner, err := weirkube.ServiceAccountOwner(ctx, kc, "weir-system", "weir-server")
	if err != nil {
		t.Fatal(err)
	}
	made, err := weirkube.BootstrapSecrets(ctx, kc, "weir-system", nil, owner)
	if err != nil || len(made) != 5 {
		t.Fatalf("the certificate Secrets: made %v, %v", made, err)
	}
}

// leftovers lists what remains of an installation: every object of the
// namespace weir-system, and the cluster-scoped objects named weir (but
// the CRDs and the namespace), that no garbage collection is about to
// delete (an object some of whose owners are gone is).
func leftovers(ctx context.Context, t *testing.T, rc *rest.Config) []string {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, mapper := dynamicClients(t, rc)
	lists, err := dc.ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			// The CRDs stay, and the APIService the apiserver serves their
			// group with; Events and deprecated kinds are no installation's.
			if !slices.Contains(r.Verbs, "list") || slices.Contains([]string{"Namespace", "CustomResourceDefinition", "APIService", "Event", "ComponentStatus", "Endpoints"}, r.Kind) {
				continue
			}
			var client dynamic.ResourceInterface = dyn.Resource(gv.WithResource(r.Name))
			if r.Namespaced {
				client = dyn.Resource(gv.WithResource(r.Name)).Namespace("weir-system")
			}
			objs, err := client.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, o := range objs.Items {
				if !r.Namespaced && !strings.Contains(o.GetName(), "weir") {
					continue
				}
				if collected(ctx, t, dyn, mapper, &o) {
					continue
				}
				out = append(out, fmt.Sprintf("%s %s/%s", r.Kind, o.GetNamespace(), o.GetName()))
			}
		}
	}
	return out
}

// collected reports whether the garbage collector deletes o: it has
// owners, and all of them are gone.
func collected(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) bool {
	t.Helper()
	refs := o.GetOwnerReferences()
	for _, ref := range refs {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			t.Fatal(err)
		}
		m, err := mapper.RESTMapping(schema.GroupKind{Group: gv.Group, Kind: ref.Kind}, gv.Version)
		if err != nil {
			t.Fatal(err)
		}
		var client dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			client = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		owner, err := client.Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Fatal(err)
		case owner.GetUID() == ref.UID:
			return false // an owner lives: o stays
		}
	}
	return len(refs) > 0
}

// TestCertificatesInitContainer: the server's init container makes the
// Secrets owned by the server's own ServiceAccount (the one its Role
// lets it read), and waits for exactly the folders where the server's
// container mounts them, from Secret volumes that are optional (else the
// pod would wait for the Secrets before running the container that
// makes them); without the bootstrap, the volumes are required again.
func TestCertificatesInitContainer(t *testing.T) {
	for what, objs := range map[string]map[string]*unstructured.Unstructured{"the chart": render(t), "deploy/kubernetes": byName(manifests(t))} {
		pod, _, _ := unstructured.NestedMap(objs["Deployment/weir-server"].Object, "spec", "template", "spec")
		inits, _ := pod["initContainers"].([]any)
		if len(inits) != 1 {
			t.Errorf("%s: init containers %v; want weir-certs", what, inits)
			continue
		}
		args := fmt.Sprint(inits[0].(map[string]any)["args"])
		if want := "--owner-service-account=" + pod["serviceAccountName"].(string); !strings.Contains(args, want) {
			t.Errorf("%s: weir-certs args %s; want %s", what, args, want)
		}
		optional := map[string]bool{} // volume: optional Secret
		for _, v := range pod["volumes"].([]any) {
			if sec, ok := v.(map[string]any)["secret"].(map[string]any); ok {
				optional[v.(map[string]any)["name"].(string)] = sec["optional"] == true
			}
		}
		var waited []string
		for _, m := range pod["containers"].([]any)[0].(map[string]any)["volumeMounts"].([]any) {
			m := m.(map[string]any)
			if name := m["name"].(string); name == "tls" || name == "webhook-tls" {
				waited = append(waited, m["mountPath"].(string))
				if !optional[name] {
					t.Errorf("%s: the Secret volume %s is required: the pod would never start the init container that makes it", what, name)
				}
			}
		}
		if want := "--wait-mounted=" + strings.Join(waited, ","); !strings.Contains(args, want) {
			t.Errorf("%s: weir-certs args %s; want %s, the server container's certificate folders", what, args, want)
		}
	}
	volumes, _, _ := unstructured.NestedSlice(render(t, "certificates.bootstrap=false")["Deployment/weir-server"].Object, "spec", "template", "spec", "volumes")
	for _, v := range volumes {
		if sec, ok := v.(map[string]any)["secret"].(map[string]any); ok && sec["optional"] != nil {
			t.Errorf("certificates.bootstrap false: the Secret volume %v is optional; the Secrets are the operator's to make first", v)
		}
	}
}
