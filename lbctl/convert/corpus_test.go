package convert

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
)

// corpus is MetalLB's own configuration samples and documentation
// examples (testdata/metallb/README.md).
func corpus(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("testdata/metallb/*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 60 {
		t.Fatalf("%d files in testdata/metallb; want MetalLB's 18 samples and 50 documentation examples", len(files))
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(b)
	}
	return out
}

// inputLeaves is every leaf of the input's objects (a List's items each
// an object), as "Kind/name path" with its value, read here apart from
// the converter so that a leaf it does not see is seen.
func inputLeaves(t *testing.T, data string) map[string][]string {
	t.Helper()
	out := map[string][]string{} // "Kind/name": its leaves' paths
	var walk func(ref, path string, v any)
	walk = func(ref, path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if len(v) == 0 {
				out[ref] = append(out[ref], path)
			}
			for k, e := range v {
				walk(ref, strings.TrimPrefix(path+"."+k, "."), e)
			}
		case []any:
			if len(v) == 0 {
				out[ref] = append(out[ref], path)
			}
			for i, e := range v {
				walk(ref, fmt.Sprintf("%s[%d]", path, i), e)
			}
		default:
			out[ref] = append(out[ref], path)
		}
	}
	object := func(o map[string]any) {
		name, _ := o["metadata"].(map[string]any)["name"].(string)
		walk(fmt.Sprint(o["kind"])+"/"+name, "", o)
	}
	for _, doc := range yamldocs.Split(data) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var o map[string]any
		if err := json.Unmarshal(j, &o); err != nil || o == nil {
			continue
		}
		if items, ok := o["items"].([]any); ok && strings.HasSuffix(fmt.Sprint(o["kind"]), "List") {
			for _, item := range items {
				object(item.(map[string]any))
			}
			continue
		}
		object(o)
	}
	return out
}

// unaccounted lists the leaves of data that r neither carried over nor
// named in a note, nor the field table calls no configuration.
func unaccounted(t *testing.T, data string, r *Result) []string {
	var out []string
	for ref, paths := range inputLeaves(t, data) {
		kind, _, _ := strings.Cut(ref, "/")
		for _, path := range paths {
			under := func(p string) bool {
				return path == p || strings.HasPrefix(path, p+".") || strings.HasPrefix(path, p+"[")
			}
			noted := slices.ContainsFunc(r.Notes, func(n Note) bool {
				return n.Object == ref && !n.missed && (n.whole || under(n.Field))
			})
			f, _ := fieldOf(kind, leafPath(path))
			ignored := f != nil && f.fate == Ignored
			if !noted && !ignored && !slices.ContainsFunc(r.carried[ref], under) {
				out = append(out, ref+" "+path)
			}
		}
	}
	slices.Sort(out)
	return out
}

// leafPath reads "spec.nodeSelectors[0].matchLabels.a" as a leaf.
func leafPath(path string) leaf {
	var l leaf
	for _, part := range strings.Split(path, ".") {
		key, rest, _ := strings.Cut(part, "[")
		if key != "" {
			l = append(l, step{key: key})
		}
		for rest != "" {
			var i int
			fmt.Sscanf(rest, "%d]", &i)
			l = append(l, step{index: i})
			_, rest, _ = strings.Cut(rest, "[")
		}
	}
	return l
}

// TestTheCorpusDropsNothingSilently: every field of every MetalLB sample
// and documentation example is carried over into the output or named in a
// note, for lbctl's documents and for custom resources; none is a field
// the converter should have read and did not, and none is unknown (the
// field table has every field MetalLB's examples use).
func TestTheCorpusDropsNothingSilently(t *testing.T) {
	var carried, noted int
	for file, data := range corpus(t) {
		for _, opts := range []Options{{}, {CustomResources: true, Namespace: "weir-system"}} {
			r, err := Convert(data, opts)
			if err != nil {
				t.Errorf("%s: %v", file, err)
				continue
			}
			if lost := unaccounted(t, data, r); len(lost) > 0 {
				t.Errorf("%s (%+v): dropped silently:\n%s", file, opts, strings.Join(lost, "\n"))
			}
			for _, n := range r.Notes {
				if n.missed || strings.Contains(n.Says, "not a field of MetalLB's") {
					t.Errorf("%s: %s", file, n)
				}
				if n.Says == "" || strings.Contains(n.Says, "\n") {
					t.Errorf("%s: note %q: want one sentence on one line", file, n)
				}
			}
			if opts.CustomResources {
				noted += len(r.Notes)
				for _, paths := range r.carried {
					carried += len(paths)
				}
			}
		}
	}
	t.Logf("%d paths carried over, %d notes", carried, noted)
}

