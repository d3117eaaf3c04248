package resourcefile

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

const rack = `kind: AddressPool
metadata:
  name: public
addresses:
- 203.0.113.10-203.0.113.19
---
kind: BgpPeer
metadata:
  name: tor
address: 192.0.2.1
asn: 64500
my_asn: 64512
password: s3cret
`

func mustApply(t *testing.T, reg *registry.Registry, content string) {
	t.Helper()
	r, err := Parse("rack.yaml", []byte(content))
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(reg, r); err != nil {
		t.Fatal(err)
	}
}

func TestParseNamesTheBadDocumentAndField(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"kind: Service\nmetadata: {name: web}\n", `document 2: kind "Service"`},
		{"kind: BgpPeer\nmetadata: {name: x}\naddress: 192.0.2.1\nasn: 64500\n", "document 2: my_asn"},
		{"kind: AddressPool\nmetadata: {name: x}\naddresses: [nonsense]\n", "document 2: addresses[0]"},
		{"kind: BgpPeer\nmetadata: {name: x}\nadress: 192.0.2.1\n", "document 2: "},
	} {
		_, err := Parse("rack.yaml", []byte("kind: AddressPool\nmetadata: {name: ok}\naddresses: [198.51.100.0/28]\n---\n"+tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "rack.yaml: ") {
			t.Errorf("%q: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
}

func TestApplyFollowsTheFile(t *testing.T) {
	reg := registrytest.Open(t)
	mustApply(t, reg, rack)
	pool, err := reg.Pools.Get("public")
	if err != nil || pool.Source != model.SourceFile || pool.Ranges[0].String() != "203.0.113.10-203.0.113.19" {
		t.Fatalf("pool: %+v, %v", pool, err)
	}
	peer, err := reg.Peers.Get("tor")
	if err != nil || peer.Source != model.SourceFile || peer.Address != netip.MustParseAddr("192.0.2.1") || peer.Password != "s3cret" {
		t.Fatalf("peer: %+v, %v", peer, err)
	}

	// The same file again writes nothing.
	mustApply(t, reg, rack)
	if again, _ := reg.Pools.Get("public"); again.ResourceVersion != pool.ResourceVersion {
		t.Errorf("an unchanged file rewrote the pool (version %d -> %d)", pool.ResourceVersion, again.ResourceVersion)
	}

	// The API's own objects cannot be taken over or changed by the file,
	// nor the file's by the API.
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "mine"},
		Ranges: []model.AddressRange{mustRange(t, "198.51.100.0/28")}}); err != nil {
		t.Fatal(err)
	}
	r, _ := Parse("rack.yaml", []byte(rack+"---\nkind: AddressPool\nmetadata: {name: mine}\naddresses: [198.51.100.32/28]\n"))
	if err := Apply(reg, r); !errors.Is(err, registry.ErrInUse) {
		t.Errorf("file claiming the API's pool: %v, want ErrInUse", err)
	}
	if mine, _ := reg.Pools.Get("mine"); mine.Source != model.SourceNative || mine.Ranges[0].String() != "198.51.100.0-198.51.100.15" {
		t.Errorf("the API's pool changed: %+v", mine)
	}
	upd := *peer
	upd.Source, upd.ASN = model.SourceNative, 65000
	if _, err := reg.Peers.Update(&upd); !errors.Is(err, registry.ErrInUse) {
		t.Errorf("API update of the file's peer: %v, want ErrInUse", err)
	}

	// What leaves the file leaves the registry; the API's pool stays.
	mustApply(t, reg, strings.Split(rack, "---")[0])
	if _, err := reg.Peers.Get("tor"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("peer removed from the file: %v, want not found", err)
	}
	if _, err := reg.Pools.Get("mine"); err != nil {
		t.Errorf("the API's pool: %v", err)
	}
}

func TestWatchAppliesChangesAndKeepsTheLastGoodFile(t *testing.T) {
	reg := registrytest.Open(t)
	path := filepath.Join(t.TempDir(), "rack.yaml")
	if err := os.WriteFile(path, []byte(rack), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Watch(ctx, reg, path, 10*time.Millisecond, slog.New(slog.DiscardHandler)); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the peer", func() bool { _, err := reg.Peers.Get("tor"); return err == nil })

	if err := os.WriteFile(path, []byte(strings.Replace(rack, "asn: 64500", "asn: 64501", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the new ASN", func() bool { p, err := reg.Peers.Get("tor"); return err == nil && p.ASN == 64501 })

	// A broken file changes nothing.
	if err := os.WriteFile(path, []byte("kind: BgpPeer\nmetadata: {name: tor}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // ten periods
	if p, err := reg.Peers.Get("tor"); err != nil || p.ASN != 64501 {
		t.Errorf("after a broken file: %+v, %v; want the last good peer", p, err)
	}
	if _, err := reg.Pools.Get("public"); err != nil {
		t.Errorf("after a broken file the pool is gone: %v", err)
	}
}

func mustRange(t *testing.T, s string) model.AddressRange {
	t.Helper()
	r, err := model.ParseAddressRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
