package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/weirlb/weir/test/toolbin"
)

// kubeVersion is the cluster version the chart is rendered for.
const kubeVersion = "v1.36.0"

// helm runs the helm binary (built once per machine) on the chart.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := tryHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryHelm is helm that returns helm's failure, its output in the error.
func tryHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := toolbin.Helm(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = root(t)
	cmd.Env = append(cmd.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return nil, fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return out, nil
}

var chart = filepath.Join("deploy", "helm", "weir")

// render is the chart's objects with the given --set values, in the
// namespace weir-system, CRDs included.
func render(t *testing.T, set ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return renderWith(t, args...)
}

// renderWith is render with helm's own flags (--set-file, -f).
func renderWith(t *testing.T, flags ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", "weir", chart, "--namespace", "weir-system", "--include-crds", "--kube-version", kubeVersion}, flags...)
	return byName(decodeObjects(t, "helm template", helm(t, args...)))
}

func byName(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		out[o.GetKind()+"/"+o.GetName()] = o
	}
	return out
}

// withoutImageTags drops the tags of every container image: the chart
// pins the release's, the plain manifests name the images make images
// builds.
func withoutImageTags(o *unstructured.Unstructured) *unstructured.Unstructured {
	o = o.DeepCopy()
	for _, field := range []string{"initContainers", "containers"} {
		containers, found, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
		if !found {
			continue
		}
		for _, c := range containers {
			m := c.(map[string]any)
			if img, ok := m["image"].(string); ok {
				m["image"], _, _ = strings.Cut(img, ":")
			}
		}
		unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", field)
	}
	return o
}

// images are the images of obj's pod template's containers, init
// containers first.
func images(obj *unstructured.Unstructured) []string {
	var out []string
	for _, field := range []string{"initContainers", "containers"} {
		containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", field)
		for _, c := range containers {
			img, _ := c.(map[string]any)["image"].(string)
			out = append(out, img)
		}
	}
	return out
}

// TestHelmChartIsThePlainManifests: helm lint passes, and the chart with
// its default values renders exactly the objects of deploy/kubernetes
// (but the Namespace, which helm install --create-namespace makes, and
// the images' tags, which the chart pins to its appVersion), so the two
// install paths cannot drift apart.
func TestHelmChartIsThePlainManifests(t *testing.T) {
	helm(t, "lint", chart, "--strict", "--kube-version", kubeVersion)
	got := render(t)
	want := map[string]*unstructured.Unstructured{}
	for _, o := range manifests(t) {
		if o.GetKind() != "Namespace" {
			want[o.GetKind()+"/"+o.GetName()] = o
		}
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("the chart has no %s", name)
			continue
		}
		if diff := cmp.Diff(withoutImageTags(w).Object, withoutImageTags(g).Object); diff != "" {
			t.Errorf("%s: the chart renders (-plain +chart):\n%s", name, diff)
		}
	}
	for name := range got {
		if want[name] == nil {
			t.Errorf("the chart has %s, the plain manifests do not", name)
		}
	}
	for _, kind := range []string{"Deployment/weir-server", "DaemonSet/weir-agent"} {
		for _, img := range images(got[kind]) {
			if !strings.HasSuffix(img, ":0.1.0") {
				t.Errorf("%s runs %s; want the chart's appVersion, 0.1.0", kind, img)
			}
		}
	}
}

