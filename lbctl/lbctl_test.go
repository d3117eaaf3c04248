//lint:file-ignore SA1019 the agents these tests fake report BGP sessions as the previous release did, in words only, which the server still reads

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
	"github.com/weirlb/weir/lbctl/convert"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/certs"
	"github.com/weirlb/weir/server/registry"
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

// TestMain keeps the tests away from the user's config file and environment.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lbctl-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("LBCTL_CONFIG", filepath.Join(dir, "absent.yaml"))
	os.Unsetenv("WEIR_SERVER")
	os.Unsetenv("WEIR_INSECURE")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is a real server on a loopback port and a clock for AGE.
type env struct {
	t        *testing.T
	srv      *servertest.Server
	addr     string
	registry weirv1.RegistryServiceClient
	now      time.Time
	// bgp and announced are, per node, the BGP sessions and
	// announcements its agent reports.
	bgp       map[string][]*weirv1.BgpSession
	announced map[string][]*weirv1.BgpAnnouncement
	// moved is, per node, what its agent reports of moved connections.
	moved map[string]*weirv1.MovedConnections
	// drains are, per node, what its agent reports it still serves while
	// drained.
	drains map[string]*weirv1.DrainStatus
}

func newEnv(t *testing.T) *env {
	t.Helper()
	// The examples' external IPs, and the load-balancer IPs they write as
	// an outside load balancer would, are allowed, as an operator would.
	srv := servertest.Start(t, t.TempDir(), func(c *server.Config) {
		rules := registry.DefaultServiceRules()
		rules.ExternalIPCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24")}
		c.ServiceRules = &rules
	})
	return &env{t: t, srv: srv, addr: srv.Addr, registry: srv.Registry, now: time.Now()}
}

// runLbctl runs one command line in-process, as typed: no flags added.
func runLbctl(ctx context.Context, now time.Time, stdin string, args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, now: func() time.Time { return now }}
	code = a.run(ctx, args)
	return out.String(), errOut.String(), code
}

