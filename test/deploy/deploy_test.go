// Package deploy validates what Weir ships for deployment: the Kubernetes
// manifests, by server-side apply to a real kube-apiserver, and the systemd
// units, by systemd-analyze verify.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/weirlb/weir/server/resourcefile"
	"github.com/weirlb/weir/test/kubeapi"
	"github.com/weirlb/weir/test/weirlab"
)

func root(t *testing.T) string {
	t.Helper()
	r, err := weirlab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// manifests reads the files kustomization.yaml lists, in its order.
func manifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir := filepath.Join(root(t), "deploy", "kubernetes")
	var k struct {
		Resources []string `json:"resources"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	crds, _ := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	files = append(files, crds...)
	if len(files)-1 != len(k.Resources) {
		t.Errorf("kustomization.yaml lists %d files, the folder has %d manifests", len(k.Resources), len(files)-1)
	}
	var out []*unstructured.Unstructured
	for _, f := range k.Resources {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decodeObjects(t, f, data)...)
	}
	return out
}

// decodeObjects reads a YAML stream of objects.
func decodeObjects(t *testing.T, label string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if obj == nil {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
	return out
}

// TestManifestsApplyAsWritten server-side applies every manifest to a real
// apiserver (the schema) and reads each object back: every field written
// must be there with the value written.
func TestManifestsApplyAsWritten(t *testing.T) {
	objs := manifests(t)
	if len(objs) < 8 {
		t.Fatalf("only %d objects in the manifests", len(objs))
	}
	ctx, rc := applyAll(t, objs)
	checkServerAccess(ctx, t, rc)
}

// applyAll server-side applies objs to a new real apiserver (in a
// namespace weir-system made first when objs have none) and reads each
// back: every field written must be there with the value written. It
// returns the apiserver's client configuration, for more checks.
func applyAll(t *testing.T, objs []*unstructured.Unstructured) (context.Context, *rest.Config) {
	t.Helper()
	ctx, c := startAPI(t)
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" }) {
		ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "weir-system"}}}
		objs = append([]*unstructured.Unstructured{ns}, objs...)
	}
	for _, err := range apply(ctx, t, rc, objs) {
		t.Error(err)
	}
	return ctx, rc
}

// startAPI starts a real apiserver for the test, and a context bounding
// the test's work on it.
func startAPI(t *testing.T) (context.Context, *kubeapi.Cluster) {
	t.Helper()
	kubeapi.SkipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	// As kubeadm's apiserver: the agents run privileged, as kube-proxy.
	c, err := kubeapi.Start(ctx, "--allow-privileged=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return ctx, c
}

// dynamicClients are a dynamic client and a mapper of kinds to resources
// for the apiserver of rc.
func dynamicClients(t *testing.T, rc *rest.Config) (*dynamic.DynamicClient, *restmapper.DeferredDiscoveryRESTMapper) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

// resourceFor is the client of obj's resource, in obj's namespace.
func resourceFor(dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	ri := dyn.Resource(m.Resource)
	if obj.GetNamespace() != "" {
		return ri.Namespace(obj.GetNamespace()), nil
	}
	return ri, nil
}

// apply server-side applies objs, in order, as kubectl apply
// --server-side does, and reads each back: every field written must be
// there with the value written. It returns what failed.
func apply(ctx context.Context, t *testing.T, rc *rest.Config, objs []*unstructured.Unstructured) []error {
	t.Helper()
	dyn, mapper := dynamicClients(t, rc)
	var errs []error
	for _, obj := range objs {
		name := fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
		client, err := resourceFor(dyn, mapper, obj)
		if err != nil {
			// A kind of a CRD applied just before: ask discovery again.
			mapper.Reset()
			if client, err = resourceFor(dyn, mapper, obj); err != nil {
				t.Fatal(err)
			}
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1ApplyOptions()); err != nil {
			errs = append(errs, fmt.Errorf("server-side apply of %s: %w", name, err))
			continue
		}
		live, err := client.Get(ctx, obj.GetName(), getOptions())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s after apply: %w", name, err))
			continue
		}
		if path, ok := subset(obj.Object, live.Object, ""); !ok {
			errs = append(errs, fmt.Errorf("%s: %s differs from what the manifest says", name, path))
		}
	}
	return errs
}

// checkServerAccess asks the apiserver's RBAC whether the server's
// ServiceAccount may do what the server does, and no more than it needs
// of Leases.
func checkServerAccess(ctx context.Context, t *testing.T, rc *rest.Config) {
	t.Helper()
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	checkAccess(ctx, t, kc, "weir-server", []access{
		{authorizationv1.ResourceAttributes{Verb: "watch", Resource: "services"}, true},
		{authorizationv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Namespace: "shop", Resource: "services", Subresource: "status"}, true},
		{authorizationv1.ResourceAttributes{Verb: "patch", Namespace: "shop", Resource: "services", Subresource: "status"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Namespace: "shop", Resource: "services"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Namespace: "shop", Group: "events.k8s.io", Resource: "events"}, true},
		{authorizationv1.ResourceAttributes{Verb: "patch", Namespace: "shop", Group: "events.k8s.io", Resource: "events"}, true},
		{authorizationv1.ResourceAttributes{Verb: "delete", Namespace: "shop", Group: "events.k8s.io", Resource: "events"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Namespace: "weir-system", Group: "coordination.k8s.io", Resource: "leases"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "weir-system", Group: "coordination.k8s.io", Resource: "leases", Name: "weir-server"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Namespace: "weir-system", Group: "coordination.k8s.io", Resource: "leases", Name: "weir-server"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Namespace: "weir-system", Group: "coordination.k8s.io", Resource: "leases", Name: "someone-else"}, false},
		{authorizationv1.ResourceAttributes{Verb: "update", Namespace: "kube-system", Group: "coordination.k8s.io", Resource: "leases", Name: "weir-server"}, false},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "weir-system", Resource: "secrets", Name: "tor-a-password"}, true},
		{authorizationv1.ResourceAttributes{Verb: "list", Namespace: "weir-system", Resource: "secrets"}, false},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "shop", Resource: "secrets", Name: "tor-a-password"}, false},
		{authorizationv1.ResourceAttributes{Verb: "watch", Group: "weir.dev", Resource: "weiraddresspools"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "weir.dev", Resource: "weirbgppeers", Subresource: "status"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "weir.dev", Resource: "weirbgppeers"}, false},
	})
	// The server's init container makes the certificate Secrets, reads
	// only those of them (its peer-password Role reads any one by name),
	// names their owner, and puts the webhook's CA in its configuration.
	checkAccess(ctx, t, kc, "weir-server", []access{
		{authorizationv1.ResourceAttributes{Verb: "create", Namespace: "weir-system", Resource: "secrets"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "weir-system", Resource: "secrets", Name: "weir-ca"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "weir-system", Resource: "secrets", Name: "weir-agent-tls"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Namespace: "weir-system", Resource: "secrets", Name: "weir-ca"}, false},
		{authorizationv1.ResourceAttributes{Verb: "delete", Namespace: "weir-system", Resource: "secrets", Name: "weir-ca"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Namespace: "default", Resource: "secrets"}, false},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "weir-system", Resource: "serviceaccounts", Name: "weir-server"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Namespace: "weir-system", Resource: "serviceaccounts", Name: "weir-agent"}, false},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "weir.dev"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "someone-elses"}, false},
	})
}

// access is a request and whether a ServiceAccount may make it.
type access struct {
	attrs authorizationv1.ResourceAttributes
	want  bool
}

// checkAccess asks the apiserver's RBAC whether the ServiceAccount
// weir-system/account may make each request, and fails where the answer
// is not the one wanted.
func checkAccess(ctx context.Context, t *testing.T, kc kubernetes.Interface, account string, cases []access) {
	t.Helper()
	sa := "system:serviceaccount:weir-system:" + account
	for _, tc := range cases {
		what := fmt.Sprintf("%s %s/%s %s/%s", tc.attrs.Verb, tc.attrs.Group, tc.attrs.Resource, tc.attrs.Namespace, tc.attrs.Name)
		if tc.attrs.Subresource != "" {
			what += " (" + tc.attrs.Subresource + ")"
		}
		// The authorizer learns of roles through its informers: a moment.
		var allowed bool
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			r, err := kc.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:weir-system"}, ResourceAttributes: &tc.attrs},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			allowed = r.Status.Allowed
			if allowed == tc.want || time.Now().After(deadline) {
				break
			}
		}
		if allowed != tc.want {
			t.Errorf("%s may %s: %v, want %v", account, what, allowed, tc.want)
		}
	}
}

// TestServerRunsAsReplicas: the server runs as three replicas with a store
// each and leader election; a disruption takes at most one, the
// scheduler spreads them over nodes, and agents reach them through the
// server's headless Service.
func TestServerRunsAsReplicas(t *testing.T) {
	var deploy, pdb, svc *unstructured.Unstructured
	var weirServer string
	for _, obj := range manifests(t) {
		switch {
		case obj.GetKind() == "Deployment" && obj.GetName() == "weir-server":
			deploy = obj
		case obj.GetKind() == "PodDisruptionBudget":
			pdb = obj
		case obj.GetKind() == "Service" && obj.GetName() == "weir-server":
			svc = obj
		case obj.GetKind() == "ConfigMap" && obj.GetName() == "weir-config":
			weirServer, _, _ = unstructured.NestedString(obj.Object, "data", "WEIR_SERVER")
		case obj.GetKind() == "PersistentVolumeClaim":
			t.Errorf("PersistentVolumeClaim %s: the replicas' stores are their own (emptyDir)", obj.GetName())
		}
	}
	if deploy == nil || pdb == nil || svc == nil {
		t.Fatalf("want the server's Deployment, a PodDisruptionBudget and the Service weir-server; got %v, %v, %v", deploy != nil, pdb != nil, svc != nil)
	}
	// Numbers are float64 as YAML is read.
	if n, _, _ := unstructured.NestedFieldNoCopy(deploy.Object, "spec", "replicas"); fmt.Sprint(n) != "3" {
		t.Errorf("the server runs %v replicas, want 3", n)
	}
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	args, _ := containers[0].(map[string]any)["args"].([]any)
	for _, want := range []string{"--kubernetes", "--leader-elect"} {
		if !slices.Contains(args, any(want)) {
			t.Errorf("the server's args %v lack %s", args, want)
		}
	}
	volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
	for _, v := range volumes {
		if v := v.(map[string]any); v["name"] == "data" && v["emptyDir"] == nil {
			t.Errorf("the data volume %v is not an emptyDir: every replica has a store of its own", v)
		}
	}
	pods, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "selector", "matchLabels")
	for what, obj := range map[string]*unstructured.Unstructured{"the PodDisruptionBudget": pdb, "the Service": svc} {
		path := []string{"spec", "selector", "matchLabels"}
		if obj == svc {
			path = []string{"spec", "selector"}
		}
		if sel, _, _ := unstructured.NestedStringMap(obj.Object, path...); !reflect.DeepEqual(sel, pods) {
			t.Errorf("%s selects %v, the server's pods are %v", what, sel, pods)
		}
	}
	maxUnavailable, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable")
	minAvailable, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "minAvailable")
	if fmt.Sprint(maxUnavailable) != "1" && fmt.Sprint(minAvailable) != "2" {
		t.Errorf("the PodDisruptionBudget allows maxUnavailable %v, minAvailable %v; want one replica down at most", maxUnavailable, minAvailable)
	}
	terms, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
	spread := slices.ContainsFunc(terms, func(term any) bool {
		key, _, _ := unstructured.NestedString(term.(map[string]any), "podAffinityTerm", "topologyKey")
		sel, _, _ := unstructured.NestedStringMap(term.(map[string]any), "podAffinityTerm", "labelSelector", "matchLabels")
		return key == "kubernetes.io/hostname" && reflect.DeepEqual(sel, pods)
	})
	if !spread {
		t.Errorf("no pod anti-affinity spreads the replicas over nodes: %v", terms)
	}
	if ip, _, _ := unstructured.NestedString(svc.Object, "spec", "clusterIP"); ip != "None" {
		t.Errorf("the Service weir-server has cluster IP %q: want it headless, its name resolving to every replica", ip)
	}
	if !strings.HasPrefix(weirServer, "weir-server.weir-system.svc:") {
		t.Errorf("WEIR_SERVER %q is not the server's Service", weirServer)
	}
}

// subset reports whether every field of want is in got with the same value.
func subset(want, got any, path string) (string, bool) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path, false
		}
		for k, v := range w {
			if p, ok := subset(v, g[k], path+"."+k); !ok {
				return p, false
			}
		}
		return "", true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path, false
		}
		for i := range w {
			if p, ok := subset(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); !ok {
				return p, false
			}
		}
		return "", true
	}
	// Numbers come back as int64 from the server, float64 from YAML:
	// compared as numbers, since fmt writes a float64 of ten digits
	// (a CRD's maximum 4294967295) in e-notation.
	if w, ok := number(want); ok {
		g, ok := number(got)
		return path, ok && w == g
	}
	return path, fmt.Sprint(want) == fmt.Sprint(got) || reflect.DeepEqual(want, got)
}

// number is v as a float64 when it is a JSON number.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case int:
		return float64(n), true
	}
	return 0, false
}

// TestSystemdUnitsVerify runs systemd-analyze verify on every shipped unit,
// pointed at freshly built binaries.
func TestSystemdUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is required (Debian package systemd)")
		}
		t.Skip("needs systemd-analyze")
	}
	r := root(t)
	dir := t.TempDir()
	units, _ := filepath.Glob(filepath.Join(r, "deploy", "systemd", "*.service"))
	if len(units) == 0 {
		t.Fatal("no units")
	}
	var paths []string
	for _, u := range units {
		data, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		for binary, pkg := range map[string]string{"weir-server": "./server/cmd/weir-server", "weir-agent": "./agent/cmd/weir-agent", "weir-speaker": "./lbtier/cmd/weir-speaker"} {
			out := filepath.Join(dir, binary)
			if _, err := os.Stat(out); err != nil {
				build := exec.Command("go", "build", "-o", out, pkg)
				build.Dir = r
				if b, err := build.CombinedOutput(); err != nil {
					t.Fatalf("%v: %s", err, b)
				}
			}
			text = strings.ReplaceAll(text, "/usr/local/bin/"+binary, out)
		}
		p := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func metav1ApplyOptions() metav1.PatchOptions {
	force := true
	return metav1.PatchOptions{FieldManager: "weir-deploy-test", Force: &force}
}

func getOptions() metav1.GetOptions { return metav1.GetOptions{} }

// TestResourcesFileExampleIsValid: the example resources file parses and
// validates as the server reads it; the chart given it as resourcesFile
// mounts it where the server's flag names it.
func TestResourcesFileExampleIsValid(t *testing.T) {
	file := filepath.Join(root(t), "deploy", "examples", "resources.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r, err := resourcefile.Parse("resources.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pools) == 0 || len(r.Peers) == 0 {
		t.Errorf("want pools and peers, got %d and %d", len(r.Pools), len(r.Peers))
	}
	objs := renderWith(t, "--set-file", "resourcesFile="+file)
	if got, _, _ := unstructured.NestedString(objs["ConfigMap/weir-resources"].Object, "data", "resources.yaml"); got != string(data) {
		t.Errorf("weir-resources holds %q; want the example", got)
	}
	containers, _, _ := unstructured.NestedSlice(objs["Deployment/weir-server"].Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args, _ := c["args"].([]any)
	mounts, _ := c["volumeMounts"].([]any)
	if !slices.Contains(args, any("--resources-file=/etc/weir/resources/resources.yaml")) {
		t.Errorf("the server's args %v do not name the resources file", args)
	}
	mounted := slices.ContainsFunc(mounts, func(m any) bool {
		mm, _ := m.(map[string]any)
		return mm["name"] == "resources" && mm["mountPath"] == "/etc/weir/resources"
	})
	if !mounted {
		t.Errorf("the resources ConfigMap is not mounted at /etc/weir/resources: %v", mounts)
	}
}
