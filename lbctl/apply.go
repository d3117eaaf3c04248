package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) applyCmd() *cobra.Command {
	var (
		files  []string
		dryRun bool
		wait   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update the resources described in YAML files, all or nothing",
		Long: `Create or update the resources described in YAML files.

A file holds documents separated by "---" lines. Each document is one
resource: "kind: Service", "kind: EndpointSlice", "kind: Node",
"kind: AddressPool", "kind: BgpPeer" or "kind: ServiceCidr", then the
fields of that resource as in the API, spelled as in the proto files
(metadata, spec, status; service_name, endpoints, ports; addresses, zone,
pod_cidrs). A document may also be a list, {items: [...]}, as "lbctl get -o
yaml" prints.

All or nothing: every document is checked locally, then by the server
(fields, conflicts such as a cluster IP another service holds, ownership),
and the documents that change something go to the server as one write
(RegistryService.Apply): checked against each other too, stored in one
transaction at one revision, all of them or none. A resource that exists
is replaced whatever its resource_version; one that would not change is
left alone ("unchanged").

--dry-run stops after the server's checks and prints what would change: a
line diff of the stored resource against the one the file describes, as
the server would store it.`,
		Example: `  lbctl apply -f web.yaml
  lbctl apply -f web.yaml --dry-run
  lbctl get svc -o yaml | lbctl apply -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			docs, err := a.readDocuments(files)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			changes, err := plan(cmd.Context(), c, docs)
			if err != nil {
				return err
			}
			// Every change in one write: the server checks them against
			// each other and writes all of them or none.
			rev, err := applyAll(cmd.Context(), c, changes, dryRun)
			if err != nil {
				return err
			}
			for _, ch := range changes {
				if dryRun {
					err = a.printChange(ch)
				} else {
					fmt.Fprintf(a.stdout, "%s %s\n", ch.path(), ch.verb())
				}
				if err != nil {
					return err
				}
			}
			if wait > 0 && !dryRun && rev > 0 {
				return a.waitProgrammed(cmd.Context(), rev, wait)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&files, "filename", "f", nil, `YAML file to apply ("-" for standard input); may repeat`)
	f.StringVarP(&a.namespace, "namespace", "n", "default", "namespace of documents that name none")
	f.BoolVar(&dryRun, "dry-run", false, "let the server check every document, print what would change, write nothing")
	addWaitFlag(f, &wait)
	return cmd
}

// change is what applying one document does, as the server checked it.
type change struct {
	document
	current object // as stored; nil when the resource does not exist yet
	desired object // as the server would store the document
}

// verb says what the change does: created, configured or unchanged.
func (ch change) verb() string {
	switch {
	case ch.current == nil:
		return "created"
	case proto.Equal(ch.kind.settable(ch.current), ch.kind.settable(ch.desired)):
		return "unchanged"
	}
	return "configured"
}

// plan has the server check every document as apply would write it
// (created, or replacing the stored one), all together and without
// writing anything, in one call: a refusal anywhere stops the command
// before any write, and what each document changes comes from the
// stored resource the server names beside it.
func plan(ctx context.Context, c client, docs []document) ([]change, error) {
	out := make([]change, len(docs))
	req := &weirv1.ApplyRequest{ValidateOnly: true}
	for i, d := range docs {
		out[i].document = d
		req.Resources = append(req.Resources, applyResource(d.obj))
	}
	if len(docs) == 0 {
		return out, nil
	}
	resp, err := c.Apply(ctx, req)
	if err != nil {
		return nil, batchFailure(out, err)
	}
	if len(resp.GetResults()) != len(docs) {
		return nil, fmt.Errorf("the server checked %d of %d documents", len(resp.GetResults()), len(docs))
	}
	for i, r := range resp.GetResults() {
		out[i].desired = batchObject(r.GetResource())
		if p := r.GetPrevious(); p != nil {
			out[i].current = batchObject(p)
		} else if !r.GetCreated() {
			// A server older than the previous field: ask for it.
			m := docs[i].obj.GetMetadata()
			if out[i].current, err = docs[i].kind.get(ctx, c, m.GetNamespace(), m.GetName()); err != nil {
				return nil, docs[i].fail(err)
			}
		}
	}
	return out, nil
}

// batchObject is the resource a batch entry carries.
func batchObject(r *weirv1.ApplyResource) object {
	var obj object
	r.ProtoReflect().Range(func(_ protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		obj, _ = v.Message().Interface().(object)
		return false
	})
	return obj
}

// applyAll writes every change that changes something as one batch (with
// dryRun, only has the server check them together) and returns the
// revision that holds every document as the file says.
func applyAll(ctx context.Context, c client, changes []change, dryRun bool) (uint64, error) {
	var rev uint64
	var sent []change
	req := &weirv1.ApplyRequest{ValidateOnly: dryRun}
	for _, ch := range changes {
		if ch.verb() == "unchanged" {
			rev = max(rev, revisionOf(ch.current.GetMetadata()))
			continue
		}
		sent = append(sent, ch)
		req.Resources = append(req.Resources, applyResource(ch.obj))
	}
	if len(sent) == 0 {
		return rev, nil
	}
	resp, err := c.Apply(ctx, req)
	if err != nil {
		return 0, batchFailure(sent, err)
	}
	if !dryRun {
		rev = max(rev, revisionOf(resp))
	}
	return rev, nil
}

// batchIndex finds the resource a batch refusal names, and where its own
// message starts: "resources[2].service.spec.ports[0]: …", or
// "resources[2].service: …" for a refusal that names no field.
var batchIndex = regexp.MustCompile(`^resources\[(\d+)\]\.[a-z_]+(?:\.|: )`)

// batchFailure names the document the server refused, as a write of it
// alone would have been named.
func batchFailure(sent []change, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	m := batchIndex.FindStringSubmatch(st.Message())
	if m == nil {
		return plain(nil, err)
	}
	i, _ := strconv.Atoi(m[1])
	if i >= len(sent) {
		return plain(nil, err)
	}
	return sent[i].fail(status.Error(st.Code(), strings.TrimPrefix(st.Message(), m[0])))
}

// applyResource is a document's resource as the batch carries it.
func applyResource(o object) *weirv1.ApplyResource {
	switch r := o.(type) {
	case *weirv1.Service:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Service{Service: r}}
	case *weirv1.EndpointSlice:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_EndpointSlice{EndpointSlice: r}}
	case *weirv1.Node:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_Node{Node: r}}
	case *weirv1.AddressPool:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_AddressPool{AddressPool: r}}
	case *weirv1.BgpPeer:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_BgpPeer{BgpPeer: r}}
	case *weirv1.ServiceCidr:
		return &weirv1.ApplyResource{Resource: &weirv1.ApplyResource_ServiceCidr{ServiceCidr: r}}
	}
	panic(fmt.Sprintf("lbctl: %T has no batch form", o))
}

// printChange tells what applying would do; a change shows as a diff of
// the YAML of the stored resource and of the one the file describes.
func (a *app) printChange(ch change) error {
	verb := ch.verb()
	if verb == "unchanged" {
		fmt.Fprintf(a.stdout, "%s unchanged\n", ch.path())
		return nil
	}
	fmt.Fprintf(a.stdout, "%s %s (dry run)\n", ch.path(), verb)
	if verb == "created" {
		return nil
	}
	before, err := objectYAML(ch.kind, ch.kind.settable(ch.current))
	if err != nil {
		return err
	}
	after, err := objectYAML(ch.kind, ch.kind.settable(ch.desired))
	if err != nil {
		return err
	}
	_, err = io.WriteString(a.stdout, "--- current\n+++ desired\n"+unified(lineDiff(lines(before), lines(after)), 3))
	return err
}

func (a *app) deleteCmd() *cobra.Command {
	var (
		files          []string
		ignoreNotFound bool
		wait           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "delete (TYPE NAME | -f FILE)",
		Short: "Delete one resource, or the resources described in YAML files",
		Long:  "Delete one resource, or the resources described in YAML files.\n\nTypes: " + describeKinds() + ".",
		Example: `  lbctl delete service web
  lbctl delete node node1
  lbctl delete -f web.yaml`,
		ValidArgs: plurals(),
		RunE: func(cmd *cobra.Command, args []string) error {
			var docs []document
			switch {
			case len(files) > 0 && len(args) == 0:
				var err error
				if docs, err = a.readDocuments(files); err != nil {
					return err
				}
			case len(files) == 0 && len(args) == 2:
				k, err := kindFor(args[0])
				if err != nil {
					return err
				}
				obj := k.new()
				meta := metadata(obj)
				meta.Name = args[1]
				if k.namespaced {
					meta.Namespace = a.namespace
				}
				docs = []document{{kind: k, obj: obj}}
			default:
				return usageErrorf("delete takes TYPE NAME, or -f FILE")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var rev uint64
			for _, d := range docs {
				m := d.obj.GetMetadata()
				rv, err := d.kind.delete(cmd.Context(), c, m.GetNamespace(), m.GetName())
				rev = max(rev, rv)
				switch {
				case status.Code(err) == codes.NotFound && ignoreNotFound:
					continue
				case status.Code(err) == codes.NotFound:
					return explain(d.kind, d.kind.objRef(d.obj), err)
				case err != nil:
					return fmt.Errorf("deleting %s %s: %w", d.kind.singular, d.kind.objRef(d.obj), plain(d.kind, err))
				}
				fmt.Fprintf(a.stdout, "%s deleted\n", d.path())
			}
			if wait > 0 && rev > 0 {
				return a.waitProgrammed(cmd.Context(), rev, wait)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&files, "filename", "f", nil, `YAML file whose resources to delete ("-" for standard input); may repeat`)
	f.StringVarP(&a.namespace, "namespace", "n", "default", "namespace (ignored for nodes)")
	f.BoolVar(&ignoreNotFound, "ignore-not-found", false, "treat a resource that does not exist as deleted")
	addWaitFlag(f, &wait)
	return cmd
}

// document is one resource read from a file.
type document struct {
	label string // where it came from: "web.yaml: document 2 (Service default/web)"
	kind  *kind
	obj   object
}

// path is how output lines name the resource: "service/default/web".
func (d document) path() string { return d.kind.singular + "/" + d.kind.objRef(d.obj) }

// fail says which document the server refused, and why.
func (d document) fail(err error) error {
	err = plain(d.kind, err)
	if exitCode(err) == 3 {
		return err // the hint stands alone
	}
	return fmt.Errorf("%s: %w", d.label, err)
}

// readDocuments parses and checks every document of every file, so that a
// mistake anywhere stops the command before anything is sent.
func (a *app) readDocuments(files []string) ([]document, error) {
	if len(files) == 0 {
		return nil, usageErrorf("no file given: use -f FILE (or -f - for standard input)")
	}
	var docs []document
	for _, file := range files {
		data, err := a.readFile(file)
		if err != nil {
			return nil, err
		}
		name := file
		if file == "-" {
			name = "stdin"
		}
		n := 0
		for _, chunk := range yamldocs.Split(string(data)) {
			j, err := yaml.YAMLToJSONStrict([]byte(chunk))
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %v", name, n+1, err)
			}
			if string(j) == "null" { // only comments, or nothing
				continue
			}
			n++
			ds, err := a.parseDocument(fmt.Sprintf("%s: document %d", name, n), j)
			if err != nil {
				return nil, err
			}
			docs = append(docs, ds...)
		}
	}
	// A resource twice would pass the server's checks twice, then fail
	// half-way through as created twice.
	seen := map[string]string{}
	for _, d := range docs {
		if first, ok := seen[d.path()]; ok {
			return nil, fmt.Errorf("%s: the same resource as %s", d.label, first)
		}
		seen[d.path()] = d.label
	}
	return docs, nil
}

func (a *app) readFile(file string) ([]byte, error) {
	f, err := a.open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// open opens file for reading; "-" is standard input.
func (a *app) open(file string) (io.ReadCloser, error) {
	if file == "-" {
		return io.NopCloser(a.stdin), nil
	}
	return os.Open(file)
}

// parseDocument reads one document: a resource, or a list of them under
// "items" as get -o yaml prints.
func (a *app) parseDocument(label string, j []byte) ([]document, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(j, &fields); err != nil {
		return nil, fmt.Errorf("%s: not a mapping with a kind", label)
	}
	items, isList := fields["items"]
	if _, hasKind := fields["kind"]; hasKind || !isList {
		d, err := a.parseObject(label, fields)
		return []document{d}, err
	}
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(items, &list); err != nil {
		return nil, fmt.Errorf("%s: items: not a list of mappings", label)
	}
	var docs []document
	for i, item := range list {
		d, err := a.parseObject(fmt.Sprintf("%s, item %d", label, i+1), item)
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// parseObject turns "kind" plus protojson fields into a resource, and
// checks it as far as can be done without the server.
func (a *app) parseObject(label string, fields map[string]json.RawMessage) (document, error) {
	var name string
	if err := json.Unmarshal(fields["kind"], &name); err != nil || name == "" {
		return document{}, fmt.Errorf("%s: kind: want one of %s", label, strings.Join(kindNames(), ", "))
	}
	k := kindNamed(name)
	if k == nil {
		return document{}, fmt.Errorf("%s: kind: %q is not one of %s", label, name, strings.Join(kindNames(), ", "))
	}
	delete(fields, "kind")
	body, err := json.Marshal(fields)
	if err != nil {
		return document{}, err
	}
	obj := k.new()
	if err := protojson.Unmarshal(body, obj); err != nil {
		return document{}, fmt.Errorf("%s (%s): %s", label, k.name, protojsonError(obj.ProtoReflect().Descriptor(), body, err))
	}

	meta := metadata(obj)
	if k.namespaced && meta.Namespace == "" {
		meta.Namespace = a.namespace
	}
	meta.ResourceVersion, meta.Revision = "", 0 // apply replaces whatever is stored
	if meta.Name == "" {
		return document{}, fmt.Errorf("%s (%s): metadata.name: required", label, k.name)
	}
	d := document{label: fmt.Sprintf("%s (%s %s)", label, k.name, k.objRef(obj)), kind: k, obj: obj}
	if !k.namespaced && meta.Namespace != "" {
		return d, fmt.Errorf("%s: metadata.namespace: must be empty: a %s is cluster-scoped", d.label, k.name)
	}
	if err := checkFields(obj.ProtoReflect(), ""); err != nil {
		return d, fmt.Errorf("%s: %w", d.label, err)
	}
	return d, nil
}

// metadata returns o's metadata, creating it when the document had none.
func metadata(o object) *weirv1.ObjectMeta {
	m := o.ProtoReflect()
	return m.Mutable(m.Descriptor().Fields().ByName("metadata")).Message().Interface().(*weirv1.ObjectMeta)
}

// checkFields catches, before anything is sent, the mistakes that need no
// server to see: ports out of range and addresses that do not parse. It
// goes by field name, so it covers all kinds alike. The server checks
// everything again with its full rules; this only keeps a bad document
// from failing an apply half-way through. Paths and messages are the
// server's.
func checkFields(m protoreflect.Message, path string) error {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		p := string(fd.Name())
		if path != "" {
			p = path + "." + p
		}
		if err := checkField(m, fd, p); err != nil {
			return err
		}
	}
	return nil
}

// checkField checks m's field fd, found at path p: Weir's nested messages
// field by field, ports, and lists of addresses or CIDRs.
func checkField(m protoreflect.Message, fd protoreflect.FieldDescriptor, p string) error {
	name := string(fd.Name())
	switch {
	case fd.IsMap():
	case fd.Message() != nil && fd.IsList():
		return checkEach(m.Get(fd).List(), p, func(v protoreflect.Value, at string) error {
			return checkFields(v.Message(), at)
		})
	case fd.Message() != nil:
		if m.Has(fd) && fd.Message().ParentFile().Package() == "weir.v1" {
			return checkFields(m.Get(fd).Message(), p)
		}
	case fd.Kind() == protoreflect.Int32Kind && (name == "port" || strings.HasSuffix(name, "_port")):
		// A service's "port" is required; the other ports are
		// optional, 0 meaning none (or, for a BGP peer, 179).
		required := name == "port" && m.Descriptor().FullName() != "weir.v1.BgpPeer"
		if v := m.Get(fd).Int(); (v != 0 || required) && (v < 1 || v > 65535) {
			return fmt.Errorf("%s: %d is not a port (1-65535)", p, v)
		}
	case fd.IsList() && fd.Kind() == protoreflect.StringKind && m.Descriptor().FullName() != "weir.v1.AddressPool":
		// (A pool's addresses are CIDRs and ranges: the server checks them.)
		return checkEach(m.Get(fd).List(), p, func(v protoreflect.Value, at string) error {
			return checkAddress(name, at, v.String())
		})
	}
	return nil
}

// checkEach checks every item of the list at path p, in order.
func checkEach(l protoreflect.List, p string, check func(v protoreflect.Value, at string) error) error {
	for j := range l.Len() {
		if err := check(l.Get(j), fmt.Sprintf("%s[%d]", p, j)); err != nil {
			return err
		}
	}
	return nil
}

// checkAddress parses s when the field's name says it holds addresses or CIDRs.
func checkAddress(name, path, s string) error {
	switch {
	case strings.HasSuffix(name, "_ips") || name == "addresses":
		if _, err := netip.ParseAddr(s); err != nil {
			return fmt.Errorf("%s: %q is not an IP address", path, s)
		}
	case strings.HasSuffix(name, "_cidrs") || strings.HasSuffix(name, "_ranges"):
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("%s: %q is not a CIDR", path, s)
		}
	}
	return nil
}

// protojsonNoise is protojson's error prefix: "proto:" then a space that is
// sometimes a no-break space, then a position in the JSON that lbctl made
// from the YAML, which would only mislead.
var protojsonNoise = regexp.MustCompile(`^proto:[\s\x{a0}]*(\(line \d+:\d+\):[\s\x{a0}]*)?`)

// protojsonError explains why body is not a resource. protojson names an
// unknown field but not where it is; find its path.
func protojsonError(md protoreflect.MessageDescriptor, body []byte, err error) string {
	var v any
	if json.Unmarshal(body, &v) == nil {
		if p := unknownField(md, v, ""); p != "" {
			return p + ": unknown field"
		}
	}
	return protojsonNoise.ReplaceAllString(err.Error(), "")
}

// unknownField is the path of the first field in v that md does not have.
func unknownField(md protoreflect.MessageDescriptor, v any, path string) string {
	obj, ok := v.(map[string]any)
	if !ok || md.ParentFile().Package() != "weir.v1" {
		return ""
	}
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		p := name
		if path != "" {
			p = path + "." + name
		}
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			fd = md.Fields().ByJSONName(name) // protojson accepts both spellings
		}
		switch {
		case fd == nil:
			return p
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			items, _ := obj[name].([]any)
			for i, item := range items {
				if q := unknownField(fd.Message(), item, fmt.Sprintf("%s[%d]", p, i)); q != "" {
					return q
				}
			}
		default:
			if q := unknownField(fd.Message(), obj[name], p); q != "" {
				return q
			}
		}
	}
	return ""
}