// lbctl runs one command line in-process against the env's server.
func (e *env) lbctl(stdin string, args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	return runLbctl(context.Background(), e.now, stdin, append([]string{"--server", e.addr, "--insecure"}, args...)...)
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

func TestApplyCreatesThenLeavesAloneThenConfigures(t *testing.T) {
	e := newEnv(t)
	file := writeFile(t, "web.yaml", fixture)
	want := "node/node1 created\nservice/default/web created\nendpointslice/default/web-1 created\n"
	if got := e.mustLbctl("", "apply", "-f", file); got != want {
		t.Errorf("first apply:\n%s\nwant:\n%s", got, want)
	}
	version := func() string {
		t.Helper()
		svc, err := e.registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
		if err != nil {
			t.Fatal(err)
		}
		return svc.GetService().GetMetadata().GetResourceVersion()
	}
	before := version()
	want = strings.ReplaceAll(want, "created", "unchanged")
	if got := e.mustLbctl("", "apply", "-f", file); got != want {
		t.Errorf("second apply:\n%s\nwant:\n%s", got, want)
	}
	if after := version(); after != before {
		t.Errorf("an unchanged apply wrote: resource version %s, then %s", before, after)
	}
	changed := strings.Replace(fixture, "zone: zone-a", "zone: zone-b", 1)
	want = "node/node1 configured\nservice/default/web unchanged\nendpointslice/default/web-1 unchanged\n"
	if got := e.mustLbctl(changed, "apply", "-f", "-"); got != want {
		t.Errorf("apply with the node changed:\n%s\nwant:\n%s", got, want)
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
---
kind: Node
metadata: {name: node2}
addresses: [192.0.2.12]
`, "apply", "-f", "-")
	e.mustLbctl("", "node", "drain", "node2")
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
NAME    ADDRESSES    ZONE     POD-CIDRS       STATUS          AGE
node1   192.0.2.11   zone-a   10.244.1.0/24   Ready           3h
node2   192.0.2.12   <none>   <none>          Ready,Drained   3h
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
		if !strings.HasSuffix(got, " unchanged\n") || strings.Count(got, "\n") != 1 {
			t.Errorf("applying get %s -o yaml back: %q, want one unchanged line", typ, got)
		}
	}
	one := e.mustLbctl("", "get", "svc", "web", "-o", "yaml")
	if !strings.HasPrefix(one, "kind: Service\nmetadata:\n") {
		t.Errorf("get svc web -o yaml is not one kinded object:\n%s", one)
	}
	if got := e.mustLbctl(one, "apply", "-f", "-"); got != "service/default/web unchanged\n" {
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

	// JSON is YAML: what get prints, apply reads back, and finds unchanged.
	if got := e.mustLbctl(out, "apply", "-f", "-"); got != "service/default/web unchanged\n" {
		t.Errorf("applying get svc web -o json back: %q", got)
	}
	if got := e.mustLbctl(list, "apply", "-f", "-"); got != "node/node1 unchanged\n" {
		t.Errorf("applying get nodes -o json back: %q", got)
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
		{"kind: Pod\n", `document 1: kind: "Pod" is not one of Service, EndpointSlice, Node, AddressPool, BgpPeer, ServiceCidr`},
		{"---\nkind: Node\nmetadata: {name: a}\n---\nkind: Node\n", "document 2 (Node): metadata.name: required"},
		{"kind: Node\nmetadata: {name: a}\n---\nitems: [{kind: Node, metadata: {name: a}}]\n",
			"document 2, item 1 (Node a): the same resource as stdin: document 1 (Node a)"},
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
	if want := "Client: dev\nServer: " + e.addr + " (SERVING)\nServer Version: <none>\n"; out != want {
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
	for _, args := range [][]string{{"get", "svc"}, {"version"}, {"apply", "-f", "-"}, {"status"}, {"get", "svc", "-w"}, {"describe", "node", "n"}} {
		_, errOut, code := runLbctl(context.Background(), time.Now(), fixture, append([]string{"--server", addr, "--insecure", "--timeout", "5s"}, args...)...)
		want := "lbctl: cannot reach the server at " + addr + " (is weir-server running? set --server, WEIR_SERVER or a context)\n"
		if code != 3 || errOut != want {
			t.Errorf("lbctl %s: exit %d, stderr %q; want exit 3 and %q", strings.Join(args, " "), code, errOut, want)
		}
	}
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// TestSeveralServers: with several addresses (replicas), lbctl uses one
// that answers, whichever it tries first; when none does, it names them all.
func TestSeveralServers(t *testing.T) {
	e := newEnv(t)
	closed := closedAddr(t)
	for range 5 { // each run starts at a random address
		out, errOut, code := runLbctl(context.Background(), time.Now(), fixture, "--server", closed+","+e.addr, "--insecure", "apply", "-f", "-")
		if code != 0 {
			t.Fatalf("apply with --server %s,%s: exit %d, %q", closed, e.addr, code, errOut)
		}
		if !strings.Contains(out, "service/default/web") {
			t.Errorf("apply: %q", out)
		}
	}
	other := closedAddr(t)
	_, errOut, code := runLbctl(context.Background(), time.Now(), "", "--server", closed+","+other, "--insecure", "--timeout", "5s", "get", "svc")
	if code != 3 || !strings.HasPrefix(errOut, "lbctl: cannot reach the server at any of ") || !strings.Contains(errOut, closed) || !strings.Contains(errOut, other) {
		t.Errorf("get svc with two closed addresses: exit %d, %q; want exit 3 naming both", code, errOut)
	}
}

func TestServerAndInsecureFromEnvironment(t *testing.T) {
	e := newEnv(t)
	t.Setenv("WEIR_SERVER", e.addr)
	t.Setenv("WEIR_INSECURE", "1")
	if out, errOut, code := runLbctl(context.Background(), time.Now(), "", "version"); code != 0 || !strings.Contains(out, e.addr+" (SERVING)") {
		t.Errorf("with WEIR_SERVER and WEIR_INSECURE: exit %d, %q %q", code, out, errOut)
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

// lbFixture is a LoadBalancer service with a health check on two nodes, an
// endpoint on each: ready on node1, terminating on node2. Its status holds
// an outside load balancer's address, so that no pool assigns one.
const lbFixture = `kind: Node
metadata: {name: node1}
addresses: [192.0.2.11]
zone: zone-a
pod_cidrs: [10.244.1.0/24]
---
kind: Node
metadata: {name: node2, labels: {rack: r2}}
addresses: [192.0.2.12]
zone: zone-b
pod_cidrs: [10.244.2.0/24]
---
kind: Service
metadata: {name: lb, labels: {app: lb}}
spec:
  type: SERVICE_TYPE_LOAD_BALANCER
  cluster_ips: [10.96.0.20]
  external_traffic_policy: TRAFFIC_POLICY_LOCAL
  health_check_node_port: 32000
  ports: [{name: http, port: 80, target_port: 8080, node_port: 30080}]
status: {load_balancer_ips: [203.0.113.7]}
---
kind: EndpointSlice
metadata: {name: lb-1}
service_name: lb
endpoints:
- {addresses: [10.244.1.5], node_name: node1, zone: zone-a}
- {addresses: [10.244.2.5], node_name: node2, zone: zone-b, conditions: {ready: false, serving: true, terminating: true}}
ports: [{name: http, port: 8080}]
`

// agent plays node's weir-agent: it applies the state it is sent, reports
// its health and its services', and returns once the server shows it, with
// the function that ends its stream.
func (e *env) agent(node string, healthz int32, services ...*weirv1.ServiceHealth) (stop func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel) // before the server stops: cleanups run last first
	stream, err := e.srv.Agents.Sync(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	send := func(m *weirv1.SyncRequest) {
		if err := stream.Send(m); err != nil {
			e.t.Fatal(err)
		}
	}
	send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: node, AgentVersion: "v0.2.0"}}})
	// Applies whatever comes, the first state and any change after it.
	var sendMu sync.Mutex
	ack := func() error {
		msg, err := stream.Recv()
		if err != nil || msg.GetMore() {
			return err
		}
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Ack{Ack: &weirv1.Ack{Version: msg.GetVersion()}}})
	}
	go func() {
		for ack() == nil {
		}
	}()
	sendMu.Lock()
	send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Report{Report: &weirv1.Report{
		Full:             true,
		NodeHealth:       &weirv1.NodeHealth{HealthzCode: healthz, LivezCode: 200, NodeEligible: true},
		Services:         services,
		LastSyncDuration: durationpb.New(1500 * time.Microsecond),
		Bgp:              &weirv1.BgpSessions{Sessions: e.bgp[node], Announcements: e.announced[node]},
		MovedConnections: e.moved[node],
		Drain:            e.drains[node],
	}}})
	sendMu.Unlock()
	st := weirv1.NewStatusServiceClient(e.srv.Conn)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, n := range resp.GetNodes() {
			if n.GetName() == node && n.GetConnected() && n.GetAppliedVersion() == n.GetSentVersion() && n.GetHealth().GetHealthzCode() == healthz {
				return cancel
			}
		}
	}
	e.t.Fatalf("agent of %s: the server does not show it connected, programmed and reporting", node)
	return cancel
}

// lbEnv is lbFixture applied, with the clock three hours after.
func lbEnv(t *testing.T) *env {
	e := newEnv(t)
	e.mustLbctl(lbFixture, "apply", "-f", "-")
	svc, err := e.registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: "lb"})
	if err != nil {
		t.Fatal(err)
	}
	e.now = svc.GetService().GetMetadata().GetCreateTime().AsTime().Add(3*time.Hour + 5*time.Minute)
	return e
}

func lbHealth(code, ready int32) *weirv1.ServiceHealth {
	return &weirv1.ServiceHealth{Namespace: "default", Name: "lb", LocalReady: ready, LocalServing: ready,
		HealthCheckNodePort: 32000, HealthCheckCode: code}
}

// golden compares a command's output with the text after want's first newline.
func golden(t *testing.T, what, got, want string) {
	t.Helper()
	if want = want[1:]; got != want {
		t.Errorf("%s:\n%s\nwant:\n%s\ndiff (-want +got):\n%s", what, got, want, cmp.Diff(want, got))
	}
}

func TestDescribeServiceShowsEveryNode(t *testing.T) {
	e := lbEnv(t)
	e.agent("node1", 200, lbHealth(200, 1))
	e.agent("node2", 200, lbHealth(503, 0))
	for _, args := range [][]string{{"describe", "service", "default/lb"}, {"describe", "svc", "lb", "-n", "default"}} {
		golden(t, strings.Join(args, " "), e.mustLbctl("", args...), `
Name:                         lb
Namespace:                    default
Labels:                       app=lb
Source:                       native
Created:                      3h ago
Type:                         LoadBalancer
Cluster IPs:                  10.96.0.20
External IPs:                 <none>
LoadBalancer IPs:             203.0.113.7
LoadBalancer Source Ranges:   <none>
External Traffic Policy:      Local (health check node port 32000)
Internal Traffic Policy:      Cluster
Session Affinity:             None
Ports:
  NAME   PORT   PROTOCOL   TARGET PORT   NODE PORT
  http   80     TCP        8080          30080

Endpoints:
  NODE    ADDRESS      PORT(S)    READY   SERVING   TERMINATING   ZONE
  node1   10.244.1.5   8080/TCP   yes     yes       no            zone-a
  node2   10.244.2.5   8080/TCP   no      yes       yes           zone-b

Nodes:
  NODE    PROGRAMMED   APPLIED/SENT   LAG   HEALTH CHECK   LOCAL READY   EXTERNAL TRAFFIC   REASON
  node1   yes          1/1            0     200            1             yes                -
  node2   yes          1/1            0     503            0             no                 NoLocalEndpoints
  Not receiving on node2: no ready endpoint of the service on the node

Receiving external traffic: node1
`)
	}
	_, errOut, code := e.lbctl("", "describe", "service", "default/nope")
	if code != 1 || errOut != "lbctl: service default/nope not found\n" {
		t.Errorf("describe of a missing service: exit %d, %q", code, errOut)
	}
	if _, errOut, code := e.lbctl("", "describe", "eps", "lb-1"); code != 2 {
		t.Errorf("describe eps: exit %d, %q; want a usage error", code, errOut)
	}
}

func TestDescribeNode(t *testing.T) {
	e := lbEnv(t)
	// Drained before its agent connects, so that the agent has applied
	// it; the deadline 10 minutes after the env's clock (3h05m after the
	// server's).
	out := e.mustLbctl("", "node", "drain", "node2", "--drain-timeout", "3h15m")
	n, err := e.registry.GetNode(context.Background(), &weirv1.GetNodeRequest{Name: "node2"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := n.GetNode().GetDrainDeadline()
	if want := "node/node2 drained (drain deadline " + deadline.AsTime().Format(time.RFC3339) + ")\n"; out != want {
		t.Errorf("drain: %q, want %q", out, want)
	}
	e.drains = map[string]*weirv1.DrainStatus{"node2": {ConnectionsLeft: 12, CountedAt: timestamppb.New(e.now.Add(-2 * time.Second)), Deadline: deadline}}
	e.agent("node2", 503, lbHealth(503, 0))
	got := strings.ReplaceAll(e.mustLbctl("", "describe", "node", "node2"), deadline.AsTime().Format(time.RFC3339), "DEADLINE")
	golden(t, "describe node node2", got, `
Name:               node2
Labels:             rack=r2
Source:             native
Created:            3h ago
Addresses:          192.0.2.12
Zone:               zone-b
Pod CIDRs:          10.244.2.0/24
Deleting:           no
Drained:            yes
Drain Deadline:     in 10m (DEADLINE)
Connections Left:   12 (counted 2s ago)
Agent:
  Connected:             yes
  Last Seen:             3h ago
  Applied/Sent:          2/2
  Lag:                   0
  Last Error:            <none>
  Healthz:               503
  Livez:                 200
  Last Sync Duration:    1.5ms
  Programming Latency:   -
  Version:               v0.2.0
  Certificate Expires:   -

Services with health checks:
  SERVICE      PORT    HEALTH CHECK   LOCAL READY   EXTERNAL TRAFFIC   REASON
  default/lb   32000   503            0             no                 NodeDrained
`)
	golden(t, "describe node node1", e.mustLbctl("", "describe", "node", "node1"), `
Name:        node1
Labels:      <none>
Source:      native
Created:     3h ago
Addresses:   192.0.2.11
Zone:        zone-a
Pod CIDRs:   10.244.1.0/24
Deleting:    no
Drained:     no
Agent:
  Connected:             no
  Last Seen:             <never>
  Applied/Sent:          -
  Lag:                   -
  Last Error:            <none>
  Healthz:               -
  Livez:                 -
  Last Sync Duration:    -
  Programming Latency:   -
  Version:               -
  Certificate Expires:   -

Services with health checks:
  SERVICE      PORT    HEALTH CHECK   LOCAL READY   EXTERNAL TRAFFIC   REASON
  default/lb   32000   -              -             no                 Disconnected
`)
}

// A node that passes moved connections on says where to and what its
// rules counted; one that does not has no such section.
func TestDescribeNodeMovedConnections(t *testing.T) {
	e := lbEnv(t)
	e.moved = map[string]*weirv1.MovedConnections{"node1": {NextNode: "node2", NotAnswering: []string{"node3"}, PassedPackets: 1,
		PassedConnections: 1, TakenPacketsByHops: []uint64{5, 4, 0, 2}, UnownedPackets: 3, ChangedAt: timestamppb.New(e.now.Add(-4 * time.Second))}}
	e.agent("node1", 200, lbHealth(200, 1))
	e.agent("node2", 200, lbHealth(200, 1))
	out := e.mustLbctl("", "describe", "node", "node1")
	_, moved, ok := strings.Cut(out, "\nMoved Connections:\n")
	if !ok {
		t.Fatalf("describe node node1 has no Moved Connections section:\n%s", out)
	}
	golden(t, "describe node node1, moved connections", moved, `
  Next Node:          node2
  Not Answering:      node3
  Passed On:          1 packet, 1 connection
  Taken From Peers:   11 packets (1 hop: 5, 2: 4, 3: 0, 4+: 2)
  Unowned:            3 packets (round the ring: refused)
  Last Change:        4s ago
`)
	if out := e.mustLbctl("", "describe", "node", "node2"); strings.Contains(out, "Moved Connections") {
		t.Errorf("node2 reports nothing of moved connections, yet:\n%s", out)
	}
}

func TestStatus(t *testing.T) {
	e := lbEnv(t)
	e.mustLbctl("kind: AddressPool\nmetadata: {name: public}\naddresses: [203.0.113.0/28]\n---\n"+
		"kind: AddressPool\nmetadata: {name: v6}\naddresses: [\"2001:db8:113::/120\"]\n---\n"+
		// .0 and .255 not given out: 254 of the /24.
		"kind: AddressPool\nmetadata: {name: avoiding}\naddresses: [198.51.100.0/24]\navoid_buggy_ips: true\n", "apply", "-f", "-")
	e.bgp = map[string][]*weirv1.BgpSession{"node1": {
		{PeerAddress: "192.0.2.1", PeerAsn: 64500, State: "established", EstablishedSince: timestamppb.New(e.now.Add(-time.Hour))},
		{PeerAddress: "2001:db8:2::1", PeerAsn: 64500, State: "active"},
	}}
	e.agent("node1", 200, lbHealth(200, 1))
	out, errOut, code := e.lbctl("", "status")
	golden(t, "status", strings.ReplaceAll(out, e.addr, "ADDR"), `
Server:           ADDR (SERVING)
Version:          <none>
State version:    2
Uptime:           3h
Sources:          native
Agents:           1 connected, 2 nodes registered
Agent versions:   v0.2.0 (1)
Pools:            avoiding 0/254, public 1/16, v6 0/256

NAME    CONNECTED   APPLIED/SENT   LAG   HEALTHZ   BGP   DRAINED   LAST ERROR
node1   yes         2/2            0     200       1/2   no        <none>
node2   no          -              -     -         -     no        <none>
`)
	if want := "lbctl: 1 of 2 nodes not ready: node2 has never connected\n"; code != 1 || errOut != want {
		t.Errorf("status with node2 never connected: exit %d, %q; want exit 1 and %q", code, errOut, want)
	}

	e.agent("node2", 200)
	if out, errOut, code := e.lbctl("", "status"); code != 0 || errOut != "" || !strings.Contains(out, "2 connected, 2 nodes registered") {
		t.Errorf("status with both nodes programmed: exit %d, stderr %q\n%s", code, errOut, out)
	}
}

func TestDrainAndUncordon(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	drained := func() bool {
		t.Helper()
		n, err := e.registry.GetNode(context.Background(), &weirv1.GetNodeRequest{Name: "node1"})
		if err != nil {
			t.Fatal(err)
		}
		return n.GetNode().GetDrained()
	}
	if out := e.mustLbctl("", "node", "drain", "node1"); out != "node/node1 drained\n" || !drained() {
		t.Errorf("drain: %q, drained %v", out, drained())
	}
	// drained is output only: a drained node read back is no change.
	if got := e.mustLbctl(e.mustLbctl("", "get", "node", "node1", "-o", "yaml"), "apply", "-f", "-"); got != "node/node1 unchanged\n" || !drained() {
		t.Errorf("applying a drained node back: %q, drained %v", got, drained())
	}
	if out := e.mustLbctl("", "node", "uncordon", "node1"); out != "node/node1 uncordoned\n" || drained() {
		t.Errorf("uncordon: %q, drained %v", out, drained())
	}
	if _, errOut, code := e.lbctl("", "node", "drain", "nope"); code != 1 || errOut != "lbctl: node nope not found\n" {
		t.Errorf("draining an unknown node: exit %d, %q", code, errOut)
	}
}

// A drain's timeout: checked before anything is asked (a usage error, the
// node left as it was), a deadline the node is read back with (and apply
// takes as no change), kept by a drain again without one, changed by one
// with a timeout (cleared with 0), each saying what it did.
func TestDrainTimeout(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	deadline := func() *timestamppb.Timestamp {
		t.Helper()
		n, err := e.registry.GetNode(context.Background(), &weirv1.GetNodeRequest{Name: "node1"})
		if err != nil {
			t.Fatal(err)
		}
		return n.GetNode().GetDrainDeadline()
	}
	for _, tc := range []struct{ timeout, want string }{
		{"-1s", "lbctl: --drain-timeout: -1s is negative: want 0 (no deadline) or whole seconds up to 7 days\n"},
		{"1500ms", "lbctl: --drain-timeout: 1.5s is not whole seconds\n"},
		{"169h", "lbctl: --drain-timeout: 169h0m0s is more than 7 days (168h0m0s)\n"},
	} {
		if _, errOut, code := e.lbctl("", "node", "drain", "node1", "--drain-timeout", tc.timeout); code != 2 || errOut != tc.want {
			t.Errorf("--drain-timeout %s: exit %d, %q; want exit 2, %q", tc.timeout, code, errOut, tc.want)
		}
	}
	if n, _ := e.registry.GetNode(context.Background(), &weirv1.GetNodeRequest{Name: "node1"}); n.GetNode().GetDrained() {
		t.Error("a refused drain drained the node")
	}
	before := time.Now()
	out := e.mustLbctl("", "node", "drain", "node1", "--drain-timeout", "10m")
	d := deadline()
	if d == nil || d.AsTime().Before(before.Add(10*time.Minute)) || d.AsTime().After(time.Now().Add(10*time.Minute+time.Second)) {
		t.Fatalf("drained for 10m at %v: deadline %v", before, d)
	}
	if want := "node/node1 drained (drain deadline " + d.AsTime().Format(time.RFC3339) + ")\n"; out != want {
		t.Errorf("drain: %q, want %q", out, want)
	}
	// drain_deadline is output only: a drained node read back is no change.
	if got := e.mustLbctl(e.mustLbctl("", "get", "node", "node1", "-o", "yaml"), "apply", "-f", "-"); got != "node/node1 unchanged\n" || !proto.Equal(deadline(), d) {
		t.Errorf("applying a node with a deadline back: %q, deadline %v; want unchanged, %v", got, deadline(), d)
	}
	// Drained again: without a timeout the deadline stays; a timeout
	// changes it, 0 clears it, and each says what became of it.
	at := func(d *timestamppb.Timestamp) string { return d.AsTime().Format(time.RFC3339) }
	if out := e.mustLbctl("", "node", "drain", "node1"); out != "node/node1 already drained; drain deadline kept at "+at(d)+"\n" || !proto.Equal(deadline(), d) {
		t.Errorf("drained again without a timeout: %q, deadline %v; want %v kept", out, deadline(), d)
	}
	out = e.mustLbctl("", "node", "drain", "node1", "--drain-timeout", "1h")
	later := deadline()
	if want := "node/node1 already drained; drain deadline changed from " + at(d) + " to " + at(later) + "\n"; out != want || !later.AsTime().After(d.AsTime()) {
		t.Errorf("drained again for an hour: %q, deadline %v; want %q, after %v", out, later, want, d)
	}
	if out := e.mustLbctl("", "node", "drain", "node1", "--drain-timeout", "0"); out != "node/node1 already drained; drain deadline changed from "+at(later)+" to none\n" || deadline() != nil {
		t.Errorf("drained again with --drain-timeout 0: %q, deadline %v; want cleared", out, deadline())
	}
	if out := e.mustLbctl("", "node", "drain", "node1"); out != "node/node1 already drained; no drain deadline\n" || deadline() != nil {
		t.Errorf("drained again without a deadline: %q, deadline %v", out, deadline())
	}
}

// A drained node's page says when its connections end (or that they do
// not) and how many are left, as its agent last counted.
func TestDrainFields(t *testing.T) {
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	a := &app{now: func() time.Time { return now }}
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	drained := &weirv1.Node{Drained: true, DrainDeadline: ts(9*time.Minute + 30*time.Second)}
	for _, tc := range []struct {
		name  string
		node  *weirv1.Node
		drain *weirv1.DrainStatus
		want  []string
	}{
		{"not drained", &weirv1.Node{}, nil, nil},
		{"before the deadline", drained, &weirv1.DrainStatus{ConnectionsLeft: 12, CountedAt: ts(-2 * time.Second)},
			[]string{"Drain Deadline", "in 9m (2026-05-01T10:09:30Z)", "Connections Left", "12 (counted 2s ago)"}},
		{"after it", &weirv1.Node{Drained: true, DrainDeadline: ts(-3 * time.Minute)}, &weirv1.DrainStatus{CountedAt: ts(-time.Second), EndedAtDeadline: 12},
			[]string{"Drain Deadline", "passed 3m ago (2026-05-01T09:57:00Z)", "Connections Left", "0 (counted 1s ago), 12 ended at the deadline"}},
		{"no deadline, nothing reported", &weirv1.Node{Drained: true}, nil,
			[]string{"Drain Deadline", "<none>", "Connections Left", "<unknown>"}},
	} {
		if got := a.drainFields(tc.node, tc.drain); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestApplyIsAllOrNothing(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-") // web holds 10.96.0.10
	// Both documents are fine alone; the second wants web's cluster IP,
	// which only the server knows.
	file := writeFile(t, "two.yaml", `kind: Service
metadata: {name: api}
spec: {cluster_ips: [10.96.0.30], ports: [{port: 80}]}
---
kind: Service
metadata: {name: other}
spec: {cluster_ips: [10.96.0.10], ports: [{port: 80}]}
`)
	out, errOut, code := e.lbctl("", "apply", "-f", file)
	want := "lbctl: " + file + ": document 2 (Service default/other): in use: spec.cluster_ips[0]: 10.96.0.10 is the cluster IP of service default/web\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
	}
	if _, errOut, code := e.lbctl("", "get", "svc", "api"); code != 1 || errOut != "lbctl: service default/api not found\n" {
		t.Errorf("document 1 was written although document 2 was refused: exit %d, %q", code, errOut)
	}
}

// Documents that each pass alone but conflict with each other (checked
// one by one, both are fine) are refused together by the server: nothing
// is written, and the refusal names the second.
func TestApplyIsAllOrNothingOnTheServer(t *testing.T) {
	e := newEnv(t)
	file := writeFile(t, "pair.yaml", `kind: Service
metadata: {name: first}
spec: {type: SERVICE_TYPE_NODE_PORT, cluster_ips: [10.96.0.41], ports: [{port: 80, node_port: 30041}]}
---
kind: Service
metadata: {name: second}
spec: {type: SERVICE_TYPE_NODE_PORT, cluster_ips: [10.96.0.42], ports: [{port: 80, node_port: 30041}]}
`)
	out, errOut, code := e.lbctl("", "apply", "-f", file)
	want := "lbctl: " + file + ": document 2 (Service default/second): in use: spec.ports[0].node_port: 30041 is a node port of service default/first\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
	}
	if _, errOut, code := e.lbctl("", "get", "svc", "first"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("document 1 was written although document 2 was refused: exit %d, %q", code, errOut)
	}
	// Fixed, the file goes in as one write: one revision for both.
	fixed := mustRead(t, file)
	fixed = fixed[:strings.LastIndex(fixed, "30041")] + "30042" + fixed[strings.LastIndex(fixed, "30041")+5:]
	if err := os.WriteFile(file, []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := e.mustLbctl("", "apply", "-f", file); out != "service/default/first created\nservice/default/second created\n" {
		t.Errorf("apply: %q", out)
	}
	rv := func(name string) string {
		var svc struct {
			Metadata struct {
				ResourceVersion string `json:"resource_version"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal([]byte(e.mustLbctl("", "get", "svc", name, "-o", "json")), &svc); err != nil {
			t.Fatal(err)
		}
		return svc.Metadata.ResourceVersion
	}
	if a, b := rv("first"), rv("second"); a != b || a == "" {
		t.Errorf("the two services were written at revisions %q and %q; want one", a, b)
	}
}

func mustRead(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDryRunShowsTheDiffAndWritesNothing(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	changed := strings.Replace(fixture, "port: 80\n", "port: 81\n", 1) + `---
kind: Node
metadata: {name: node2}
`
	golden(t, "apply --dry-run", e.mustLbctl(changed, "apply", "--dry-run", "-f", "-"), `
node/node1 unchanged
service/default/web configured (dry run)
--- current
+++ desired
@@ -12,7 +12,7 @@
   ports:
   - name: http
     node_port: 30080
-    port: 80
+    port: 81
     protocol: PROTOCOL_TCP
     target_port: 8080
   session_affinity: SESSION_AFFINITY_NONE
endpointslice/default/web-1 unchanged
node/node2 created (dry run)
`)
	svc, err := e.registry.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "default", Name: "web"})
	if err != nil || svc.GetService().GetSpec().GetPorts()[0].GetPort() != 80 {
		t.Errorf("--dry-run changed the service: %v, %v", svc, err)
	}
	if _, errOut, code := e.lbctl("", "get", "node", "node2"); code != 1 {
		t.Errorf("--dry-run created node2: exit %d, %q", code, errOut)
	}
}

