// Package archtest keeps Weir's dependency direction true: it fails when a
// package imports what its layer must not know about.
package archtest

import (
	"os/exec"
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
		pkg       string
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
		{"internal/notify", []string{module + "/"}, "waking waiters is a leaf every component may use"},
		{"server/cmd/weir-server", []string{module + "/test", "k8s.io/kubernetes"}, "test-only code stays out of the product"},
		{"agent/cmd/weir-agent", []string{module + "/test"}, "test-only code stays out of the product"},
	} {
		for _, d := range deps(t, tc.pkg) {
			if d == module+"/"+tc.pkg {
				continue
			}
			for _, f := range tc.forbidden {
				if strings.HasPrefix(d, f) {
					t.Errorf("%s depends on %s: %s", tc.pkg, d, tc.why)
				}
			}
		}
	}
}
