package model

import (
	"math/rand/v2"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDNSNamesAsTheRegexps holds the hand-written DNS-1123 checks to the
// regexps Kubernetes states them with, over every short name of a few
// letters that matter and many random longer ones.
func TestDNSNamesAsTheRegexps(t *testing.T) {
	rules := []struct {
		rule dnsName
		re   *regexp.Regexp
	}{
		{dns1123Label, regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)},
		{dns1123Subdomain, regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)},
	}
	check := func(s string) {
		t.Helper()
		for _, r := range rules {
			if got, want := r.rule.MatchString(s), r.re.MatchString(s); got != want {
				t.Errorf("subdomain %v: %q: %v, the regexp says %v", r.rule.subdomain, s, got, want)
			}
		}
	}
	// Every name of up to 4 characters from these.
	const letters = "a9-.A_"
	var all func(prefix string, n int)
	all = func(prefix string, n int) {
		check(prefix)
		if n == 0 {
			return
		}
		for _, c := range letters {
			all(prefix+string(c), n-1)
		}
	}
	all("", 4)
	for _, s := range []string{strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 62) + "-", "a." + strings.Repeat("b", 70),
		"node-1.example.com", "node-1..example", "-a", "a-", "é", "a\n"} {
		check(s)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const often = "abz019-."
	for range 20000 {
		b := make([]byte, rng.IntN(80))
		for i := range b {
			if rng.IntN(50) == 0 {
				b[i] = byte(rng.IntN(256))
			} else {
				b[i] = often[rng.IntN(len(often))]
			}
		}
		check(string(b))
	}
}

// BenchmarkValidateEndpointSlice: a slice of ten endpoints on ten nodes,
// what a storm of endpoint changes validates once per change.
func BenchmarkValidateEndpointSlice(b *testing.B) {
	s := &EndpointSlice{Meta: Meta{Namespace: "bench", Name: "svc-1"}, ServiceName: "svc-1",
		Ports: []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}}}
	for j := range 10 {
		s.Endpoints = append(s.Endpoints, Endpoint{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(128 + j), 0, 1})},
			NodeName: "node-" + strconv.Itoa(j) + ".rack-1.example"})
	}
	for b.Loop() {
		if err := s.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}