func TestLineDiff(t *testing.T) {
	for _, tc := range []struct{ a, b, want string }{
		{"a\nb\nc\n", "a\nb\nc\n", ""},
		{"", "x\n", "@@ -0,0 +1 @@\n+x\n"},
		{"x\ny\n", "y\n", "@@ -1,2 +1 @@\n-x\n y\n"},
		{"a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "a\nB\nc\nd\ne\nf\ng\nh\nI\nj\n",
			"@@ -1,10 +1,10 @@\n a\n-b\n+B\n c\n d\n e\n f\n g\n h\n-i\n+I\n j\n"},
		{"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n13\n",
			"@@ -10,3 +10,4 @@\n 10\n 11\n 12\n+13\n"},
	} {
		if got := unified(lineDiff(lines(tc.a), lines(tc.b)), 3); got != tc.want {
			t.Errorf("diff %q %q:\n%s\nwant:\n%s", tc.a, tc.b, got, tc.want)
		}
	}
}

// syncBuffer is a buffer a running command writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// watch starts a watching command line; stop cancels it as Ctrl-C would
// and returns its exit code and stderr.
func (e *env) watch(args ...string) (out *syncBuffer, stop func() (int, string)) {
	ctx, cancel := context.WithCancel(context.Background())
	out = &syncBuffer{}
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		a := &app{stdin: strings.NewReader(""), stdout: out, stderr: &errOut, now: func() time.Time { return e.now }}
		done <- a.run(ctx, append([]string{"--server", e.addr, "--insecure"}, args...))
	}()
	e.t.Cleanup(cancel)
	return out, func() (int, string) {
		cancel()
		return <-done, errOut.String()
	}
}

