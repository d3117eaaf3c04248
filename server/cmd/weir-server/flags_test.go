package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

func TestInsecureContradictsTLSFlags(t *testing.T) {
	if err := checkInsecure(true, "server.crt", "", ""); err == nil {
		t.Error("--insecure with --tls-cert-file: accepted")
	}
	if err := checkInsecure(true, "", "", "ca.crt"); err == nil {
		t.Error("--insecure with --client-ca-file: accepted")
	}
	if err := checkInsecure(true, "", "", ""); err != nil {
		t.Errorf("--insecure alone: %v", err)
	}
	if err := checkInsecure(false, "server.crt", "server.key", "ca.crt"); err != nil {
		t.Errorf("TLS alone: %v", err)
	}
	for listen, want := range map[string]bool{"127.0.0.1:7443": true, "[::1]:7443": true, "0.0.0.0:7443": false, ":7443": false, "10.0.0.1:7443": false, "localhost:7443": false} {
		if got := loopback(listen); got != want {
			t.Errorf("loopback(%q) = %v, want %v", listen, got, want)
		}
	}
}

func TestPlainTextOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		insecure, remote bool
		listen           string
		ok               bool
	}{
		{true, false, "127.0.0.1:7443", true},
		{true, false, "[::1]:7443", true},
		{true, false, "0.0.0.0:7443", false},
		{true, false, "10.250.1.1:7443", false},
		{true, true, "10.250.1.1:7443", true},
		{false, true, "127.0.0.1:7443", false},
		{false, false, "0.0.0.0:7443", true},
	} {
		err := checkPlainTextListen(tc.insecure, tc.remote, tc.listen)
		if (err == nil) != tc.ok {
			t.Errorf("--insecure=%v --insecure-allow-remote=%v --listen %s: %v", tc.insecure, tc.remote, tc.listen, err)
		}
	}
}

func TestLeaderElectNeedsKubernetesWithoutEtcd(t *testing.T) {
	for _, tc := range []struct {
		leaderElect, kube, etcd bool
		ok                      bool
	}{
		{false, false, false, true},
		{false, true, true, true},
		{true, true, false, true},
		{true, false, false, false},
		{true, true, true, false},
	} {
		err := checkLeaderElect(tc.leaderElect, tc.kube, tc.etcd)
		if (err == nil) != tc.ok {
			t.Errorf("--leader-elect=%v --kubernetes=%v --etcd-endpoints set=%v: %v", tc.leaderElect, tc.kube, tc.etcd, err)
		}
	}
}

func TestServiceClusterIPRange(t *testing.T) {
	for list, ok := range map[string]bool{
		"10.96.0.0/12,fd00:96::/108": true,
		"10.96.0.0/12":               true,
		"0.0.0.0/0":                  false,
		"10.96.0.1/12":               false,
		"10.96.0.0/12,10.112.0.0/12": false,
		"169.254.0.0/16":             false,
		"not-a-range":                false,
	} {
		if _, _, err := serviceRanges(list); (err == nil) != ok {
			t.Errorf("--service-cluster-ip-range %s: %v; want ok %v", list, err, ok)
		}
	}
}

// A validity that would issue a certificate already ended, or a negative
// window, is refused before anything is written.
func TestCertsRefuseBadDurations(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"init", "--dir", dir, "--hosts", "127.0.0.1", "--valid-for", "-1h"},
		{"init", "--dir", dir, "--hosts", "127.0.0.1", "--valid-for", "0s"},
		{"rotate", "--dir", dir, "--within", "-1h"},
	} {
		err := certsCommand(args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--"+strings.TrimPrefix(args[len(args)-2], "--")) {
			t.Errorf("certs %v: %v, want an error naming the flag", args, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused commands wrote %d files", len(entries))
	}
}
