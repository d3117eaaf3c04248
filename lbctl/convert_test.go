package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// wholeMetalLB is a MetalLB configuration Weir carries over whole, as
// kubectl get -o yaml exports it: one List.
const wholeMetalLB = `apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: metallb.io/v1beta1
  kind: IPAddressPool
  metadata:
    name: first-pool
    namespace: metallb-system
    resourceVersion: "1"
    uid: 0e6c1b56-0000-4000-8000-000000000001
  spec:
    addresses: [192.168.10.0/24]
- apiVersion: metallb.io/v1beta1
  kind: BGPAdvertisement
  metadata:
    name: ad
    namespace: metallb-system
  spec:
    ipAddressPools: [first-pool]
    localPref: 150
- apiVersion: metallb.io/v1beta2
  kind: BGPPeer
  metadata:
    name: tor
    namespace: metallb-system
  spec:
    myASN: 64512
    peerASN: 64513
    peerAddress: 192.0.2.1
`

// TestConvertMetalLBExitCode: what is carried over whole converts with
// exit code 0; when anything is not, the output is written all the same,
// the exit code is 5 and stderr says so, and --allow-drops makes it 0.
func TestConvertMetalLBExitCode(t *testing.T) {
	ctx := context.Background()
	out, stderr, code := runLbctl(ctx, time.Now(), wholeMetalLB, "convert", "metallb", "-f", "-")
	if code != 0 || stderr != "" || !strings.Contains(out, "name: first-pool") || !strings.Contains(out, "name: tor") {
		t.Errorf("carried over whole: exit %d, stderr %q, output\n%s\nwant exit 0, no notes, the pool and the peer", code, stderr, out)
	}
	out, stderr, code = runLbctl(ctx, time.Now(), "", "convert", "metallb", "-f", "convert/testdata/metallb.yaml")
	if code != exitDropped || !strings.Contains(out, "kind: AddressPool") || !strings.Contains(stderr, "lbctl: not everything was carried over") {
		t.Errorf("with notes: exit %d, stderr %q; want exit %d, the output written, stderr saying what was not carried over", code, stderr, exitDropped)
	}
	if _, stderr, code := runLbctl(ctx, time.Now(), "", "convert", "metallb", "-f", "convert/testdata/metallb.yaml", "--allow-drops"); code != 0 || strings.Contains(stderr, "lbctl:") {
		t.Errorf("--allow-drops: exit %d, stderr %q; want 0 and the notes only", code, stderr)
	}
	help, _, _ := runLbctl(ctx, time.Now(), "", "convert", "metallb", "--help")
	for _, want := range []string{"Nothing is dropped silently", "--allow-drops", "exit code is 5"} {
		if !strings.Contains(help, want) {
			t.Errorf("help does not say %q:\n%s", want, help)
		}
	}
}

// TestConvertMetalLBPasswordSecret: a BGPPeer's passwordSecret becomes
// the WeirBGPPeer's passwordSecretRef (key password, MetalLB's), with a
// note to copy the Secret into the server's namespace; lbctl's documents
// cannot name a Secret, which a note says, with exit code 5.
func TestConvertMetalLBPasswordSecret(t *testing.T) {
	in := "apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata:\n  name: tor\n  namespace: metallb-system\nspec:\n  myASN: 64512\n  peerASN: 64513\n  peerAddress: 192.0.2.1\n  passwordSecret:\n    name: tor-md5\n    namespace: metallb-system\n"
	out, stderr, code := runLbctl(context.Background(), time.Now(), in, "convert", "metallb", "-f", "-", "--to", "crds", "--namespace", "weir-system")
	if code != 0 || !strings.Contains(out, "  passwordSecretRef:\n    key: password\n    name: tor-md5\n") {
		t.Errorf("--to crds: exit %d, stderr %q, output\n%s\nwant exit 0 and passwordSecretRef naming tor-md5's key password", code, stderr, out)
	}
	if !strings.Contains(stderr, "note: BGPPeer/tor spec.passwordSecret: Weir reads the password from Secret weir-system/tor-md5: copy metallb-system/tor-md5 there") {
		t.Errorf("--to crds: stderr %q; want a note to copy the Secret", stderr)
	}
	_, stderr, code = runLbctl(context.Background(), time.Now(), in, "convert", "metallb", "-f", "-")
	if code != exitDropped || !strings.Contains(stderr, "note: BGPPeer/tor spec.passwordSecret: ") {
		t.Errorf("--to resources: exit %d, stderr %q; want %d and a note on spec.passwordSecret", code, stderr, exitDropped)
	}
}