// waitFor waits until out holds want.
func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(out.String(), want) {
			return
		}
	}
	t.Fatalf("waited for %q; output so far:\n%s", want, out.String())
}

func TestGetWatchPrintsStateThenChanges(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(fixture, "apply", "-f", "-")
	e.now = time.Now()
	out, stop := e.watch("get", "services", "--watch")
	waitFor(t, out, "ADDED      web    NodePort   10.96.0.10    <none>         80:30080/TCP   0s\n")
	e.mustLbctl("kind: Service\nmetadata: {name: db}\nspec: {type: SERVICE_TYPE_NODE_PORT, cluster_ips: [10.96.0.11], ports: [{port: 81, node_port: 30081}]}\n", "apply", "-f", "-")
	e.mustLbctl(strings.Replace(fixture, "port: 80\n", "port: 81\n", 1), "apply", "-f", "-")
	e.mustLbctl("", "delete", "service", "db")
	waitFor(t, out, "DELETED")
	if code, errOut := stop(); code != 0 || errOut != "" {
		t.Errorf("watch ended by cancel: exit %d, stderr %q; want exit 0", code, errOut)
	}
	golden(t, "get services --watch", out.String(), `
EVENT      NAME   TYPE       CLUSTER-IPS   EXTERNAL-IPS   PORTS          AGE
ADDED      web    NodePort   10.96.0.10    <none>         80:30080/TCP   0s
ADDED      db     NodePort   10.96.0.11    <none>         81:30081/TCP   0s
MODIFIED   web    NodePort   10.96.0.10    <none>         81:30080/TCP   0s
DELETED    db     NodePort   10.96.0.11    <none>         81:30081/TCP   0s
`)

	yamlOut, stop := e.watch("get", "nodes", "-w", "-o", "yaml")
	waitFor(t, yamlOut, "name: node1\n")
	e.mustLbctl(strings.Replace(fixture, "zone: zone-a", "zone: zone-b", 1), "apply", "-f", "-")
	waitFor(t, yamlOut, "---\nkind: Node\n")
	if code, _ := stop(); code != 0 {
		t.Errorf("yaml watch: exit %d", code)
	}
	docs := yamldocs.Split(yamlOut.String())
	if len(docs) != 2 || !strings.Contains(docs[1], "zone: zone-b") {
		t.Errorf("yaml watch: want two documents, the second in zone-b:\n%s", yamlOut.String())
	}

	jsonOut, stop := e.watch("get", "endpoints", "-w", "-o", "json")
	waitFor(t, jsonOut, "}\n")
	stop()
	for _, line := range lines(jsonOut.String()) {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil || obj["kind"] != "EndpointSlice" {
			t.Errorf("json watch line %q: %v", line, err)
		}
	}
}

func TestContexts(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "weir", "lbctl.yaml")
	t.Setenv("LBCTL_CONFIG", config)
	run := func(args ...string) (string, string, int) { return runLbctl(context.Background(), e.now, "", args...) }
	must := func(want string, args ...string) {
		t.Helper()
		if out, errOut, code := run(args...); code != 0 || out != want {
			t.Errorf("lbctl %s: exit %d, stdout %q, stderr %q; want %q", strings.Join(args, " "), code, out, errOut, want)
		}
	}

	if _, errOut, code := run("config", "get-contexts"); code != 0 || errOut != "No contexts in "+config+".\n" {
		t.Errorf("get-contexts without a file: exit %d, %q", code, errOut)
	}
	must(`Context "lab" created.`+"\n", "config", "set-context", "lab", "--server", "192.0.2.2:7443",
		"--ca-file", "/etc/weir/tls/ca.crt", "--cert-file", "/etc/weir/tls/admin.crt", "--key-file", "/etc/weir/tls/admin.key")
	must(`Context "demo" created.`+"\n", "config", "set-context", "demo", "--server", "127.0.0.1:7443", "--insecure")
	must(`Switched to context "lab".`+"\n", "config", "use-context", "lab")
	out, _, _ := run("config", "get-contexts")
	golden(t, "get-contexts", out, `
CURRENT   NAME   SERVER           INSECURE   CERT-FILE
*         lab    192.0.2.2:7443   no         /etc/weir/tls/admin.crt
          demo   127.0.0.1:7443   yes        <none>
`)
	if fi, err := os.Stat(config); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config file: %v, %v; want mode 0600", fi, err)
	}

	// --context picks the server; flags and the environment beat the context.
	must(`Context "demo" modified.`+"\n", "config", "set-context", "demo", "--server", e.addr)
	want := "Client: dev\nServer: " + e.addr + " (SERVING)\nServer Version: <none>\n"
	must(want, "--context", "demo", "version")
	must(want, "version", "--server", e.addr, "--insecure")
	t.Setenv("WEIR_SERVER", e.addr)
	t.Setenv("WEIR_INSECURE", "1")
	must(want, "version")
	t.Setenv("WEIR_SERVER", "")
	t.Setenv("WEIR_INSECURE", "")
	// lab's CA file does not exist: proof that lab is in use.
	if _, errOut, code := run("version"); code != 1 || !strings.Contains(errOut, "/etc/weir/tls/ca.crt") {
		t.Errorf("version with the current context lab: exit %d, %q; want lab's CA file named", code, errOut)
	}
	must(`Switched to context "demo".`+"\n", "config", "use-context", "demo")
	must(want, "version")

	if _, errOut, code := run("config", "use-context", "nope"); code != 1 || errOut != `lbctl: no context "nope" in `+config+"\n" {
		t.Errorf("use-context nope: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run("--context", "nope", "get", "svc"); code != 2 || !strings.Contains(errOut, `--context "nope"`) {
		t.Errorf("--context nope: exit %d, %q", code, errOut)
	}

	bad := writeFile(t, "bad.yaml", "current-context: lab\ncontexts:\n- name: lab\n  sever: 192.0.2.2:7443\n")
	for _, args := range [][]string{{"get", "svc"}, {"config", "get-contexts"}} {
		_, errOut, code := run(append([]string{"--config", bad}, args...)...)
		if code != 1 || !strings.HasPrefix(errOut, "lbctl: config file "+bad+": ") || !strings.Contains(errOut, "sever") {
			t.Errorf("lbctl %s with a misspelt key: exit %d, %q; want exit 1 naming the file and the key", strings.Join(args, " "), code, errOut)
		}
	}
}

