package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/servertest"
)

const fixture = `# a node, a service on it, and its endpoints
kind: Node
metadata:
  name: node1
  labels:
    rack: r1
addresses: [192.0.2.11]
zone: zone-a
pod_cidrs: [10.244.1.0/24]
---
kind: Service
metadata:
  name: web
  labels:
    app: web
spec:
  type: SERVICE_TYPE_NODE_PORT
  cluster_ips: [10.96.0.10]
  ports:
  - name: http
    port: 80
    target_port: 8080
    node_port: 30080
---
kind: EndpointSlice
metadata:
  name: web-1
service_name: web
endpoints:
- addresses: [10.244.1.5]
  node_name: node1
- addresses: [10.244.1.6]
  conditions: {ready: false}
- addresses: [10.244.1.7]
- addresses: [10.244.1.8]
ports:
- name: http
  port: 8080
`

// env is a real server on a loopback port and a clock for AGE.
type env struct {
	t        *testing.T
	addr     string
	registry weirv1.RegistryServiceClient
	now      time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := servertest.Start(t, t.TempDir())
	return &env{t: t, addr: srv.Addr, registry: srv.Registry, now: time.Now()}
}

// lbctl runs one command line in-process against the env's server.
func (e *env) lbctl(stdin string, args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, now: func() time.Time { return e.now }}
	code = a.run(append([]string{"--server", e.addr, "--insecure"}, args...))
	return out.String(), errOut.String(), code
}

// mustLbctl runs a command line that must succeed.
func (e *env) mustLbctl(stdin string, args ...string) string {
	e.t.Helper()
	out, errOut, code := e.lbctl(stdin, args...)
	if code != 0 {
		e.t.Fatalf("lbctl %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestApplyCreatesThenConfigures(t *testing.T) {
	e := newEnv(t)
	file := writeFile(t, "web.yaml", fixture)
	want := "node/node1 created\nservice/default/web created\nendpointslice/default/web-1 created\n"
	if got := e.mustLbctl("", "apply", "-f", file); got != want {
		t.Errorf("first apply:\n%s\nwant:\n%s", got, want)
	}
	want = strings.ReplaceAll(want, "created", "configured")
	if got := e.mustLbctl("", "apply", "-f", file); got != want {
		t.Errorf("second apply:\n%s\nwant:\n%s", got, want)
	}
}

func TestGetTables(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	e.mustLbctl(`kind: Service
metadata: {name: lb, namespace: edge}
spec:
  type: SERVICE_TYPE_LOAD_BALANCER
  cluster_ips: [10.96.0.20]
  external_ips: [198.51.100.1]
  external_traffic_policy: TRAFFIC_POLICY_LOCAL
  health_check_node_port: 32000
  ports: [{name: https, port: 443, node_port: 30443}, {name: dns, protocol: PROTOCOL_UDP, port: 53}]
status: {load_balancer_ips: [203.0.113.7]}
`, "apply", "-f", "-")
	svc, err := e.registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	// Fix the clock three hours after creation so that AGE reads 3h.
	e.now = svc.GetService().GetMetadata().GetCreateTime().AsTime().Add(3*time.Hour + 5*time.Minute)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "services"}, `
NAME   TYPE       CLUSTER-IPS   EXTERNAL-IPS   PORTS          AGE
web    NodePort   10.96.0.10    <none>         80:30080/TCP   3h
`},
		{[]string{"get", "svc", "-A", "-o", "wide"}, `
NAMESPACE   NAME   TYPE           CLUSTER-IPS   EXTERNAL-IPS               PORTS                  AGE   TRAFFIC-POLICY    HEALTH-CHECK-PORT   LABELS
default     web    NodePort       10.96.0.10    <none>                     80:30080/TCP           3h    Cluster/Cluster   <none>              app=web
edge        lb     LoadBalancer   10.96.0.20    198.51.100.1,203.0.113.7   443:30443/TCP,53/UDP   3h    Local/Cluster     32000               <none>
`},
		{[]string{"get", "eps"}, `
NAME    SERVICE   ENDPOINTS                                                     READY   AGE
web-1   web       10.244.1.5:8080,10.244.1.6:8080,10.244.1.7:8080 + 1 more...   3/4     3h
`},
		{[]string{"get", "nodes", "-n", "ignored"}, `
NAME    ADDRESSES    ZONE     POD-CIDRS       STATUS   AGE
node1   192.0.2.11   zone-a   10.244.1.0/24   Ready    3h
`},
		{[]string{"get", "service", "web", "-n", "default"}, `
NAME   TYPE       CLUSTER-IPS   EXTERNAL-IPS   PORTS          AGE
web    NodePort   10.96.0.10    <none>         80:30080/TCP   3h
`},
		{[]string{"get", "svc", "-A", "-l", "app=web"}, `
NAMESPACE   NAME   TYPE       CLUSTER-IPS   EXTERNAL-IPS   PORTS          AGE
default     web    NodePort   10.96.0.10    <none>         80:30080/TCP   3h
`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			if got := e.mustLbctl("", tc.args...); got != tc.want[1:] {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want[1:])
			}
		})
	}

	_, errOut, code := e.lbctl("", "get", "svc", "-n", "empty")
	if code != 0 || errOut != "No services found in namespace empty.\n" {
		t.Errorf("empty list: exit %d, stderr %q", code, errOut)
	}
}

