package kubernetes_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/server/kubernetes"
	"github.com/weirlb/weir/test/kubeapi"
)

// neighbour is a CustomResourceDefinition another load-balancer or BGP
// implementation installs in the same clusters as Weir: its group and
// names exactly as it ships them.
type neighbour struct {
	group, version, kind, plural string
	namespaced                   bool
}

// neighbours are MetalLB's resources (v0.13 to v0.15, with v1beta1's
// AddressPool of older releases) and the BGP and address resources of
// Calico, the two most often found beside Weir.
var neighbours = []neighbour{
	{"metallb.io", "v1beta1", "IPAddressPool", "ipaddresspools", true},
	{"metallb.io", "v1beta1", "L2Advertisement", "l2advertisements", true},
	{"metallb.io", "v1beta1", "BGPAdvertisement", "bgpadvertisements", true},
	{"metallb.io", "v1beta1", "Community", "communities", true},
	{"metallb.io", "v1beta1", "BFDProfile", "bfdprofiles", true},
	{"metallb.io", "v1beta2", "BGPPeer", "bgppeers", true},
	{"metallb.io", "v1beta1", "AddressPool", "addresspools", true},
	{"metallb.io", "v1beta1", "ServiceL2Status", "servicel2statuses", true},
	{"metallb.io", "v1beta1", "ServiceBGPStatus", "servicebgpstatuses", true},
	{"crd.projectcalico.org", "v1", "BGPPeer", "bgppeers", false},
	{"crd.projectcalico.org", "v1", "BGPConfiguration", "bgpconfigurations", false},
	{"crd.projectcalico.org", "v1", "IPPool", "ippools", false},
	{"crd.projectcalico.org", "v1", "IPReservation", "ipreservations", false},
	{"crd.projectcalico.org", "v1", "BGPFilter", "bgpfilters", false},
}

func (n neighbour) crd() map[string]any {
	scope := "Cluster"
	if n.namespaced {
		scope = "Namespaced"
	}
	return map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": n.plural + "." + n.group},
		"spec": map[string]any{
			"group": n.group, "scope": scope,
			"names": map[string]any{"kind": n.kind, "listKind": n.kind + "List", "plural": n.plural, "singular": strings.ToLower(n.kind)},
			"versions": []any{map[string]any{"name": n.version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}
}

// kubectlVerbs are the kubectl commands whose first argument names a
// resource.
var kubectlVerbs = []string{"get", "describe", "annotate", "edit", "delete", "label", "wait", "explain", "patch"}

// kubectlFlagsWithValue are the flags, before or after the verb, whose
// value is the next word.
var kubectlFlagsWithValue = []string{"-n", "--namespace", "-o", "--output", "-l", "--selector", "--for", "--context"}

var codeSpans = regexp.MustCompile("(?s:```.*?```)|`[^`]+`|(?m:^(?:    |\t).*$)")

// kubectlResources is the resource arguments ("bgppeers",
// "ipaddresspools.metallb.io", "service" of "service/web") of the kubectl
// commands in the code of a Markdown text: its code blocks and inline
// code, where a command may wrap over lines.
func kubectlResources(markdown string) []string {
	var out []string
	for _, code := range codeSpans.FindAllString(markdown, -1) {
		words := strings.Fields(strings.ReplaceAll(code, "`", " "))
		for i, w := range words {
			if w != "kubectl" {
				continue
			}
			out = append(out, kubectlResource(words[i+1:])...)
		}
	}
	return out
}

// kubectlResource is the resources that args, the words after
// "kubectl", name: none unless the verb is one of kubectlVerbs.
func kubectlResource(args []string) []string {
	verb := ""
	for j := 0; j < len(args); j++ {
		a := args[j]
		switch {
		case slices.Contains(kubectlFlagsWithValue, a):
			j++
		case strings.HasPrefix(a, "-") || a == "\\":
		case verb == "" && !slices.Contains(kubectlVerbs, a):
			return nil
		case verb == "":
			verb = a
		default:
			var out []string
			for _, r := range strings.Split(a, ",") {
				r, _, _ = strings.Cut(r, "/")
				out = append(out, r)
			}
			return out
		}
	}
	return nil
}

func TestKubectlResources(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want []string
	}{
		{"    $ kubectl get weirbgppeers\n", []string{"weirbgppeers"}},
		{"touch it (`kubectl annotate weirbgppeer NAME\nweir.dev/rotated=1 --overwrite`)", []string{"weirbgppeer"}},
		{"    kubectl get ipaddresspools.metallb.io,bgppeers.metallb.io \\\n        -n metallb-system -o yaml\n", []string{"ipaddresspools.metallb.io", "bgppeers.metallb.io"}},
		{"`kubectl -n weir-system delete job weir-certs && kubectl apply -k deploy/kubernetes`", []string{"job"}},
		{"    kubectl wait --for=condition=weir.dev/Announced service/web\n", []string{"service"}},
		{"    kubectl -n weir-system get secret weir-admin-tls -o jsonpath='{.data.tls\\.crt}'\n", []string{"secret"}},
		{"```\nkubectl -n metallb-system get bgppeers\n```\nprose kubectl get shows\n", []string{"bgppeers"}},
		{"`kubectl apply -f weir-crs.yaml` and `kubectl get`", nil},
	} {
		if diff := cmp.Diff(tc.want, kubectlResources(tc.doc)); diff != "" {
			t.Errorf("kubectlResources(%q) (-want +got):\n%s", tc.doc, diff)
		}
	}
}

// resolver answers, as kubectl would, which resources a name typed on
// its command line means.
type resolver struct {
	mapper    meta.RESTMapper
	resources []*metav1.APIResourceList
}

func newResolver(t *testing.T, dc discovery.DiscoveryInterface) *resolver {
	t.Helper()
	cached := memory.NewMemCacheClient(dc)
	_, lists, err := cached.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	return &resolver{
		mapper:    restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(cached), cached, nil),
		resources: lists,
	}
}