// startTLSServer runs a server with mTLS: a new CA in dir, the server's
// certificate for 127.0.0.1, and a viewer's client certificate "victor".
func startTLSServer(t *testing.T, options ...func(*server.Config)) (dir string, srv *servertest.Server) {
	t.Helper()
	dir = t.TempDir()
	for _, err := range []error{certs.InitCA(dir), certs.IssueServer(dir, []string{"127.0.0.1"}), certs.IssueClient(dir, "victor", certs.RoleViewer)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir, servertest.Start(t, t.TempDir(), append([]func(*server.Config){servertest.TLS(t, dir)}, options...)...)
}

// TestViewerMayReadNotWrite runs the server with mTLS; the context names
// its files relative to the config file.
func TestViewerMayReadNotWrite(t *testing.T) {
	dir, srv := startTLSServer(t)
	config := filepath.Join(dir, "lbctl.yaml")
	if err := os.WriteFile(config, []byte(`current-context: view
contexts:
- name: view
  server: `+srv.Addr+`
  ca-file: ca.crt
  cert-file: victor.crt
  key-file: victor.key
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runLbctl(context.Background(), time.Now(), "", "--config", config, "get", "nodes"); code != 0 || errOut != "No nodes found.\n" {
		t.Errorf("viewer get nodes: exit %d, %q", code, errOut)
	}
	_, errOut, code := runLbctl(context.Background(), time.Now(), "", "--config", config, "node", "drain", "node1")
	want := `lbctl: permission denied: victor (role "viewer") may not call /weir.v1.RegistryService/DrainNode; it needs one of the roles [admin]` + "\n"
	if code != 1 || errOut != want {
		t.Errorf("viewer drain: exit %d, %q; want %q", code, errOut, want)
	}
}

func TestPools(t *testing.T) {
	e := newEnv(t)
	const pools = `kind: AddressPool
metadata:
  name: public
addresses:
- 203.0.113.0/28
bgp_advertisement:
  peers: [tor-a]
  aggregation_length: 28
  communities: [no-export]
---
kind: AddressPool
metadata:
  name: reserved
addresses:
- 198.51.100.10-198.51.100.20
manual_only: true
---
kind: AddressPool
metadata:
  name: rack-lan
addresses:
- 192.0.2.200-192.0.2.209
l2_advertisement:
  interfaces: [eth0, bond0.100]
---
kind: AddressPool
metadata:
  name: split
addresses:
- 198.51.100.128/26
avoid_buggy_ips: true
bgp_advertisements:
- service_selector: {env: prod}
  communities: ["64512:1"]
- service_selector: {env: dev}
  node_selector: {rack: r1}
  communities: ["64512:2"]
`
	out := e.mustLbctl(pools, "apply", "-f", "-")
	if out != "pool/public created\npool/reserved created\npool/rack-lan created\npool/split created\n" {
		t.Errorf("apply: %q", out)
	}
	got := e.mustLbctl("", "get", "pools")
	want := "NAME       ADDRESSES                       MODE   AUTO-ASSIGN   AGE\n" +
		"public     203.0.113.0-203.0.113.15        bgp    yes           0s\n" +
		"rack-lan   192.0.2.200-192.0.2.209         l2     yes           0s\n" +
		"reserved   198.51.100.10-198.51.100.20     bgp    no            0s\n" +
		"split      198.51.100.128-198.51.100.191   bgp    yes           0s\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("get pools (-want +got):\n%s", diff)
	}
	got = e.mustLbctl("", "get", "pools", "-o", "wide")
	want = "NAME       ADDRESSES                       MODE   AUTO-ASSIGN   AGE   ADVERTISEMENTS   AVOID-BUGGY-IPS   PEERS       INTERFACES       AGGREGATION   LOCAL-PREF   COMMUNITIES   LABELS\n" +
		"public     203.0.113.0-203.0.113.15        bgp    yes           0s    1                no                tor-a       -                /28,/128      <none>       no-export     <none>\n" +
		"rack-lan   192.0.2.200-192.0.2.209         l2     yes           0s    -                no                -           eth0,bond0.100   /32,/128      <none>       <none>        <none>\n" +
		"reserved   198.51.100.10-198.51.100.20     bgp    no            0s    1                no                all         -                /32,/128      <none>       <none>        <none>\n" +
		"split      198.51.100.128-198.51.100.191   bgp    yes           0s    2                yes               <several>   -                <several>     <several>    <several>     <none>\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("get pools -o wide (-want +got):\n%s", diff)
	}
	// Each advertisement's fields are named in a refusal, and a namespace
	// selector, which this API's namespaces have no labels for, is refused.
	for doc, field := range map[string]string{
		"bgp_advertisements:\n- {}\n- node_selector: {\"bad key\": x}\n":              "bgp_advertisements[1].node_selector",
		"bgp_advertisements:\n- {service_selector: {a: b}, aggregation_length: 30}\n": "bgp_advertisements[0].service_selector",
		"service_allocation:\n  namespace_selector: {tenant: a}\n":                    "service_allocation.namespace_selector",
	} {
		_, stderr, code := e.lbctl("kind: AddressPool\nmetadata:\n  name: bad\naddresses:\n- 192.0.2.224/30\n"+doc, "apply", "-f", "-")
		if code != 1 || !strings.Contains(stderr, field) {
			t.Errorf("%q: exit %d, %q; want a refusal naming %s", doc, code, stderr, field)
		}
	}
	// An L2 pool is announced over BGP too by bgp_advertisements; its one
	// bgp_advertisement, even empty, is refused, naming the field and
	// where it goes.
	for _, adv := range []string{"bgp_advertisement:\n  local_preference: 100\n", "bgp_advertisement: {}\n"} {
		_, stderr, code := e.lbctl("kind: AddressPool\nmetadata:\n  name: both\naddresses:\n- 192.0.2.220/30\nl2_advertisement: {}\n"+adv, "apply", "-f", "-")
		if code != 1 || !strings.Contains(stderr, "bgp_advertisement:") || !strings.Contains(stderr, "by its bgp_advertisements") {
			t.Errorf("an L2 pool with %q: exit %d, %q", adv, code, stderr)
		}
	}
	e.mustLbctl("kind: AddressPool\nmetadata:\n  name: both\naddresses:\n- 192.0.2.220/30\nl2_advertisement: {}\nbgp_advertisements:\n- {}\n", "apply", "-f", "-")
	if got := e.mustLbctl("", "get", "pool", "both"); !strings.Contains(got, "192.0.2.220-192.0.2.223   l2+bgp") {
		t.Errorf("an L2 pool announced over BGP too: %q; want mode l2+bgp", got)
	}
	var code int
	var stderr string
	// An overlapping pool is refused by the server, naming the document.
	_, stderr, code = e.lbctl("kind: AddressPool\nmetadata:\n  name: clash\naddresses:\n- 203.0.113.8/29\n", "apply", "-f", "-")
	if code != 1 || !strings.Contains(stderr, "document 1") || !strings.Contains(stderr, "overlaps pool public") {
		t.Errorf("overlapping pool: exit %d, %q", code, stderr)
	}
}

func TestPeers(t *testing.T) {
	e := newEnv(t)
	const peers = `kind: BgpPeer
metadata:
  name: tor-a
address: 192.0.2.1
asn: 64500
my_asn: 64512
password: s3cret
node_selector:
  rack: r1
---
kind: BgpPeer
metadata:
  name: tor-b
address: 2001:db8::1
port: 1179
asn: 64501
my_asn: 64512
graceful_restart: true
---
kind: BgpPeer
metadata:
  name: rr-1
address: 198.51.100.1
asn: 4200000100
my_asn: 4200000001
hold_time_seconds: 30
ebgp_multihop_ttl: 2
source_address: 192.0.2.11
keepalive_seconds: 10
connect_retry_seconds: 5
bfd:
  receive_interval_ms: 100
  detect_multiplier: 4
`
	if out := e.mustLbctl(peers, "apply", "-f", "-"); out != "peer/tor-a created\npeer/tor-b created\npeer/rr-1 created\n" {
		t.Errorf("apply: %q", out)
	}
	got := e.mustLbctl("", "get", "peers")
	want := "NAME    ADDRESS              ASN          MY-ASN       NODES     AGE\n" +
		"rr-1    198.51.100.1         4200000100   4200000001   all       0s\n" +
		"tor-a   192.0.2.1            64500        64512        rack=r1   0s\n" +
		"tor-b   [2001:db8::1]:1179   64501        64512        all       0s\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("get peers (-want +got):\n%s", diff)
	}
	got = e.mustLbctl("", "get", "peers", "-o", "wide")
	want = "NAME    ADDRESS              ASN          MY-ASN       NODES     AGE   GRACEFUL-RESTART   MULTIHOP-TTL   SOURCE       HOLD        KEEPALIVE   CONNECT-RETRY   BFD              LABELS\n" +
		"rr-1    198.51.100.1         4200000100   4200000001   all       0s    no                 2              192.0.2.11   30s         10s         5s              100ms/300ms x4   <none>\n" +
		"tor-a   192.0.2.1            64500        64512        rack=r1   0s    no                 <none>         <none>       <default>   <default>   <default>       <none>           <none>\n" +
		"tor-b   [2001:db8::1]:1179   64501        64512        all       0s    yes                <none>         <none>       <default>   <default>   <default>       <none>           <none>\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("get peers -o wide (-want +got):\n%s", diff)
	}
	// The password is write-only.
	if out := e.mustLbctl("", "get", "peer", "tor-a", "-o", "yaml"); strings.Contains(out, "s3cret") {
		t.Errorf("the password was read back:\n%s", out)
	}
	_, stderr, code := e.lbctl("kind: BgpPeer\nmetadata:\n  name: bad\naddress: 192.0.2.9\nasn: 64500\n", "apply", "-f", "-")
	if code != 1 || !strings.Contains(stderr, "my_asn") {
		t.Errorf("peer without my_asn: exit %d, %q", code, stderr)
	}
}

func TestDescribeServiceShowsAnnouncements(t *testing.T) {
	e := lbEnv(t)
	e.bgp = map[string][]*weirv1.BgpSession{"node1": {{PeerAddress: "192.0.2.1", PeerAsn: 64500, State: "established",
		LastError: "the router sent NOTIFICATION code 6(cease) subcode 4(administrative reset)",
		Families:  []*weirv1.BgpFamily{{Family: "ipv4", Negotiated: true, Sent: 2}, {Family: "ipv6"}}}}}
	e.announced = map[string][]*weirv1.BgpAnnouncement{"node1": {
		{Prefix: "203.0.113.7/32", NextHop: "192.0.2.11", Weight: 1},
		{Prefix: "203.0.113.99/32", NextHop: "192.0.2.11"}, // another service's
	}}
	stop := e.agent("node1", 200, lbHealth(200, 1))
	if node := e.mustLbctl("", "describe", "node", "node1"); !strings.Contains(node, "the router sent NOTIFICATION code 6(cease) subcode 4(administrative reset)") ||
		!strings.Contains(node, "ipv4 sent 2 accepted 0; ipv6 not negotiated") {
		t.Errorf("describe node: want the session's last error\n%s", node)
	}
	out := e.mustLbctl("", "describe", "service", "default/lb")
	want := "\nBGP announcements:\n" +
		"  PREFIX           NODE    NEXT HOP     WEIGHT   SESSIONS\n" +
		"  203.0.113.7/32   node1   192.0.2.11   1        1/1\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("describe service: want it to end with\n%s\ngot\n%s", want, out)
	}

	// The agent goes: what it said is no longer shown as current.
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if out = e.mustLbctl("", "describe", "service", "default/lb"); strings.Contains(out, "unknown (agent gone") {
			break
		}
	}
	if !strings.Contains(out, "203.0.113.7/32   node1   192.0.2.11   1        unknown (agent gone") {
		t.Errorf("describe service after node1's agent went: want its announcement unknown\n%s", out)
	}
	if node := e.mustLbctl("", "describe", "node", "node1"); !strings.Contains(node, "unknown (agent gone") || !strings.Contains(node, "(last reported established)") {
		t.Errorf("describe node after its agent went: want its BGP session unknown\n%s", node)
	}
}

func TestDescribeServiceShowsSpeakerPaths(t *testing.T) {
	e := lbEnv(t)
	e.agent("node1", 200, lbHealth(200, 1))
	lb := weirv1.NewLoadBalancerTierServiceClient(e.srv.Conn)
	watchCtx, endWatch := context.WithCancel(context.Background())
	defer endWatch()
	watch, err := lb.WatchTargets(watchCtx, &weirv1.WatchTargetsRequest{Speaker: "lb1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := lb.ReportSpeaker(context.Background(), &weirv1.ReportSpeakerRequest{Status: &weirv1.SpeakerStatus{Name: "lb1", Paths: []*weirv1.SpeakerPath{
		{Prefix: "203.0.113.7/32", Service: "default/lb", Node: "node1", NextHop: "192.0.2.11", Weight: 2, Announced: true, Probe: "200"},
		{Prefix: "203.0.113.7/32", Service: "default/lb", Node: "node2", NextHop: "192.0.2.12", Weight: 1, Probe: "timeout", Reason: "ProbeFailing"},
		{Prefix: "203.0.113.99/32", Service: "default/other", Node: "node1", NextHop: "192.0.2.11", Announced: true},
	}}}); err != nil {
		t.Fatal(err)
	}
	out := e.mustLbctl("", "describe", "service", "default/lb")
	want := "\nLoad-balancer speakers:\n" +
		"  SPEAKER   PREFIX           NODE    NEXT HOP     WEIGHT   ANNOUNCED   PROBE     REASON\n" +
		"  lb1       203.0.113.7/32   node1   192.0.2.11   2        yes         200       -\n" +
		"  lb1       203.0.113.7/32   node2   192.0.2.12   1        no          timeout   ProbeFailing\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("describe service: want it to end with\n%s\ngot\n%s", want, out)
	}

	// The speaker stops watching: its paths are no longer current.
	endWatch()
	deadline := time.Now().Add(5 * time.Second)
	for ; time.Now().Before(deadline) && !strings.Contains(out, "speaker gone"); time.Sleep(10 * time.Millisecond) {
		out = e.mustLbctl("", "describe", "service", "default/lb")
	}
	if !strings.Contains(out, "lb1       203.0.113.7/32   node1   192.0.2.11   2        unknown (speaker gone 3h ago, last reported yes)") { // the test clock is 3 h ahead
		t.Errorf("describe service after the speaker left: want its paths unknown\n%s", out)
	}
}

// TestGetReadsEveryPage: the server answers lists in pages of at most 500
// by default; lbctl shows every item.
func TestGetReadsEveryPage(t *testing.T) {
	e := newEnv(t)
	const n = 510
	for i := range n {
		if _, err := e.registry.CreateNode(context.Background(), &weirv1.CreateNodeRequest{Node: &weirv1.Node{
			Metadata: &weirv1.ObjectMeta{Name: fmt.Sprintf("node%03d", i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	out := e.mustLbctl("", "get", "nodes")
	if rows := strings.Count(out, "\n") - 1; rows != n || !strings.Contains(out, "node509") {
		t.Errorf("lbctl get nodes shows %d rows; want %d, node509 among them", rows, n)
	}
}

// TestApplyAndDeleteWaitUntilEveryNodeForwardsTheWrite: with --wait, apply
// and delete return once every connected node has applied the write; a
// node that does not in time is named, with exit code 4.
func TestApplyAndDeleteWaitUntilEveryNodeForwardsTheWrite(t *testing.T) {
	e := newEnv(t)
	file := writeFile(t, "web.yaml", fixture)
	e.mustLbctl("", "apply", "-f", file)
	e.agent("node1", 200)

	changed := writeFile(t, "web2.yaml", strings.Replace(fixture, "zone: zone-a", "zone: zone-b", 1))
	out, errOut, code := e.lbctl("", "apply", "-f", changed, "--wait=5s")
	if code != 0 || !strings.Contains(out, "programmed on 1 connected node(s)") {
		t.Errorf("apply --wait with an agent that applies: exit %d, %q %q", code, out, errOut)
	}
	out, errOut, code = e.lbctl("", "node", "drain", "node1", "--wait=5s")
	if code != 0 || !strings.HasPrefix(out, "node/node1 drained\nrevision ") || !strings.Contains(out, "programmed on 1 connected node(s)") {
		t.Errorf("node drain --wait: exit %d, %q %q", code, out, errOut)
	}

	// node2's agent takes states and never applies them.
	if _, err := e.registry.CreateNode(context.Background(), &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: "node2"}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := e.srv.Agents.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&weirv1.SyncRequest{Message: &weirv1.SyncRequest_Hello{Hello: &weirv1.Hello{NodeName: "node2"}}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	out, errOut, code = e.lbctl("", "delete", "-f", changed, "--wait=1s")
	t.Logf("delete --wait: exit %d\n%s%s", code, out, errOut)
	if code != 4 || !strings.Contains(errOut, "node2: applying") || strings.Contains(errOut, "node1:") {
		t.Errorf("delete --wait with node2 never applying: exit %d, %q %q; want exit 4 naming node2 only", code, out, errOut)
	}
}

// TestStatusAsJSONAndYAML: scripts read status as a document with the
// API's field names, and branch on its exit code.
func TestStatusAsJSONAndYAML(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl("", "apply", "-f", writeFile(t, "web.yaml", fixture))
	e.agent("node1", 200)
	type doc struct {
		Server struct {
			Health string `json:"health"`
		} `json:"server"`
		Nodes []struct {
			Name              string `json:"name"`
			Connected         bool   `json:"connected"`
			ProgrammedVersion string `json:"programmed_version"`
			Drained           bool   `json:"drained"`
		} `json:"nodes"`
		Ready    bool     `json:"ready"`
		Problems []string `json:"problems"`
	}
	read := func(output string) (doc, int) {
		t.Helper()
		out, errOut, code := e.lbctl("", "status", "-o", output)
		var d doc
		raw := []byte(out)
		if output == "yaml" {
			var err error
			if raw, err = yaml.YAMLToJSON(raw); err != nil {
				t.Fatalf("status -o yaml: %v\n%s", err, out)
			}
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatalf("status -o %s: %v\n%s%s", output, err, out, errOut)
		}
		return d, code
	}
	for _, output := range []string{"json", "yaml"} {
		d, code := read(output)
		if code != 0 || !d.Ready || d.Server.Health != "SERVING" || len(d.Nodes) != 1 || d.Nodes[0].Name != "node1" ||
			!d.Nodes[0].Connected || d.Nodes[0].ProgrammedVersion == "" || len(d.Problems) != 0 {
			t.Errorf("status -o %s with node1 programmed: exit %d, %+v", output, code, d)
		}
	}
	// A node whose agent never connected: not ready, exit 1, said why.
	if _, err := e.registry.CreateNode(context.Background(), &weirv1.CreateNodeRequest{Node: &weirv1.Node{Metadata: &weirv1.ObjectMeta{Name: "node2"}}}); err != nil {
		t.Fatal(err)
	}
	e.mustLbctl("", "node", "drain", "node1")
	d, code := read("json")
	if code != 1 || d.Ready || len(d.Problems) == 0 || !d.Nodes[0].Drained {
		t.Errorf("status -o json with node2 never connected: exit %d, %+v; want exit 1, not ready, a problem, node1 drained", code, d)
	}
	if _, _, code := e.lbctl("", "status", "-o", "wide"); code != 2 {
		t.Errorf("status -o wide: exit %d, want 2", code)
	}
}

// TestTLSFailuresAreNamed: a TLS failure says what failed, in words an
// operator acts on, not "is weir-server running?".
func TestTLSFailuresAreNamed(t *testing.T) {
	dir, srv := startTLSServer(t)
	other := t.TempDir()
	for _, err := range []error{certs.InitCA(other), certs.IssueClient(other, "mallory", certs.RoleAdmin)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	_, port, _ := net.SplitHostPort(srv.Addr)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no client certificate", []string{"--server", srv.Addr, "--ca-file", filepath.Join(dir, "ca.crt")}, "the server requires a client certificate"},
		{"a client certificate of another CA", []string{"--server", srv.Addr, "--ca-file", filepath.Join(dir, "ca.crt"),
			"--cert-file", filepath.Join(other, "mallory.crt"), "--key-file", filepath.Join(other, "mallory.key")}, "does not trust the client certificate"},
		{"the server's certificate from another CA", []string{"--server", srv.Addr, "--ca-file", filepath.Join(other, "ca.crt"),
			"--cert-file", filepath.Join(dir, "victor.crt"), "--key-file", filepath.Join(dir, "victor.key")}, "the server's certificate is not signed by the CA in --ca-file"},
		{"a name the certificate is not for", []string{"--server", "localhost:" + port, "--ca-file", filepath.Join(dir, "ca.crt"),
			"--cert-file", filepath.Join(dir, "victor.crt"), "--key-file", filepath.Join(dir, "victor.key")}, "the server's certificate is not for localhost"},
	} {
		_, errOut, code := runLbctl(context.Background(), time.Now(), "", append(tc.args, "get", "nodes")...)
		if code != 3 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "is weir-server running") {
			t.Errorf("%s: exit %d, %q; want exit 3 saying %q", tc.name, code, errOut, tc.want)
		}
	}
}

// A server that stops while lbctl watches it is a server gone, not a
// certificate it no longer trusts; and a server that closes connections
// for another reason (too many from this certificate) is not called one
// that distrusts it either.
func TestAServerThatGoesAwayIsNotACertificateProblem(t *testing.T) {
	dir, srv := startTLSServer(t)
	args := []string{"--server", srv.Addr, "--ca-file", filepath.Join(dir, "ca.crt"),
		"--cert-file", filepath.Join(dir, "victor.crt"), "--key-file", filepath.Join(dir, "victor.key")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		errOut string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		_, errOut, code := runLbctl(ctx, time.Now(), "", append(args, "get", "nodes", "-w")...)
		done <- result{errOut, code}
	}()
	time.Sleep(500 * time.Millisecond) // the watch is open
	srv.Stop()
	r := <-done
	if r.code != 3 || strings.Contains(r.errOut, "certificate") || !strings.Contains(r.errOut, "not answering now") {
		t.Errorf("the server stopped under a watch: exit %d, %q; want exit 3 saying it is not answering now, not blaming a certificate", r.code, r.errOut)
	}

	// A server at its limit of connections for this certificate.
	dir, srv = startTLSServer(t, func(c *server.Config) { c.Limits.MaxConnectionsPerCaller = 1 })
	args = []string{"--server", srv.Addr, "--ca-file", filepath.Join(dir, "ca.crt"),
		"--cert-file", filepath.Join(dir, "victor.crt"), "--key-file", filepath.Join(dir, "victor.key")}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go runLbctl(watchCtx, time.Now(), "", append(args, "get", "nodes", "-w")...)
	time.Sleep(500 * time.Millisecond) // the watch holds the one connection
	_, errOut, code := runLbctl(ctx, time.Now(), "", append(args, "get", "nodes")...)
	if code != 3 || !strings.Contains(errOut, "as many of its connections as one caller may") || strings.Contains(errOut, "does not trust") {
		t.Errorf("a second connection past the limit: exit %d, %q; want exit 3 naming the connection limit", code, errOut)
	}
}

func TestDescribeServiceNamesTheFamilyARouterRefused(t *testing.T) {
	e := lbEnv(t)
	badAS := "the router sent NOTIFICATION code 2(open) subcode 2(bad peer as)"
	e.bgp = map[string][]*weirv1.BgpSession{"node1": {
		{PeerAddress: "192.0.2.1", PeerAsn: 64501, State: "active", LastError: badAS,
			Families: []*weirv1.BgpFamily{{Family: "ipv4"}, {Family: "ipv6"}}},
		{PeerAddress: "2001:db8:2::1", PeerAsn: 64500, State: "established",
			Families: []*weirv1.BgpFamily{{Family: "ipv4"}, {Family: "ipv6", Negotiated: true}}},
	}}
	e.announced = map[string][]*weirv1.BgpAnnouncement{"node1": {{Prefix: "203.0.113.7/32", NextHop: "192.0.2.11", Weight: 1}}}
	e.agent("node1", 200, lbHealth(200, 1))
	out := e.mustLbctl("", "describe", "service", "default/lb")
	for _, want := range []string{
		"  Not receiving on node1: ipv4: no established BGP session carries ipv4: 192.0.2.1 (AS 64501) active: " + badAS +
			"; 2001:db8:2::1 (AS 64500) established without ipv4\n",
		"External traffic by address family:\n" +
			"  NODE    FAMILY   ADDRESSES     RECEIVES   REASON\n" +
			"  node1   ipv4     203.0.113.7   no         BGPSessionsDown\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe service: want\n%s\ngot\n%s", want, out)
		}
	}
}

func TestDescribeAsJSONAndYAML(t *testing.T) {
	e := lbEnv(t)
	e.bgp = map[string][]*weirv1.BgpSession{"node1": {{PeerAddress: "192.0.2.1", PeerAsn: 64501, State: "active",
		LastError: "the router sent NOTIFICATION code 2(open) subcode 2(bad peer as)"}}}
	e.agent("node1", 200, lbHealth(200, 1))
	var svc struct {
		Service struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"service"`
		EndpointSlices []struct {
			ServiceName string `json:"service_name"`
		} `json:"endpoint_slices"`
		Status struct {
			Nodes []struct {
				Node     string `json:"node"`
				Reason   string `json:"reason"`
				Message  string `json:"message"`
				Families []struct {
					Family string `json:"family"`
					Reason string `json:"reason"`
				} `json:"families"`
			} `json:"nodes"`
		} `json:"status"`
	}
	out := e.mustLbctl("", "describe", "service", "default/lb", "-o", "json")
	if err := json.Unmarshal([]byte(out), &svc); err != nil {
		t.Fatalf("describe -o json does not parse: %v\n%s", err, out)
	}
	if svc.Service.Kind != "Service" || svc.Service.Metadata.Name != "lb" || len(svc.EndpointSlices) == 0 || svc.EndpointSlices[0].ServiceName != "lb" {
		t.Errorf("describe service -o json: %+v", svc)
	}
	found := false
	for _, n := range svc.Status.Nodes {
		if n.Node == "node1" {
			found = n.Reason == "BGPSessionsDown" && strings.Contains(n.Message, "bad peer as") &&
				len(n.Families) == 1 && n.Families[0].Family == "ipv4" && n.Families[0].Reason == "BGPSessionsDown"
		}
	}
	if !found {
		t.Errorf("describe service -o json: node1 does not say why it receives nothing\n%s", out)
	}

	out = e.mustLbctl("", "describe", "node", "node1", "-o", "yaml")
	var node struct {
		Node struct {
			Kind string `json:"kind"`
		} `json:"node"`
		Status struct {
			Connected   bool `json:"connected"`
			BgpSessions []struct {
				LastError string `json:"last_error"`
			} `json:"bgp_sessions"`
		} `json:"status"`
		HealthChecks []struct {
			Name string `json:"name"`
		} `json:"health_checks"`
	}
	if err := yaml.Unmarshal([]byte(out), &node); err != nil {
		t.Fatalf("describe node -o yaml does not parse: %v\n%s", err, out)
	}
	if node.Node.Kind != "Node" || !node.Status.Connected || len(node.Status.BgpSessions) != 1 ||
		!strings.Contains(node.Status.BgpSessions[0].LastError, "bad peer as") || len(node.HealthChecks) != 1 || node.HealthChecks[0].Name != "lb" {
		t.Errorf("describe node -o yaml: %+v\n%s", node, out)
	}
	if _, _, code := e.lbctl("", "describe", "node", "node1", "-o", "wide"); code != 2 {
		t.Errorf("describe -o wide: exit %d, want 2 (usage)", code)
	}
}

func TestVersionAsJSON(t *testing.T) {
	e := lbEnv(t)
	var doc struct {
		Client struct{ Version string } `json:"client"`
		Server struct {
			Health string `json:"health"`
			Info   struct {
				StateVersion string `json:"state_version"`
				Revision     string `json:"revision"`
			} `json:"info"`
		} `json:"server"`
	}
	out := e.mustLbctl("", "version", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Client.Version != "dev" || doc.Server.Health != "SERVING" || doc.Server.Info.StateVersion == "" ||
		doc.Server.Info.Revision != doc.Server.Info.StateVersion {
		t.Errorf("version -o json: %+v (%v)\n%s", doc, err, out)
	}
}

// TestDescribeServiceShowsItsAnnouncers: a pool that limits its announcing
// nodes to two of three: describe and get show the two chosen for the
// service's address; draining one of them brings in the third and keeps
// the other (the choice moves only what the drained node held).
func TestDescribeServiceShowsItsAnnouncers(t *testing.T) {
	e := newEnv(t)
	e.mustLbctl(`kind: AddressPool
metadata: {name: public}
addresses: [203.0.113.0/28]
bgp_advertisement: {max_announcing_nodes: 2}
---
kind: Node
metadata: {name: node1}
addresses: [192.0.2.11]
---
kind: Node
metadata: {name: node2}
addresses: [192.0.2.12]
---
kind: Node
metadata: {name: node3}
addresses: [192.0.2.13]
---
kind: Service
metadata: {name: web}
spec:
  type: SERVICE_TYPE_LOAD_BALANCER
  cluster_ips: [10.96.0.30]
  ports: [{name: http, port: 80, node_port: 30081}]
status: {load_balancer_ips: [203.0.113.5]}
`, "apply", "-f", "-")
	chosen := func() []string {
		t.Helper()
		out := e.mustLbctl("", "describe", "service", "default/web")
		_, section, ok := strings.Cut(out, "Announcing nodes (the pool's limit):\n")
		if !ok {
			t.Fatalf("describe service: no announcing nodes\n%s", out)
		}
		// "  ADDRESS       COUNT   NODES" then one row.
		rows := strings.Split(section, "\n")
		f := strings.Fields(rows[1])
		if len(f) < 3 || f[0] != "203.0.113.5" || f[1] != "2" {
			t.Fatalf("describe service: want two nodes for 203.0.113.5\n%s", section)
		}
		return strings.Split(strings.Join(f[2:], ""), ",")
	}
	before := chosen()
	if y := e.mustLbctl("", "get", "service", "web", "-o", "yaml"); !strings.Contains(y, "announcers:") || !strings.Contains(y, "- "+before[0]) {
		t.Errorf("get -o yaml: want status.announcers with %v\n%s", before, y)
	}
	e.mustLbctl("", "node", "drain", before[0])
	after := chosen()
	if slices.Contains(after, before[0]) || !slices.Contains(after, before[1]) {
		t.Errorf("after draining %s: announcers %v, want %s kept and the third node in", before[0], after, before[1])
	}
}

// TestReplicaNotCurrentIsPassedOver: given two replicas of which one lost
// its store, lbctl (which starts at a random one) always gets its answer
// from the current one, for reads and writes; with none current it says
// so instead of "cannot reach".
func TestReplicaNotCurrentIsPassedOver(t *testing.T) {
	cut, current := newEnv(t), newEnv(t)
	cut.srv.Hub.SetNotCurrent("cannot reach the store: test")
	servers := cut.addr + "," + current.addr
	for i := range 8 {
		out, errOut, code := runLbctl(context.Background(), time.Now(), "", "--server", servers, "--insecure", "get", "pools")
		if code != 0 || strings.Contains(errOut, "not current") {
			t.Fatalf("run %d: get pools: exit %d, %q %q; want the current replica's answer", i, code, out, errOut)
		}
		pool := fmt.Sprintf("kind: AddressPool\nmetadata:\n  name: p%d\naddresses: [\"198.18.%d.0/28\"]\n", i, i)
		if _, errOut, code := runLbctl(context.Background(), time.Now(), pool, "--server", servers, "--insecure", "apply", "-f", "-"); code != 0 {
			t.Fatalf("run %d: apply: exit %d, %q", i, code, errOut)
		}
	}
	if got, err := current.registry.ListAddressPools(context.Background(), &weirv1.ListAddressPoolsRequest{}); err != nil || len(got.GetAddressPools()) != 8 {
		t.Errorf("the current replica holds %v (%v); want the 8 pools applied", got.GetAddressPools(), err)
	}
	current.srv.Hub.SetNotCurrent("behind the store: test")
	_, errOut, code := runLbctl(context.Background(), time.Now(), "", "--server", servers, "--insecure", "get", "pools")
	if code == 0 || !strings.Contains(errOut, "current") {
		t.Errorf("with no replica current: exit %d, %q; want a failure saying none is current", code, errOut)
	}
}

// TestListsOfLargeResources: 250 services, each with as many labels as
// Kubernetes allows at their longest (6 MB in all, past gRPC's 4 MiB
// message limit), list whole: the server's pages are bounded in bytes too.
func TestListsOfLargeResources(t *testing.T) {
	e := newEnv(t)
	labels := map[string]string{}
	for i := range 64 {
		key := fmt.Sprintf("%s.example/%s", strings.Repeat("p", 240), strings.Repeat(string(rune('a'+i%26)), 60)+fmt.Sprintf("%03d", i))
		labels[key] = strings.Repeat("v", 63)
	}
	ctx := context.Background()
	for i := range 250 {
		svc := &weirv1.Service{
			Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("big%03d", i), Labels: labels},
			Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP, ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", 1+i/200, 1+i%200)},
				Ports: []*weirv1.ServicePort{{Name: "http", Port: 80}}},
		}
		if _, err := e.registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
			t.Fatal(err)
		}
	}
	out := e.mustLbctl("", "get", "services")
	if n := strings.Count(out, "\nbig"); n != 250 {
		t.Errorf("lbctl get services listed %d of the 250 services", n)
	}
	if _, errOut, code := e.lbctl("", "get", "services", "-o", "yaml"); code != 0 {
		t.Errorf("lbctl get services -o yaml: exit %d, %q", code, errOut)
	}
}