func TestYAMLOutputAppliesBack(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	for _, typ := range []string{"services", "endpointslices", "nodes"} {
		out := e.mustLbctl("", "get", typ, "-o", "yaml")
		if !strings.HasPrefix(out, "items:\n- kind: ") {
			t.Errorf("get %s -o yaml does not start with a list of kinded items:\n%s", typ, out)
		}
		got := e.mustLbctl(out, "apply", "-f", "-")
		if !strings.HasSuffix(got, " configured\n") || strings.Count(got, "\n") != 1 {
			t.Errorf("applying get %s -o yaml back: %q, want one configured line", typ, got)
		}
	}
	one := e.mustLbctl("", "get", "svc", "web", "-o", "yaml")
	if !strings.HasPrefix(one, "kind: Service\nmetadata:\n") {
		t.Errorf("get svc web -o yaml is not one kinded object:\n%s", one)
	}
	if got := e.mustLbctl(one, "apply", "-f", "-"); got != "service/default/web configured\n" {
		t.Errorf("applying one object back: %q", got)
	}
}

func TestJSONOutputParsesBack(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	out := e.mustLbctl("", "get", "svc", "web", "-o", "json")
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &fields); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if string(fields["kind"]) != `"Service"` {
		t.Errorf("kind = %s, want \"Service\"", fields["kind"])
	}
	delete(fields, "kind")
	body, _ := json.Marshal(fields)
	var got weirv1.Service
	if err := protojson.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want, err := e.registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.GetService(), &got, protocmp.Transform()); diff != "" {
		t.Errorf("-o json differs from the stored service (-stored +printed):\n%s", diff)
	}

	list := e.mustLbctl("", "get", "nodes", "-o", "json")
	var items struct{ Items []map[string]any }
	if err := json.Unmarshal([]byte(list), &items); err != nil || len(items.Items) != 1 || items.Items[0]["kind"] != "Node" {
		t.Errorf("get nodes -o json: %v\n%s", err, list)
	}
}

func TestBadDocumentStopsEverything(t *testing.T) {
	e := newEnv(t)
	bad := strings.Replace(fixture, "port: 80\n", "port: 70000\n", 1)
	file := writeFile(t, "web.yaml", bad)
	out, errOut, code := e.lbctl("", "apply", "-f", file)
	want := "lbctl: " + file + ": document 2 (Service default/web): spec.ports[0].port: 70000 is not a port (1-65535)\n"
	if code != 1 || errOut != want || out != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
	}
	if _, errOut, code := e.lbctl("", "get", "node", "node1"); code != 1 || errOut != "lbctl: node node1 not found\n" {
		t.Errorf("after a rejected apply, get node node1: exit %d, %q; want it not found", code, errOut)
	}
	if _, errOut, _ := e.lbctl("", "apply", "--dry-run", "-f", file); errOut != want {
		t.Errorf("--dry-run: %q, want %q", errOut, want)
	}

	for _, tc := range []struct{ doc, want string }{
		// Checked by the server: its path comes back without the "service." prefix.
		{"kind: Service\nmetadata: {name: Web_1}\nspec: {cluster_ips: [10.96.0.11], ports: [{port: 80}]}\n",
			`document 1 (Service default/Web_1): metadata.name: "Web_1" is not a valid name`},
		{"kind: Service\nmetadata: {name: web}\nspec: {prots: []}\n", "document 1 (Service): spec.prots: unknown field"},
		{"kind: Node\nmetadata: {name: node9}\naddresses: [not-an-ip]\n", `document 1 (Node node9): addresses[0]: "not-an-ip" is not an IP address`},
		{"kind: Pod\n", `document 1: kind: "Pod" is not Service, EndpointSlice or Node`},
		{"---\nkind: Node\nmetadata: {name: a}\n---\nkind: Node\n", "document 2 (Node): metadata.name: required"},
	} {
		_, errOut, code := e.lbctl(tc.doc, "apply", "-f", "-")
		if code != 1 || !strings.HasPrefix(errOut, "lbctl: stdin: "+tc.want) {
			t.Errorf("apply %q: exit %d, %q; want exit 1 and %q", tc.doc, code, errOut, tc.want)
		}
	}
}

