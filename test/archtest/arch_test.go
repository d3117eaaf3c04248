// Package archtest keeps Weir's dependency direction true: it fails when a
// package imports what its layer must not know about.
package archtest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/weirlb/weir"

// deps lists every package pkg depends on, transitively.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

func TestDependencyDirection(t *testing.T) {
	for _, tc := range []struct {
		pkg       string // one package or several, separated by spaces
		forbidden []string
		why       string
	}{
		{"datapath", []string{"google.golang.org/grpc", "google.golang.org/protobuf", "k8s.io/", module + "/server", module + "/agent", module + "/proto"},
			"the datapath knows nothing of gRPC, Kubernetes or the server"},
		{"agent/...", []string{"k8s.io/client-go", module + "/server"},
			"the agent never imports client-go or the server"},
		{"server/model", []string{"google.golang.org/grpc", module + "/proto"}, "the core model does not know the transport"},
		{"server/registry", []string{"google.golang.org/grpc", module + "/proto"}, "the core logic does not know the transport"},
		{"server/nodestate", []string{"google.golang.org/grpc", module + "/proto"}, "the core logic does not know the transport"},
		{"server/receive", []string{"google.golang.org/grpc", module + "/proto", module + "/server/api", module + "/server/agentsync"}, "who receives a service's traffic, and why not, is decided without the transport or the hub"},
		{"server/l2owner", []string{"google.golang.org/grpc", module + "/proto", module + "/server/api", module + "/server/agentsync"}, "who answers ARP and NDP for an address, and the lease that fences it, is decided without the transport"},
		{"server/observed", []string{"google.golang.org/grpc", module + "/proto", module + "/server/"}, "what the server knows of a node is a leaf: reports arrive decoded"},
		{"internal/apierr", []string{module + "/server", module + "/agent", module + "/lbtier", module + "/lbctl", module + "/datapath", module + "/internal/dial", module + "/proto"},
			"the errors the server and its clients agree on are a leaf"},
		{"internal/report", []string{module + "/agent", module + "/datapath", module + "/internal/", module + "/server", module + "/proto"}, "what an agent reports is a leaf the health checks, the node speaker, the syncer and the server share"},
		{"agent/bgp", []string{module + "/agent/health", module + "/agent/syncer"}, "the node speaker fills its part of a report without the health checks"},
		{"agent/syncer", []string{module + "/agent/health", module + "/agent/bgp", module + "/agent/drain"}, "the syncer sends reports without knowing who fills them"},
		{"agent/drain", []string{module + "/agent/health", module + "/agent/bgp", module + "/agent/syncer"}, "the drain fills its part of a report without the health checks, the node speaker or the syncer"},
		{"server/agentsync", []string{module + "/internal/dial"}, "the server does not import the clients' dialer for its vocabulary (internal/apierr holds it)"},
		{"server/resourcefile", []string{module + "/server/api"}, "the resources file reads resources as the API writes them (server/resourcewire), not through the gRPC edge"},
		{"internal/notify internal/recv", []string{module + "/"}, "waking waiters and pumping a stream are leaves every component may use"},
		{"internal/bgpcommunity", []string{module + "/"}, "communities as operators write them are a leaf every layer reads them by"},
		{"internal/bfd", []string{module + "/"}, "BFD is a protocol, a leaf the speakers and the layers that configure it share"},
		{"internal/routeradv", []string{module + "/"}, "router advertisements are a protocol, a leaf the speaker drives"},
		{"internal/bgpnumbers", []string{module + "/"}, "a session's numbers (AS numbers, default timers) are one rule, a leaf every layer asks"},
		{"datapath/internal/nfwire", []string{module + "/"}, "the kernel's netlink wire is a leaf that knows nothing of services"},
		{"server/cmd/weir-server agent/cmd/weir-agent lbtier/cmd/weir-speaker", []string{module + "/datapath/benchhook"}, "the kernel floors the benches measure stay out of the product"},
		{"server/cmd/weir-server", []string{module + "/test", "k8s.io/kubernetes"}, "test-only code stays out of the product"},
		{"agent/cmd/weir-agent", []string{module + "/test"}, "test-only code stays out of the product"},
		{serverCore + " server/agentsync server/agentsync/cache", []string{module + "/server/kubernetes"},
			"the server's core decides on resources whatever their source: Kubernetes is translated at its own edge"},
		{"server/agentsync/cache", []string{module + "/server/api"}, "the stream cache keeps what the hub sends agents and knows nothing of the public API"},
		{serverCore + " datapath agent/health agent/bgp agent/drain agent/flows internal/report", []string{module + "/proto"},
			"generated protobuf types stay at the edges and are translated once"},
	} {
		for _, pkg := range strings.Fields(tc.pkg) {
			for _, d := range deps(t, pkg) {
				if d == module+"/"+pkg {
					continue
				}
				for _, f := range tc.forbidden {
					if strings.HasPrefix(d, f) {
						t.Errorf("%s depends on %s: %s", pkg, d, tc.why)
					}
				}
			}
		}
	}
}