// TestApplyOfManyDocumentsIsTwoCalls: 600 documents are planned in one
// call and written in one, so that the server's per-caller rate limit
// (50 calls a second) does not make an apply take half a minute; applied
// again, unchanged, they cost the one planning call.
func TestApplyOfManyDocumentsIsTwoCalls(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	srv := servertest.Start(t, t.TempDir(), func(c *server.Config) {
		c.Log = slog.New(slog.NewTextHandler(&lockedBuffer{mu: &mu, b: &buf}, nil))
	})
	var docs strings.Builder
	for i := range 600 {
		fmt.Fprintf(&docs, "kind: AddressPool\nmetadata: {name: p%03d}\naddresses: [\"198.18.%d.%d/32\"]\n---\n", i, i/200, i%200)
	}
	writes := func() int {
		mu.Lock()
		defer mu.Unlock()
		// One audit line a call; an Apply's resources' lines (verb=) follow it.
		n := 0
		for l := range strings.Lines(buf.String()) {
			if strings.Contains(l, "msg=audit") && !strings.Contains(l, " verb=") {
				n++
			}
		}
		buf.Reset()
		return n
	}
	for _, want := range []struct {
		verb  string
		calls int
	}{{"created", 2}, {"unchanged", 1}} {
		out, errOut, code := runLbctl(context.Background(), time.Now(), docs.String(), "--server", srv.Addr, "--insecure", "apply", "-f", "-")
		if code != 0 {
			t.Fatalf("apply: exit %d, %q", code, errOut)
		}
		if n := strings.Count(out, " "+want.verb+"\n"); n != 600 {
			t.Errorf("apply said %q of %d documents; want all 600", want.verb, n)
		}
		if n := writes(); n != want.calls {
			t.Errorf("applying 600 documents (%s) made %d calls that write or check a write; want %d", want.verb, n, want.calls)
		}
	}
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestConvertMetalLBAppliesAsIs: what lbctl convert metallb prints is
// accepted as it is by lbctl apply, on a real server, and reads back as
// converted; its notes are on standard error as well as in the output.
func TestConvertMetalLBAppliesAsIs(t *testing.T) {
	e := newEnv(t)
	out, stderr, code := runLbctl(context.Background(), e.now, "", "convert", "metallb", "-f", "convert/testdata/metallb.yaml", "--allow-drops")
	if code != 0 {
		t.Fatalf("convert: exit %d, %q", code, stderr)
	}
	if n := strings.Count(stderr, "note: "); n != 8 || strings.Count(out, "\n# - ") != 8 {
		t.Errorf("%d notes on stderr, %d in the output; want 8 of each:\n%s", n, strings.Count(out, "\n# - "), stderr)
	}
	applied := e.mustLbctl(out, "apply", "-f", "-")
	want := "pool/public created\npool/reserved created\npool/office-lan created\npool/unannounced created\npeer/tor-a created\npeer/tor-b created\n"
	if applied != want {
		t.Errorf("apply: %q, want %q", applied, want)
	}
	if again := e.mustLbctl(out, "apply", "-f", "-"); strings.Count(again, "unchanged") != 6 {
		t.Errorf("applied a second time: %q; want every object unchanged", again)
	}
	got := e.mustLbctl("", "get", "pools", "-o", "wide")
	for _, row := range []string{"public ", "office-lan ", " l2 ", " l2+bgp ", "eth1"} {
		if !strings.Contains(got, row) {
			t.Errorf("get pools -o wide has no %q:\n%s", row, got)
		}
	}
	// The pool MetalLB both answers over L2 and announces over BGP keeps
	// its BGP advertisement's attributes.
	if got := e.mustLbctl("", "describe", "pool", "public"); !strings.Contains(got, "no-export,64512:100") || !strings.Contains(got, "L2 Advertisement:") {
		t.Errorf("describe pool public: want its L2 advertisement and its BGP one's communities:\n%s", got)
	}
}

// TestConvertMetalLBReadsABoundedInput: an input past convert's limit (32
// MiB) is refused, saying so, after reading no more than the limit of it:
// the memory of a conversion is bounded, whatever is piped in.
func TestConvertMetalLBReadsABoundedInput(t *testing.T) {
	in := &commentStream{size: 64 << 20}
	var out, errOut bytes.Buffer
	a := &app{stdin: in, stdout: &out, stderr: &errOut, now: time.Now}
	code := a.run(context.Background(), []string{"convert", "metallb", "-f", "-"})
	if code == 0 || !strings.Contains(errOut.String(), "-: more than 32 MiB in all") {
		t.Errorf("64 MiB in: exit %d, stderr %q; want an error saying more than 32 MiB", code, errOut.String())
	}
	if in.read > convert.MaxInputBytes+1 {
		t.Errorf("read %d bytes of the input, want no more than the limit (%d) and one", in.read, convert.MaxInputBytes)
	}
}

// commentStream is YAML comment lines, size bytes of them.
type commentStream struct{ size, read int }

func (c *commentStream) Read(p []byte) (int, error) {
	const line = "# padding\n"
	n := min(len(p), c.size-c.read)
	if n == 0 {
		return 0, io.EOF
	}
	for i := range n {
		p[i] = line[(c.read+i)%len(line)]
	}
	c.read += n
	return n, nil
}

// TestConvertResourcesToCustomResources: lbctl's pools and peers become
// weir.dev custom resources, a password a Secret the peer names; a kind
// that is not a pool or a peer is named as left out.
func TestConvertResourcesToCustomResources(t *testing.T) {
	in := `kind: AddressPool
metadata:
  name: public
addresses: [203.0.113.0/28]
manual_only: true
bgp_advertisement:
  communities: ["64512:100"]
  max_announcing_nodes: 2
---
kind: BgpPeer
metadata:
  name: tor-a
address: 192.0.2.1
asn: 64500
my_asn: 64512
password: s3cret
---
kind: Node
metadata:
  name: node1
addresses: [192.0.2.11]
`
	out, stderr, code := runLbctl(context.Background(), time.Now(), in, "convert", "resources", "-f", "-", "--namespace", "weir-system")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"apiVersion: weir.dev/v1alpha1\nkind: WeirAddressPool\nmetadata:\n  name: public\nspec:\n  addresses:\n  - 203.0.113.0/28\n  autoAssign: false\n  bgpAdvertisement:\n    communities:\n    - 64512:100\n    maxAnnouncingNodes: 2\n",
		"apiVersion: v1\nkind: Secret\nmetadata:\n  name: tor-a-bgp-password\n  namespace: weir-system\nstringData:\n  password: s3cret\n",
		"kind: WeirBGPPeer\nmetadata:\n  name: tor-a\nspec:\n  address: 192.0.2.1\n  asn: 64500\n  myASN: 64512\n  passwordSecretRef:\n    name: tor-a-bgp-password\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks\n%s\nin\n%s", want, out)
		}
	}
	if !strings.Contains(stderr, "note: node/node1: not a pool or a peer: left out") {
		t.Errorf("stderr %q; want the node named as left out", stderr)
	}
	if _, stderr, code := runLbctl(context.Background(), time.Now(), "", "convert", "metallb", "-f", "convert/testdata/metallb.yaml", "--to", "yaml"); code != 2 {
		t.Errorf("--to yaml: exit %d (%s); want a usage error", code, stderr)
	}
}

func TestSkewWarning(t *testing.T) {
	for _, tc := range []struct {
		client, server string
		warn           bool
	}{
		{"v0.2.0", "v0.2.1", false},
		{"v0.2.0", "v0.1.0", false},
		{"v0.1.0", "v0.2.0-4-gabc1234", false},
		{"v0.3.0", "v0.1.0", true},
		{"v0.1.0", "v0.3.2", true},
		{"v1.1.0", "v0.1.0", true},
		{"dev", "v0.1.0", false},
		{"v0.1.0", "", false},
		{"v0.1.0", "735888e", false},
	} {
		if got := skewWarning(tc.client, tc.server); (got != "") != tc.warn {
			t.Errorf("lbctl %q, server %q: warning %q, want one: %v", tc.client, tc.server, got, tc.warn)
		}
	}
}
