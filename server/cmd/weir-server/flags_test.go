package main

import "testing"

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
