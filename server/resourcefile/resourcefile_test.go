package resourcefile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
	"github.com/weirlb/weir/test/wait"
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
		{"kind: AddressPool\nmetadata: {name: x}\naddresses: [198.51.100.16/28]\nl2_advertisement: {interfaces: [eth0, eth0]}\n", "document 2: l2_advertisement.interfaces[1]"},
		{"kind: AddressPool\nmetadata: {name: x}\naddresses: [198.51.100.16/28]\nl2_advertisement: {}\nbgp_advertisement: {local_preference: 5}\n", "document 2: bgp_advertisement: an L2 pool is announced over BGP too by its bgp_advertisements"},
		{"kind: BgpPeer\nmetadata: {name: x}\nadress: 192.0.2.1\n", "document 2: "},
		// A key said twice: which one was meant is not for the server to guess.
		{"kind: AddressPool\nmetadata: {name: x}\naddresses: [198.51.100.16/28]\naddresses: [198.51.100.32/28]\n", `document 2: `},
	} {
		_, err := Parse("rack.yaml", []byte("kind: AddressPool\nmetadata: {name: ok}\naddresses: [198.51.100.0/28]\n---\n"+tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "rack.yaml: ") {
			t.Errorf("%q: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
}

// An L2 pool in the file (the Kubernetes mode's ConfigMap) is an L2 pool
// in the registry.
func TestAnL2PoolFromTheFile(t *testing.T) {
	reg := registrytest.Open(t)
	mustApply(t, reg, "kind: AddressPool\nmetadata: {name: lan}\naddresses: [192.0.2.200-192.0.2.209]\nl2_advertisement:\n  interfaces: [eth0]\n  node_selector: {rack: a}\n")
	p, err := reg.Pools.Get("lan")
	if err != nil {
		t.Fatal(err)
	}
	if p.L2 == nil || !slices.Equal(p.L2.Interfaces, []string{"eth0"}) || p.L2.NodeSelector["rack"] != "a" {
		t.Errorf("pool %+v; want its L2 advertisement on eth0 for rack a", p)
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

// watch runs a Watcher over path until the test ends.
func watch(t *testing.T, w *Watcher) {
	t.Helper()
	if w.Period == 0 {
		w.Period = 10 * time.Millisecond
	}
	if w.Settle == 0 {
		w.Settle = 20 * time.Millisecond
	}
	w.Log = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Watch(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	wait.Until(t, 5*time.Second, what, ok)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchAppliesChangesAndKeepsTheLastGoodFile(t *testing.T) {
	reg := registrytest.Open(t)
	path := filepath.Join(t.TempDir(), "rack.yaml")
	writeFile(t, path, rack)
	rejected := NewRejectedMetric(nil)
	watch(t, &Watcher{Registry: reg, Path: path, Rejected: rejected})
	waitFor(t, "the peer", func() bool { _, err := reg.Peers.Get("tor"); return err == nil })

	writeFile(t, path, strings.Replace(rack, "asn: 64500", "asn: 64501", 1))
	waitFor(t, "the new ASN", func() bool { p, err := reg.Peers.Get("tor"); return err == nil && p.ASN == 64501 })

	// A broken file changes nothing.
	writeFile(t, path, "kind: BgpPeer\nmetadata: {name: tor}\n")
	waitFor(t, "the broken file to be refused", func() bool { return testutil.ToFloat64(rejected.WithLabelValues("invalid")) == 1 })
	if p, err := reg.Peers.Get("tor"); err != nil || p.ASN != 64501 {
		t.Errorf("after a broken file: %+v, %v; want the last good peer", p, err)
	}
	if _, err := reg.Pools.Get("public"); err != nil {
		t.Errorf("after a broken file the pool is gone: %v", err)
	}
}

// TestWatchNeverAppliesAHalfWrittenFile rewrites the file the way a slow
// `cat > file` does, truncating it and writing it again a line at a time,
// many times in a row, while the watcher polls much faster than the writer:
// the pool and the peer must never disappear, and the last content written
// must be the one applied. The removal guard is off, so that only reading
// settled content keeps the empty and the pool-only prefixes out.
func TestWatchNeverAppliesAHalfWrittenFile(t *testing.T) {
	reg := registrytest.Open(t)
	path := filepath.Join(t.TempDir(), "rack.yaml")
	writeFile(t, path, rack)
	// The server's settle time: a writer pausing longer than it between
	// two lines defeats any settle time, and a loaded machine (a cold CI
	// build beside the test) stalled a 1 ms sleep past 100 ms.
	watch(t, &Watcher{Registry: reg, Path: path, Period: time.Millisecond, Settle: time.Second, AllowRemovingAll: true})
	waitFor(t, "the peer", func() bool { _, err := reg.Peers.Get("tor"); return err == nil })

	stop := make(chan struct{})
	lost := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				close(lost)
				return
			default:
			}
			_, errPool := reg.Pools.Get("public")
			_, errPeer := reg.Peers.Get("tor")
			if errPool != nil || errPeer != nil {
				lost <- fmt.Sprintf("pool: %v, peer: %v", errPool, errPeer)
				close(lost)
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()

	var content string
	for i := range 30 {
		content = strings.Replace(rack, "asn: 64500", fmt.Sprintf("asn: %d", 64500+i%2), 1)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.SplitAfter(content, "\n") {
			if _, err := f.WriteString(line); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		f.Close()
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	if msg, ok := <-lost; ok {
		t.Fatalf("a half-written file was applied: %s", msg)
	}
	want := uint32(64500 + 29%2)
	waitFor(t, "the last content written", func() bool { p, err := reg.Peers.Get("tor"); return err == nil && p.ASN == want })
}

// TestWatchRefusesAFileThatRemovesEveryAddressInUse: emptying the file, or
// leaving out every pool whose addresses services use, is refused and
// counted unless the operator allowed it; removing one pool of several is
// not.
func TestWatchRefusesAFileThatRemovesEveryAddressInUse(t *testing.T) {
	const twoPools = rack + `---
kind: AddressPool
metadata:
  name: spare
addresses:
- 198.51.100.0/28
`
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			reg := registrytest.Open(t)
			path := filepath.Join(t.TempDir(), "rack.yaml")
			writeFile(t, path, twoPools)
			rejected := NewRejectedMetric(nil)
			watch(t, &Watcher{Registry: reg, Path: path, Rejected: rejected, AllowRemovingAll: allow})
			waitFor(t, "the pools", func() bool { _, err := reg.Pools.Get("spare"); return err == nil })
			if _, err := reg.Services.Create(&model.Service{
				Meta: model.Meta{Namespace: "default", Name: "web"}, Type: model.LoadBalancer,
				ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.10")},
				Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080, TargetPort: 8080}},
				LoadBalancerIPs:       []netip.Addr{netip.MustParseAddr("203.0.113.10")},
				ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster,
			}); err != nil {
				t.Fatal(err)
			}

			// Dropping the unused pool is an ordinary change.
			writeFile(t, path, rack)
			waitFor(t, "the spare pool to go", func() bool { _, err := reg.Pools.Get("spare"); return errors.Is(err, registry.ErrNotFound) })

			for _, tc := range []struct{ reason, content string }{
				{"removes-all-pools", strings.Split(rack, "---")[1]},
				{"empty", ""},
			} {
				writeFile(t, path, tc.content)
				if allow {
					waitFor(t, "the pool in use to go", func() bool { _, err := reg.Pools.Get("public"); return errors.Is(err, registry.ErrNotFound) })
					writeFile(t, path, rack)
					waitFor(t, "the pool back", func() bool { _, err := reg.Pools.Get("public"); return err == nil })
					continue
				}
				waitFor(t, tc.reason+" counted", func() bool { return testutil.ToFloat64(rejected.WithLabelValues(tc.reason)) == 1 })
				if _, err := reg.Pools.Get("public"); err != nil {
					t.Errorf("%s: the pool in use was removed: %v", tc.reason, err)
				}
				if _, err := reg.Peers.Get("tor"); err != nil {
					t.Errorf("%s: the peer was removed: %v", tc.reason, err)
				}
			}
		})
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

// A file the registry refuses in part changes nothing at all: its peer,
// valid on its own, is not taken while its pool is refused (a pool of that
// name is another source's), and the last good content stays whole.
func TestARefusedFileChangesNothing(t *testing.T) {
	reg := registrytest.Open(t)
	mustApply(t, reg, rack)
	if _, err := reg.Pools.Create(&model.AddressPool{Meta: model.Meta{Name: "theirs", Source: model.SourceKubernetes},
		Ranges: []model.AddressRange{mustRange(t, "198.51.100.0/28")}}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, reg)

	for _, tc := range []struct{ name, content string }{
		{"a pool of another source's name", strings.Replace(rack, "asn: 64500", "asn: 64501", 1) +
			"---\nkind: AddressPool\nmetadata: {name: theirs}\naddresses: [198.51.100.32/28]\n" +
			"---\nkind: BgpPeer\nmetadata: {name: rack-router-v4}\naddress: 192.0.2.9\nasn: 64500\nmy_asn: 64512\n"},
		{"a pool overlapping another source's", "kind: BgpPeer\nmetadata: {name: rack-router-v4}\naddress: 192.0.2.9\nasn: 64500\nmy_asn: 64512\n" +
			"---\nkind: AddressPool\nmetadata: {name: public}\naddresses: [198.51.100.8/29]\n"},
	} {
		r, err := Parse("rack.yaml", []byte(tc.content))
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(reg, r); !errors.Is(err, registry.ErrInUse) {
			t.Errorf("%s: %v; want ErrInUse", tc.name, err)
		}
		if after := snapshot(t, reg); after != before {
			t.Errorf("%s: the refused file changed the registry:\n%s\nwant\n%s", tc.name, after, before)
		}
	}
}

// snapshot is every pool and peer the registry holds, with its source,
// version and what tells one content from another.
func snapshot(t *testing.T, reg *registry.Registry) string {
	t.Helper()
	var b strings.Builder
	pools, _ := reg.Pools.List("", nil)
	for _, p := range pools {
		fmt.Fprintf(&b, "pool %s source=%s v%d %v\n", p.Name, p.Source, p.ResourceVersion, p.Ranges)
	}
	peers, _ := reg.Peers.List("", nil)
	for _, p := range peers {
		fmt.Fprintf(&b, "peer %s source=%s v%d %s asn=%d\n", p.Name, p.Source, p.ResourceVersion, p.Address, p.ASN)
	}
	return b.String()
}
