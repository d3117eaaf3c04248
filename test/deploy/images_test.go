package deploy

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/test/lab"
)

// requireImageBuild skips the test unless deploy/container/build-images.sh
// and the chroot checks can run here: root, apt, chroot and unshare. With
// CI=true it fails instead, as the other privileged tests do: CI must never
// skip silently.
func requireImageBuild(t *testing.T) {
	t.Helper()
	lab.RequireRoot(t, "images", "chroot, private network namespaces; Debian", "go", "apt-get", "dpkg-deb", "chroot", "unshare")
}

// checkRuleset uses what the datapath's rules use: concatenated maps keyed
// by protocol, verdict maps, DNAT through a map, random picks.
const checkRuleset = `table ip weir_image_check {
	map backends {
		type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
		elements = { 10.96.0.10 . tcp . 80 : 10.244.1.11 . 8080 }
	}
	chain services {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap { 10.96.0.10 . tcp . 80 : jump pick }
	}
	chain pick {
		ct state new numgen random mod 2 vmap { 0 : jump endpoint, 1 : jump endpoint }
	}
	chain endpoint {
		meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport map @backends
	}
}
`

// TestImages builds both images with deploy/container/build-images.sh, as
// OCI archives (no Docker daemon needed), and runs what their root
// filesystems hold, chrooted: the agent's nft and conntrack with only the
// libraries the image carries, and the static Go binaries.
func TestImages(t *testing.T) {
	requireImageBuild(t)
	out, oci := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, filepath.Join(root(t), "deploy", "container", "build-images.sh"), "--out", out, "--oci-dir", oci, "--tag", "test")
	build.Env = append(os.Environ(), "VERSION=v0.0.0-imagetest")
	start := time.Now()
	b, err := build.CombinedOutput()
	t.Logf("build-images.sh (%s):\n%s", time.Since(start).Round(time.Second), b)
	if err != nil {
		t.Fatalf("build-images.sh: %v", err)
	}
	agent := filepath.Join(out, "weir-agent-rootfs")
	server := filepath.Join(out, "weir-server-rootfs")

	run := func(t *testing.T, name string, args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			t.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	contains := func(t *testing.T, got, want, what string) {
		t.Helper()
		if !strings.Contains(got, want) {
			t.Errorf("%s: output lacks %q:\n%s", what, want, got)
		}
	}

	t.Run("StaticBinaries", func(t *testing.T) {
		for _, p := range []string{filepath.Join(server, "usr/local/bin/weir-server"), filepath.Join(server, "usr/local/bin/lbctl"), filepath.Join(agent, "usr/local/bin/weir-agent")} {
			f, err := elf.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
				t.Errorf("%s is dynamically linked; the server image has no libraries", p)
			}
			f.Close()
		}
	})

	t.Run("AgentTools", func(t *testing.T) {
		contains(t, run(t, "chroot", agent, "/usr/sbin/nft", "--version"), "nftables v", "nft --version")
		contains(t, run(t, "chroot", agent, "/usr/sbin/conntrack", "--version"), "conntrack v", "conntrack --version")
		// Go's flag package exits 0 after printing the usage.
		contains(t, run(t, "chroot", agent, "/usr/local/bin/weir-agent", "-help"), "-node-name", "weir-agent -help")
	})

	t.Run("AgentRuleset", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(agent, "tmp", "check.nft"), []byte(checkRuleset), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(agent, "tmp", "bad.nft"), []byte("table ip weir_image_check { chain c { tcp dport frobnicate } }\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// Private network namespaces: nothing of the host's nftables is
		// touched, even by the checks.
		run(t, "unshare", "--net", "chroot", agent, "/usr/sbin/nft", "-c", "-f", "/tmp/check.nft")
		if out, err := exec.CommandContext(ctx, "unshare", "--net", "chroot", agent, "/usr/sbin/nft", "-c", "-f", "/tmp/bad.nft").CombinedOutput(); err == nil {
			t.Errorf("nft -c accepted a broken ruleset: the check checks nothing\n%s", out)
		}
		// Loaded and listed back: protocol names come from netbase's
		// /etc/protocols, as on a host; without it nft lists "6", not "tcp".
		listing := run(t, "unshare", "--net", "sh", "-c", `chroot "$1" /usr/sbin/nft -f /tmp/check.nft && chroot "$1" /usr/sbin/nft list table ip weir_image_check`, "sh", agent)
		contains(t, listing, "10.96.0.10 . tcp . 80 : 10.244.1.11 . 8080", "nft list")
	})

	t.Run("Server", func(t *testing.T) {
		// As the image's (and the Deployment's) user.
		contains(t, run(t, "chroot", "--userspec=65532:65532", server, "/usr/local/bin/weir-server", "-help"), "-data-dir", "weir-server -help")
		contains(t, run(t, "chroot", "--userspec=65532:65532", server, "/usr/local/bin/lbctl", "--help"), "lbctl", "lbctl --help")
		passwd, err := os.ReadFile(filepath.Join(server, "etc", "passwd"))
		if err != nil {
			t.Fatal(err)
		}
		contains(t, string(passwd), ":x:65532:65532:", "/etc/passwd")
		if fi, err := os.Stat(filepath.Join(server, "etc", "ssl", "certs", "ca-certificates.crt")); err != nil || fi.Size() == 0 {
			t.Errorf("no CA certificates in the server image: %v", err)
		}
	})

	t.Run("DebianVersions", func(t *testing.T) {
		// Every package in the agent image is at the version apt resolves
		// on this machine.
		dir := filepath.Join(agent, "var", "lib", "dpkg", "status.d")
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		inImage := map[string]string{}
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			inImage[e.Name()] = controlField(string(data), "Version")
			names = append(names, e.Name())
		}
		for _, want := range []string{"nftables", "libnftables1", "conntrack", "libc6", "netbase"} {
			if _, ok := inImage[want]; !ok {
				t.Errorf("the agent image has no %s; it has %v", want, names)
			}
		}
		policy := run(t, "apt-cache", append([]string{"policy"}, names...)...)
		candidates := map[string]string{}
		var pkg string
		for line := range strings.Lines(policy) {
			if !strings.HasPrefix(line, " ") {
				pkg = strings.TrimSuffix(strings.TrimSpace(line), ":")
			} else if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate: "); ok {
				candidates[pkg] = v
			}
		}
		for name, v := range inImage {
			if candidates[name] != v {
				t.Errorf("%s: %s in the image, apt resolves %q", name, v, candidates[name])
			}
		}
	})

	t.Run("OCIArchives", func(t *testing.T) {
		checkOCIArchive(t, filepath.Join(oci, "weir-server.tar"), "weir-server", "65532:65532")
		checkOCIArchive(t, filepath.Join(oci, "weir-agent.tar"), "weir-agent", "0:0")
	})
}