// serverCore is where the server decides: what a resource means, what each
// node must forward, who receives an address and who answers for it.
// The hub (server/agentsync) is not in it: it is the agents' stream edge.
const serverCore = "server/model server/registry server/nodestate server/receive server/observed server/ipam server/l2owner"

// imports lists, for every package of the module, the packages its own
// (non-test) files import.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list %s/...: %v", module, err)
	}
	m := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 {
			m[strings.TrimPrefix(f[0], module+"/")] = f[1:]
		}
	}
	return m
}

// The generated API package carries gRPC with it (its services live beside
// its messages), so what the stream cache imports itself is what tells
// holding wire messages from speaking gRPC.
func TestStreamCacheImportsNoGRPC(t *testing.T) {
	const cache = "server/agentsync/cache"
	for _, i := range imports(t)[cache] {
		if strings.HasPrefix(i, "google.golang.org/grpc") {
			t.Errorf("%s imports %s: the stream cache keeps messages, the hub's stream edge sends them", cache, i)
		}
	}
}

// protoEdges are the packages that may import the generated API
// (proto/weir/v1): each translates between the wire and the domain once,
// or is a client, a binary or a test. A package of the core that needs a
// wire type gets a domain type instead, converted at its edge.
var protoEdges = map[string]string{
	"server":                 "the assembly registers the gRPC services",
	"server/api":             "the public API's gRPC edge",
	"server/auth":            "the interceptors that authorize and audit the API's calls",
	"server/agentsync":       "the agents' stream edge",
	"server/agentsync/cache": "the stream's cache keeps the messages the hub sends, encoded once for every agent",
	"server/resourcewire":    "resources in their wire form, converted to the model once",
	"server/resourcefile":    "the resources file holds resources as the API writes them",
	"server/kubernetes":      "the Kubernetes source turns its custom resources into the API's resources",
	// An exception: a replica shares its agents' status with the other
	// replicas in the wire form, the format every server version reads
	// while replicas upgrade one by one.
	"server/replicas":   "replicas share a node's status in its wire form",
	"server/servertest": "the server's test harness",
	"internal/nodewire": "what an agent and the server say on the stream, translated once",
	"agent/syncer":      "the agent's stream client",
	"agent/l2":          "the agent's L2 lease client",
	"lbctl/...":         "the operator's CLI over the public API",
	"lbtier/...":        "the LB tier speaker, a client of the public API",
	"test/...":          "tests, labs and benches",
	".../cmd/...":       "the binaries, which wire the edges",
}

func TestProtobufOnlyAtTheEdges(t *testing.T) {
	const generated = module + "/proto/weir/v1"
	for pkg, imp := range imports(t) {
		if strings.HasPrefix(pkg, "proto/") || !slices.Contains(imp, generated) || isEdge(pkg) {
			continue
		}
		t.Errorf("%s imports %s: generated protobuf types stay at the edges (protoEdges) and are translated once", pkg, generated)
	}
}

// isEdge says whether pkg is one of protoEdges: a name, name/... for a
// package and those under it, or .../cmd/... for any binary.
func isEdge(pkg string) bool {
	for e := range protoEdges {
		switch {
		case e == pkg:
			return true
		case e == ".../cmd/...":
			if strings.Contains("/"+pkg+"/", "/cmd/") {
				return true
			}
		case strings.HasSuffix(e, "/..."):
			if base := strings.TrimSuffix(e, "/..."); pkg == base || strings.HasPrefix(pkg, base+"/") {
				return true
			}
		}
	}
	return false
}