// resolve is what name (optionally NAME.GROUP) means: the resources
// kubectl's RESTMapper finds for it, and every resource that answers to
// it by plural, singular or short name. One name, one resource, in both.
func (r *resolver) resolve(name string) (mapped, answering []schema.GroupResource) {
	gr := schema.ParseGroupResource(name)
	gvrs, _ := r.mapper.ResourcesFor(gr.WithVersion(""))
	for _, gvr := range gvrs {
		if !slices.Contains(mapped, gvr.GroupResource()) {
			mapped = append(mapped, gvr.GroupResource())
		}
	}
	for _, list := range r.resources {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil || (gr.Group != "" && gv.Group != gr.Group) {
			continue
		}
		for _, res := range list.APIResources {
			this := schema.GroupResource{Group: gv.Group, Resource: res.Name}
			if strings.Contains(res.Name, "/") || slices.Contains(answering, this) {
				continue
			}
			if res.Name == gr.Resource || res.SingularName == gr.Resource || strings.EqualFold(res.Kind, gr.Resource) || slices.Contains(res.ShortNames, gr.Resource) {
				answering = append(answering, this)
			}
		}
	}
	return mapped, answering
}

// one is the only resource name means, or an error saying what else it
// could mean.
func (r *resolver) one(name string) (schema.GroupResource, error) {
	mapped, answering := r.resolve(name)
	if len(mapped) != 1 || len(answering) != 1 || mapped[0] != answering[0] {
		return schema.GroupResource{}, fmt.Errorf("%q means %v to kubectl's RESTMapper and is a name of %v; want one resource", name, mapped, answering)
	}
	return mapped[0], nil
}