// TestHelmValuesReachTheObjects: each value changes what it says, and the
// objects rendered with them are valid for a real apiserver.
func TestHelmValuesReachTheObjects(t *testing.T) {
	got := render(t, "bgp.asn=64512", "bgp.peers=192.0.2.1/64500", "defaultLoadBalancer=false", "loadBalancerClass=example.com/weir",
		"server.replicas=2", "server.hosts=weir.example.internal", "image.tag=v9", "resourcesFile=", "certificates.bootstrap=false",
		"allowedExternalIPCIDRs=198.51.100.0/24\\,2001:db8::/64")
	config, _, _ := unstructured.NestedStringMap(got["ConfigMap/weir-config"].Object, "data")
	for k, v := range map[string]string{"WEIR_BGP_ASN": "64512", "WEIR_BGP_PEERS": "192.0.2.1/64500", "WEIR_DEFAULT_LOAD_BALANCER": "false",
		"WEIR_LOAD_BALANCER_CLASS": "example.com/weir", "WEIR_SERVER_HOSTS": "weir.example.internal", "WEIR_SERVER": "weir-server.weir-system.svc:7443",
		"WEIR_ALLOWED_EXTERNAL_IP_CIDRS": "198.51.100.0/24,2001:db8::/64"} {
		if config[k] != v {
			t.Errorf("weir-config %s = %q, want %q", k, config[k], v)
		}
	}
	server := got["Deployment/weir-server"]
	if got["ConfigMap/weir-resources"] != nil || got["Role/weir-server-certs"] != nil || got["ClusterRole/weir-server-webhook-ca"] != nil || len(images(server)) != 1 {
		t.Errorf("resourcesFile empty and certificates.bootstrap false still render weir-resources, the bootstrap's roles or its init container (images %v)", images(server))
	}
	if n, _, _ := unstructured.NestedFieldNoCopy(server.Object, "spec", "replicas"); fmt.Sprint(n) != "2" {
		t.Errorf("replicas %v, want 2", n)
	}
	containers, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args := fmt.Sprint(c["args"])
	if strings.Contains(args, "--resources-file") || c["image"] != "weir/weir-server:v9" {
		t.Errorf("server image %v, args %s; want v9 and no --resources-file", c["image"], args)
	}
	volumes, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "volumes")
	if slices.ContainsFunc(volumes, func(v any) bool { return v.(map[string]any)["name"] == "resources" }) {
		t.Error("the resources volume is mounted without a resources file")
	}
	applyAll(t, slices.Collect(func(yield func(*unstructured.Unstructured) bool) {
		for _, o := range got {
			if !yield(o) {
				return
			}
		}
	}))
}

// TestHelmWebhookValues: by default the webhook listens on the pod's own
// address, not every address of the pod. webhook.clientCASecret makes the
// server require a client certificate of the Secret's CA (mounted where
// the flag reads it), webhook.clientNames names the certificates taken
// (and is refused without a CA: it would check nothing), and
// webhook.allowedCIDRs adds a NetworkPolicy that opens the webhook's port
// to those CIDRs alone and leaves the server's other ports open; the
// objects are valid for a real apiserver.
func TestHelmWebhookValues(t *testing.T) {
	container := func(objs map[string]*unstructured.Unstructured) map[string]any {
		containers, _, _ := unstructured.NestedSlice(objs["Deployment/weir-server"].Object, "spec", "template", "spec", "containers")
		return containers[0].(map[string]any)
	}
	plain := render(t)
	c := container(plain)
	args := fmt.Sprint(c["args"])
	podIP := map[string]any{"name": "POD_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.podIP"}}}
	if !strings.Contains(args, "--webhook-bind-address=[$(POD_IP)]:7445") || !slices.ContainsFunc(c["env"].([]any), func(e any) bool { return cmp.Equal(e, any(podIP)) }) {
		t.Errorf("the webhook listens as %s, env %v; want [$(POD_IP)]:7445, POD_IP from status.podIP", args, c["env"])
	}
	if strings.Contains(args, "--webhook-client") || plain["NetworkPolicy/weir-webhook"] != nil {
		t.Errorf("by default: args %s, a NetworkPolicy %v; want neither client authentication nor a policy", args, plain["NetworkPolicy/weir-webhook"] != nil)
	}

	got := render(t, "webhook.clientCASecret=apiserver-webhook-client-ca", "webhook.clientNames=kube-apiserver\\,apiserver.example", "webhook.allowedCIDRs={192.0.2.10/32,2001:db8::10/128}")
	c = container(got)
	args = fmt.Sprint(c["args"])
	for _, want := range []string{"--webhook-client-ca-file=/etc/weir/webhook-client-ca/ca.crt", "--webhook-client-names=kube-apiserver,apiserver.example"} {
		if !strings.Contains(args, want) {
			t.Errorf("server args %s lack %s", args, want)
		}
	}
	mounts, _ := c["volumeMounts"].([]any)
	if !slices.ContainsFunc(mounts, func(m any) bool {
		return m.(map[string]any)["name"] == "webhook-client-ca" && m.(map[string]any)["mountPath"] == "/etc/weir/webhook-client-ca"
	}) {
		t.Errorf("no webhook-client-ca mount at /etc/weir/webhook-client-ca: %v", mounts)
	}
	volumes, _, _ := unstructured.NestedSlice(got["Deployment/weir-server"].Object, "spec", "template", "spec", "volumes")
	if !slices.ContainsFunc(volumes, func(v any) bool {
		name, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName")
		return v.(map[string]any)["name"] == "webhook-client-ca" && name == "apiserver-webhook-client-ca"
	}) {
		t.Errorf("no volume webhook-client-ca of the Secret apiserver-webhook-client-ca: %v", volumes)
	}
	policy := got["NetworkPolicy/weir-webhook"]
	if policy == nil {
		t.Fatal("webhook.allowedCIDRs renders no NetworkPolicy weir-webhook")
	}
	ingress, _, _ := unstructured.NestedSlice(policy.Object, "spec", "ingress")
	want := []any{
		map[string]any{"ports": []any{map[string]any{"port": "grpc"}, map[string]any{"port": "metrics"}}},
		map[string]any{"from": []any{map[string]any{"ipBlock": map[string]any{"cidr": "192.0.2.10/32"}}, map[string]any{"ipBlock": map[string]any{"cidr": "2001:db8::10/128"}}},
			"ports": []any{map[string]any{"port": "webhook"}}},
	}
	if diff := cmp.Diff(want, ingress); diff != "" {
		t.Errorf("the NetworkPolicy's ingress (-want +got):\n%s", diff)
	}
	if sel, _, _ := unstructured.NestedStringMap(policy.Object, "spec", "podSelector", "matchLabels"); sel["app.kubernetes.io/name"] != "weir-server" {
		t.Errorf("the NetworkPolicy selects %v; want the server's pods", sel)
	}

	if _, err := tryHelm(t, "template", "weir", chart, "--namespace", "weir-system", "--kube-version", kubeVersion, "--set", "webhook.clientNames=kube-apiserver"); err == nil || !strings.Contains(err.Error(), "webhook.clientNames needs webhook.clientCASecret") {
		t.Errorf("webhook.clientNames without webhook.clientCASecret: %v; want refused", err)
	}
	applyAll(t, slices.Collect(maps.Values(got)))
}

