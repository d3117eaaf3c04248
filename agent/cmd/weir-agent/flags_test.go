package main

import "testing"

func TestLocalDetectionFlags(t *testing.T) {
	for _, tc := range []struct {
		mode, bridge, prefix string
		ok                   bool
	}{
		{"ClusterCIDR", "", "", true},
		{"None", "", "", true},
		{"BridgeInterface", "cbr0", "", true},
		{"BridgeInterface", "", "", false},                        // no bridge named
		{"BridgeInterface", `cbr0" accept`, "", false},            // not an interface name
		{"InterfaceNamePrefix", "", "veth", true},                 //
		{"InterfaceNamePrefix", "", "a-name-far-too-long", false}, // over 15
		{"clustercidr", "", "", false},                            // kube-proxy's spelling only
	} {
		_, err := localDetection(tc.mode, tc.bridge, tc.prefix)
		if (err == nil) != tc.ok {
			t.Errorf("localDetection(%q, %q, %q): %v; want ok %v", tc.mode, tc.bridge, tc.prefix, err, tc.ok)
		}
	}
}