// eachAdvertisementWithItsPools is, for each advertisement of data, data
// with that advertisement alone and a pool for it to select (by each name
// it gives, by each of its selectors' labels, or one when it selects
// every pool) where data has none: most of MetalLB's examples show an
// advertisement without its pools, which would leave it out whole and
// check none of its fields.
func eachAdvertisementWithItsPools(t *testing.T, data string) map[string]string {
	t.Helper()
	var objs []map[string]any
	for _, doc := range yamldocs.Split(data) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var o map[string]any
		if json.Unmarshal(j, &o) == nil && o != nil {
			objs = append(objs, o)
		}
	}
	isAd := func(o map[string]any) bool { return o["kind"] == "BGPAdvertisement" || o["kind"] == "L2Advertisement" }
	pools := map[string]bool{}
	for _, o := range objs {
		if o["kind"] == "IPAddressPool" {
			pools[o["metadata"].(map[string]any)["name"].(string)] = true
		}
	}
	out := map[string]string{}
	for _, ad := range objs {
		if !isAd(ad) {
			continue
		}
		docs := []any{ad}
		for _, o := range objs {
			if !isAd(o) {
				docs = append(docs, o)
			}
		}
		pool := func(name string, labels any) {
			if !pools[name] {
				md := map[string]any{"name": name}
				if labels != nil {
					md["labels"] = labels
				}
				docs = append(docs, map[string]any{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": md,
					"spec": map[string]any{"addresses": []any{"192.0.2.0/28"}}})
			}
		}
		spec, _ := ad["spec"].(map[string]any)
		names, _ := spec["ipAddressPools"].([]any)
		sels, _ := spec["ipAddressPoolSelectors"].([]any)
		for _, n := range names {
			pool(n.(string), nil)
		}
		for i, sel := range sels {
			pool(fmt.Sprintf("selected-%d", i), sel.(map[string]any)["matchLabels"])
		}
		if len(names) == 0 && len(sels) == 0 && len(pools) == 0 {
			pool("any", nil)
		}
		var b strings.Builder
		for _, d := range docs {
			y, err := yaml.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(string(y) + "---\n")
		}
		out[fmt.Sprint(ad["kind"])+"/"+ad["metadata"].(map[string]any)["name"].(string)] = b.String()
	}
	return out
}

// TestTheCorpusAdvertisementsDropNothingSilently: each advertisement of
// MetalLB's examples, given the pools it selects, is converted (not left
// out whole) and every field of it is carried over or noted.
func TestTheCorpusAdvertisementsDropNothingSilently(t *testing.T) {
	count := 0
	for file, data := range corpus(t) {
		for ref, in := range eachAdvertisementWithItsPools(t, data) {
			count++
			r, err := Convert(in, Options{})
			if err != nil {
				t.Errorf("%s, %s: %v", file, ref, err)
				continue
			}
			if lost := unaccounted(t, in, r); len(lost) > 0 {
				t.Errorf("%s, %s: dropped silently:\n%s", file, ref, strings.Join(lost, "\n"))
			}
			for _, n := range r.Notes {
				if n.Object == ref && n.whole || n.missed || strings.Contains(n.Says, "not a field of MetalLB's") {
					t.Errorf("%s: %s", file, n)
				}
			}
		}
	}
	if count < 30 {
		t.Errorf("%d advertisements in the corpus, want MetalLB's 37", count)
	}
}

// TestTheGuardSeesASilentDrop: the corpus check fails when a converted
// field is neither carried over nor noted.
func TestTheGuardSeesASilentDrop(t *testing.T) {
	data := corpus(t)["testdata/metallb/samples/bgppeer_with_session_options.yaml"]
	r, err := Convert(data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if lost := unaccounted(t, data, r); len(lost) != 0 {
		t.Fatalf("unaccounted before: %q", lost)
	}
	for ref, paths := range r.carried {
		r.carried[ref] = slices.DeleteFunc(paths, func(p string) bool { return p == "spec.peerAddress" })
	}
	if lost := unaccounted(t, data, r); !slices.ContainsFunc(lost, func(l string) bool { return strings.HasSuffix(l, " spec.peerAddress") }) {
		t.Errorf("peerAddress dropped: unaccounted %q, want it named", lost)
	}
}

var update = flag.Bool("update", false, "rewrite the field table in docs/metallb-fields.md")

// TestTheFieldTableIsCurrent: docs/metallb-fields.md lists every field of
// the field table, as the converter treats it (go test
// ./lbctl/convert -run FieldTable -update rewrites it).
func TestTheFieldTableIsCurrent(t *testing.T) {
	const file = "../../docs/metallb-fields.md"
	const begin, end = "<!-- BEGIN: the field table (go test ./lbctl/convert -run FieldTable -update) -->\n", "<!-- END: the field table -->\n"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	head, rest, ok1 := strings.Cut(doc, begin)
	_, tail, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("%s: no %q ... %q", file, begin, end)
	}
	want := head + begin + fieldTable() + end + tail
	if want == doc {
		return
	}
	if *update {
		if err := os.WriteFile(file, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is not the converter's field table: go test ./lbctl/convert -run FieldTable -update", file)
}