func TestErrorsAndExitCodes(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"get", "service", "nope"}, 1, "lbctl: service default/nope not found\n"},
		{[]string{"delete", "node", "nope"}, 1, "lbctl: node nope not found\n"},
		{[]string{"get", "pods"}, 2, "lbctl: unknown resource type \"pods\""},
		{[]string{"get"}, 2, "lbctl: accepts between 1 and 2 arg(s), received 0\n"},
		{[]string{"get", "svc", "-o", "xml"}, 2, "lbctl: --output \"xml\""},
		{[]string{"get", "svc", "--bogus"}, 2, "lbctl: unknown flag: --bogus\n"},
		{[]string{"frobnicate"}, 2, "lbctl: unknown command \"frobnicate\""},
		{[]string{"apply"}, 2, "lbctl: no file given"},
		{[]string{"get", "svc", "-l", "app=a=b"}, 1, "lbctl: label_selector: "},
	} {
		_, errOut, code := e.lbctl("", tc.args...)
		if code != tc.code || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("lbctl %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.want)
		}
	}

	out := e.mustLbctl("", "version")
	if want := "Client: dev\nServer: " + e.addr + " (SERVING)\n"; out != want {
		t.Errorf("version: %q, want %q", out, want)
	}
}

func TestUnreachableServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	for _, args := range [][]string{{"get", "svc"}, {"version"}, {"apply", "-f", "-"}} {
		var out, errOut bytes.Buffer
		a := &app{stdin: strings.NewReader(fixture), stdout: &out, stderr: &errOut, now: time.Now}
		code := a.run(append([]string{"--server", addr, "--insecure", "--timeout", "5s"}, args...))
		want := "lbctl: cannot reach the server at " + addr + " (is weir-server running? set --server or WEIR_SERVER)\n"
		if code != 3 || errOut.String() != want {
			t.Errorf("lbctl %s: exit %d, stderr %q; want exit 3 and %q", strings.Join(args, " "), code, errOut.String(), want)
		}
	}
}

func TestServerAndInsecureFromEnvironment(t *testing.T) {
	e := newEnv(t)
	t.Setenv("WEIR_SERVER", e.addr)
	t.Setenv("WEIR_INSECURE", "1")
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, now: time.Now}
	if code := a.run([]string{"version"}); code != 0 || !strings.Contains(out.String(), e.addr+" (SERVING)") {
		t.Errorf("with WEIR_SERVER and WEIR_INSECURE: exit %d, %q %q", code, out.String(), errOut.String())
	}
}

func TestDeleteFromFile(t *testing.T) {
	e := newEnv(t)
	file := writeFile(t, "web.yaml", fixture)
	e.mustLbctl("", "apply", "-f", file)
	want := "node/node1 deleted\nservice/default/web deleted\nendpointslice/default/web-1 deleted\n"
	if got := e.mustLbctl("", "delete", "-f", file); got != want {
		t.Errorf("delete -f:\n%s\nwant:\n%s", got, want)
	}
	for _, typ := range []string{"services", "endpointslices", "nodes"} {
		if _, errOut, _ := e.lbctl("", "get", typ, "-A"); !strings.HasPrefix(errOut, "No "+typ+" found") {
			t.Errorf("get %s after delete -f: %q", typ, errOut)
		}
	}
	if _, errOut, code := e.lbctl("", "delete", "-f", file); code != 1 || errOut != "lbctl: node node1 not found\n" {
		t.Errorf("deleting again: exit %d, %q", code, errOut)
	}
	if got := e.mustLbctl("", "delete", "-f", file, "--ignore-not-found"); got != "" {
		t.Errorf("deleting again with --ignore-not-found printed %q", got)
	}
}
