package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// runWith runs the server's main path with args as its command line.
func runWith(t *testing.T, args ...string) error {
	t.Helper()
	oldArgs, oldFlags := os.Args, flag.CommandLine
	t.Cleanup(func() { os.Args, flag.CommandLine = oldArgs, oldFlags })
	os.Args = append([]string{"weir-server"}, args...)
	flag.CommandLine = flag.NewFlagSet("weir-server", flag.ContinueOnError)
	return run()
}

// The server refuses a bad command line before it serves anything, naming
// the flag; with several faults, the first in the order the parts start
// (the API's TLS, the store, the service rules, the L2 leases, etcd,
// Kubernetes, the listeners) is the one reported.
func TestRunRefusesBadFlagsInTheOrderThePartsStart(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure", "--tls-cert-file", "c", "--listen", "192.0.2.1:1", "--leader-elect"}, "--insecure serves plain text: it contradicts"},
		{[]string{"--insecure-allow-remote", "--service-node-port-range", "bogus"}, "--insecure-allow-remote means nothing without --insecure"},
		{[]string{"--insecure", "--listen", "192.0.2.1:1", "--leader-elect"}, "--listen 192.0.2.1:1 is not a loopback address"},
		{[]string{"--tls-cert-file", "c", "--tls-key-file", "k", "--leader-elect"}, "--client-ca-file is required"},
		{[]string{"--client-ca-file", "ca", "--leader-elect"}, "--tls-cert-file and --tls-key-file are required"},
		{[]string{"--client-ca-file", dir + "/ca", "--tls-cert-file", dir + "/c", "--tls-key-file", dir + "/k", "--leader-elect"}, "no such file"},
		{[]string{"--insecure", "--service-node-port-range", "bogus", "--allowed-external-ip-cidrs", "x"}, "--service-node-port-range"},
		{[]string{"--insecure", "--allowed-external-ip-cidrs", "10.0.0.0/8, 10.0.0.1/8", "--service-cluster-ip-range", "bogus"}, `--allowed-external-ip-cidrs: " 10.0.0.1/8" is not a CIDR`},
		{[]string{"--insecure", "--service-cluster-ip-range", "bogus", "--l2-lease-duration", "1ms"}, `--service-cluster-ip-range: "bogus" is not a CIDR`},
		{[]string{"--insecure", "--l2-lease-duration", "1ms", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-ca-file", dir + "/none"}, "--l2-lease-duration 1ms, --l2-lease-margin"},
		{[]string{"--insecure", "--l2-lease-margin", "-1s", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-ca-file", dir + "/none"}, "--l2-lease-margin -1s"},
		{[]string{"--insecure", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-ca-file", dir + "/none", "--init"}, "--etcd-ca-file, --etcd-cert-file, --etcd-key-file"},
		{[]string{"--insecure", "--etcd-endpoints", "http://127.0.0.1:1", "--init", "--load-balancer-class", "a b"}, "--init is for the embedded store"},
		{[]string{"--insecure", "--load-balancer-class", "a b", "--leader-elect"}, `--load-balancer-class "a b"`},
		{[]string{"--insecure", "--leader-elect", "--metrics-bind-address", "bogus"}, "--leader-elect elects with a Kubernetes Lease"},
		{[]string{"--insecure", "--kubeconfig", dir + "/kc", "--etcd-endpoints", "http://127.0.0.1:1", "--leader-elect"}, "--leader-elect is for replicas with stores of their own"},
		{[]string{"--insecure", "--metrics-bind-address", "bogus", "--webhook-bind-address", "127.0.0.1:0"}, "--metrics-bind-address"},
		{[]string{"--insecure", "--webhook-bind-address", "127.0.0.1:0", "--listen", "127.0.0.1:bogus"}, "--webhook-bind-address needs --kubernetes"},
		{[]string{"--insecure", "--listen", "127.0.0.1:bogus"}, "listen tcp: lookup tcp/bogus"},
	} {
		// A data folder each: a server made before a later part failed
		// keeps its store open.
		base := []string{"--data-dir", t.TempDir(), "--metrics-bind-address", "127.0.0.1:0"}
		err := runWith(t, append(base, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("weir-server %s: %v; want an error saying %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