// TestResourceNamesAreWeirsAlone: with MetalLB's and Calico's CRDs
// installed beside Weir's on a real apiserver, every name of Weir's
// resources that kubectl takes (plural, singular, kind, short name)
// means one resource, Weir's, and `kubectl get weir` lists Weir's alone;
// every kubectl command in the docs names one resource, a name without
// a group being Weir's or Kubernetes' own, never another project's; and
// MetalLB's and Calico's names still mean theirs.
func TestResourceNamesAreWeirsAlone(t *testing.T) {
	c := kubeapi.StartForTest(t)
	rc, err := kubernetes.RestConfig(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	crdRes := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	files, err := filepath.Glob("../../deploy/kubernetes/crds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("Weir's CRD files: %v, %v", files, err)
	}
	var crds []map[string]any
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(data, &obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds = append(crds, obj)
	}
	weirs := len(crds)
	for _, n := range neighbours {
		crds = append(crds, n.crd())
	}
	for _, obj := range crds {
		if _, err := dyn.Resource(crdRes).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every CRD served", func() error {
		_, lists, err := dc.ServerGroupsAndResources()
		if err != nil {
			return err
		}
		served := map[string]bool{}
		for _, l := range lists {
			gv, _ := schema.ParseGroupVersion(l.GroupVersion)
			for _, r := range l.APIResources {
				served[r.Name+"."+gv.Group] = true
			}
		}
		for _, obj := range crds {
			name := obj["metadata"].(map[string]any)["name"].(string)
			if !served[name] {
				return fmt.Errorf("%s not served yet", name)
			}
		}
		return nil
	})
	r := newResolver(t, dc)

	// Every name Weir's CRDs give their resources.
	var weirResources []schema.GroupResource
	for _, obj := range crds[:weirs] {
		spec := obj["spec"].(map[string]any)
		names := spec["names"].(map[string]any)
		want := schema.GroupResource{Group: spec["group"].(string), Resource: names["plural"].(string)}
		if want.Group != "weir.dev" {
			t.Errorf("a Weir CRD in group %s", want.Group)
		}
		weirResources = append(weirResources, want)
		typed := []string{names["plural"].(string), names["singular"].(string), names["kind"].(string)}
		for _, s := range names["shortNames"].([]any) {
			typed = append(typed, s.(string))
		}
		for _, name := range typed {
			got, err := r.one(name)
			if err != nil {
				t.Errorf("kubectl get %s: %v", name, err)
			} else if got != want {
				t.Errorf("kubectl get %s means %s; want %s", name, got, want)
			}
		}
		if cats := names["categories"].([]any); !slices.Contains(cats, any("weir")) {
			t.Errorf("%s: categories %v; want weir among them", want, cats)
		}
	}
	// kubectl get weir: Weir's resources, no one else's.
	categories := restmapper.NewDiscoveryCategoryExpander(dc)
	got, _ := categories.Expand("weir")
	if diff := cmp.Diff(weirResources, got); diff != "" {
		t.Errorf("kubectl get weir lists (-want +got):\n%s", diff)
	}

	// Every resource a kubectl command of the docs names.
	docs, _ := filepath.Glob("../../docs/*.md")
	docs = append(docs, "../../README.md")
	named := map[schema.GroupResource]bool{}
	for _, f := range docs {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range kubectlResources(string(data)) {
			// A category (kubectl get weir) that lists one of Weir's
			// resources lists Weir's alone.
			if grs, ok := categories.Expand(name); ok {
				hasWeir := slices.ContainsFunc(grs, func(gr schema.GroupResource) bool { return gr.Group == "weir.dev" })
				for _, gr := range grs {
					named[gr] = true
					if hasWeir && gr.Group != "weir.dev" {
						t.Errorf("%s: kubectl ... %s lists %s beside Weir's", filepath.Base(f), name, gr)
					}
				}
				continue
			}
			got, err := r.one(name)
			if err != nil {
				t.Errorf("%s: kubectl ... %s: %v", filepath.Base(f), name, err)
				continue
			}
			named[got] = true
			if schema.ParseGroupResource(name).Group == "" && slices.ContainsFunc(neighbours, func(n neighbour) bool { return n.group == got.Group }) {
				t.Errorf("%s: kubectl ... %s means %s: name another project's resource with its group (%s.%s)", filepath.Base(f), name, got, got.Resource, got.Group)
			}
		}
	}
	for _, w := range weirResources {
		if !named[w] {
			t.Errorf("no kubectl command in the docs names %s (is the docs' reading broken?)", w)
		}
	}

	// MetalLB's and Calico's names still mean theirs: with the group,
	// exactly; without it, never Weir's.
	for _, n := range neighbours {
		want := schema.GroupResource{Group: n.group, Resource: n.plural}
		if got, err := r.one(n.plural + "." + n.group); err != nil || got != want {
			t.Errorf("kubectl get %s.%s: %v, %v; want %s", n.plural, n.group, got, err, want)
		}
		for _, name := range []string{n.plural, strings.ToLower(n.kind)} {
			mapped, answering := r.resolve(name)
			if !slices.Contains(mapped, want) || slices.ContainsFunc(append(mapped, answering...), func(gr schema.GroupResource) bool { return gr.Group == "weir.dev" }) {
				t.Errorf("kubectl get %s means %v (answering: %v); want %s among them and nothing of Weir's", name, mapped, answering, want)
			}
		}
	}
}