// controlField is the value of a Debian control file's field.
func controlField(control, name string) string {
	s := bufio.NewScanner(strings.NewReader(control))
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), name+": "); ok {
			return v
		}
	}
	return ""
}

// checkOCIArchive checks what docker load and ctr images import rely on:
// blobs named by their digest, the chain from index.json to the one layer,
// the image's name, user and entrypoint, and the layer's contents.
func checkOCIArchive(t *testing.T, path, name, user string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Typeflag == tar.TypeReg {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations"`
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		digest, _ := strings.CutPrefix(d.Digest, "sha256:")
		b, ok := files["blobs/sha256/"+digest]
		if !ok {
			t.Fatalf("%s: no blob %s", path, d.Digest)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != digest || len(b) != d.Size {
			t.Errorf("%s: blob %s has digest %x, size %d; want size %d", path, d.Digest, sum, len(b), d.Size)
		}
		return b
	}
	decode := func(data []byte, v any) {
		t.Helper()
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	var index struct{ Manifests []descriptor }
	decode(files["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("%s: index.json lists %d manifests", path, len(index.Manifests))
	}
	if got, want := index.Manifests[0].Annotations["io.containerd.image.name"], "docker.io/weir/"+name+":test"; got != want {
		t.Errorf("%s: image name %q, want %q", path, got, want)
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	decode(blob(index.Manifests[0]), &manifest)
	if len(manifest.Layers) != 1 {
		t.Fatalf("%s: %d layers, want 1", path, len(manifest.Layers))
	}
	var config struct {
		Architecture string
		OS           string
		Config       struct {
			User       string
			Entrypoint []string
		}
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	decode(blob(manifest.Config), &config)
	if config.OS != "linux" || config.Config.User != user || !slices.Equal(config.Config.Entrypoint, []string{"/usr/local/bin/" + name}) {
		t.Errorf("%s: config %+v, want user %s, entrypoint /usr/local/bin/%s", path, config, user, name)
	}
	if !slices.Equal(config.RootFS.DiffIDs, []string{manifest.Layers[0].Digest}) {
		t.Errorf("%s: diff_ids %v, want the uncompressed layer %s", path, config.RootFS.DiffIDs, manifest.Layers[0].Digest)
	}
	var docker []struct {
		Config   string
		RepoTags []string
	}
	decode(files["manifest.json"], &docker)
	if len(docker) != 1 || docker[0].Config != "blobs/sha256/"+strings.TrimPrefix(manifest.Config.Digest, "sha256:") || !slices.Equal(docker[0].RepoTags, []string{"weir/" + name + ":test"}) {
		t.Errorf("%s: Docker's manifest.json %+v does not match the OCI manifest", path, docker)
	}
	layer := tar.NewReader(bytes.NewReader(blob(manifest.Layers[0])))
	seen := map[string]*tar.Header{}
	for {
		h, err := layer.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: layer: %v", path, err)
		}
		seen[h.Name] = h
	}
	if h := seen["./usr/local/bin/"+name]; h == nil || h.Uid != 0 || h.Mode&0o111 == 0 {
		t.Errorf("%s: the layer lacks an executable /usr/local/bin/%s owned by root", path, name)
	}
	if h := seen["./var/lib/weir/"]; h == nil || strconv.Itoa(h.Uid)+":"+strconv.Itoa(h.Gid) != user {
		t.Errorf("%s: /var/lib/weir is not owned by the image's user %s", path, user)
	}
}