// TestMonitoringObjects: with monitoring.enabled the chart renders the
// objects of deploy/kubernetes/monitoring exactly; its PrometheusRule holds
// the groups of deploy/monitoring/weir-alerts.yaml (which the lab test of
// the alerts checks with promtool), and its dashboard is the JSON of
// deploy/monitoring, reading only metrics docs/metrics.md lists.
func TestMonitoringObjects(t *testing.T) {
	all := render(t, "monitoring.enabled=true")
	plain, err := os.ReadFile(filepath.Join(root(t), "deploy", "kubernetes", "monitoring", "monitoring.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := byName(decodeObjects(t, "monitoring.yaml", plain))
	if len(want) != 4 {
		t.Errorf("deploy/kubernetes/monitoring has %d objects, want 4 (two PodMonitors, a PrometheusRule, a dashboard)", len(want))
	}
	for name, w := range want {
		if diff := cmp.Diff(w.Object, all[name].Object); diff != "" {
			t.Errorf("%s: the chart renders (-plain +chart):\n%s", name, diff)
		}
	}
	for name := range render(t) {
		delete(all, name)
	}
	for name := range all {
		if want[name] == nil {
			t.Errorf("monitoring.enabled adds %s, which deploy/kubernetes/monitoring lacks", name)
		}
	}

	var rules map[string]any
	raw, err := os.ReadFile(filepath.Join(root(t), "deploy", "monitoring", "weir-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	groups, _, _ := unstructured.NestedSlice(want["PrometheusRule/weir"].Object, "spec", "groups")
	if diff := cmp.Diff(rules["groups"], any(groups)); diff != "" {
		t.Errorf("the PrometheusRule's groups differ from deploy/monitoring/weir-alerts.yaml (-file +rule):\n%s", diff)
	}

	dashboard, _, _ := unstructured.NestedString(want["ConfigMap/weir-grafana-dashboard"].Object, "data", "weir.json")
	file, err := os.ReadFile(filepath.Join(root(t), "deploy", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if dashboard != string(file) {
		t.Error("the dashboard ConfigMap's weir.json differs from deploy/monitoring/grafana-dashboard.json")
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(file, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	reference, err := os.ReadFile(filepath.Join(root(t), "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range regexp.MustCompile(`\bweir_[a-z0-9_]+`).FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !strings.Contains(string(reference), "`"+base+"`") {
					t.Errorf("panel %q reads %s, which docs/metrics.md does not list", p.Title, m)
				}
			}
		}
	}
}
