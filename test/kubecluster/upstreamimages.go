package kubecluster

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/weirlb/weir/test/kubeapi"
)

// The images Kubernetes' network e2e tests run (test/utils/image of the
// same release), under the names the tests give them.
const (
	AgnhostImage    = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	BusyBoxImage    = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	NginxImage      = "registry.k8s.io/e2e-test-images/nginx:1.15-4"
	RegressionImage = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.4"
	IptablesImage   = "registry.k8s.io/build-image/distroless-iptables:v0.9.6"
	E2EPauseImage   = "registry.k8s.io/pause:3.10.2"
)

// UpstreamImages builds the e2e tests' images into dir, from this
// machine's parts, as upstream builds them from Alpine's:
//
//   - agnhost: upstream's agnhost (built from the Kubernetes module) as
//     /agnhost, the entrypoint, over a userland the tests' commands use:
//     BusyBox's programs (Debian's busybox-static; Alpine's are BusyBox)
//     and, with their shared libraries, the programs upstream adds to
//     them: bash, curl, nc (netcat-openbsd) and ss (iproute2); GNU wget,
//     as Debian's static BusyBox's wget crashes (SIGSEGV, on this host
//     too); and dash as /bin/sh.
//   - busybox: BusyBox alone.
//   - regression-issue-74839: upstream's program of that name (a server
//     that sends a packet out of its connection's window), alone.
//   - distroless-iptables: the host-side tools a privileged test pod runs
//     on the node's network (conntrack, iptables, nft), over BusyBox and
//     dash.
//   - nginx: a stand-in, agnhost's test-webserver answering on port 80:
//     the tests that name it only need a pod serving HTTP on 80.
//   - pause 3.10.2: the lab's pause program under the tests' name for it.
func UpstreamImages(ctx context.Context, dir string) ([]Image, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	agnhost, err := kubeapi.TestImageProgram(ctx, dir, "agnhost")
	if err != nil {
		return nil, err
	}
	boom, err := kubeapi.TestImageProgram(ctx, dir, "regression-issue-74839")
	if err != nil {
		return nil, err
	}
	busybox, err := busyboxLayer()
	if err != nil {
		return nil, err
	}
	tools := newLayer()
	for _, prog := range []string{"dash", "bash", "curl", "nc.openbsd", "ss", "wget"} {
		if err := tools.addProgram(ctx, prog); err != nil {
			return nil, err
		}
	}
	// netcat-openbsd installs itself as nc through an alternative. The
	// shell is dash, as on Debian: Debian's static BusyBox runs its own
	// applets before any program of PATH, so its sh would run its nc
	// rather than netcat-openbsd's, whose flags the tests use.
	tools.link("usr/bin/nc", "/usr/bin/nc.openbsd")
	tools.link("bin/sh", "/usr/bin/dash")
	tools.link("bin/bash", "/usr/bin/bash")
	if err := tools.addFile(agnhost, "agnhost"); err != nil {
		return nil, err
	}
	tools.link("agnhost-2", "agnhost")
	for _, d := range []string{"tmp", "uploads"} {
		tools.dir(d, 0o1777)
	}
	// The users a few tests name, as upstream's image adds them.
	tools.file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"), 0o644)
	tools.file("etc/group", []byte("root:x:0:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"), 0o644)

	var images []Image
	add := func(ref, name string, config map[string]any, layers ...*layer) error {
		archive := filepath.Join(dir, name+".tar")
		if err := writeImage(archive, ref, config, layers...); err != nil {
			return err
		}
		images = append(images, Image{Ref: ref, Archive: archive})
		return nil
	}
	if err := add(AgnhostImage, "agnhost", map[string]any{"Entrypoint": []string{"/agnhost"}, "Cmd": []string{"pause"}}, busybox, tools); err != nil {
		return nil, err
	}
	if err := add(NginxImage, "nginx", map[string]any{"Entrypoint": []string{"/agnhost", "test-webserver", "--port=80"}}, busybox, tools); err != nil {
		return nil, err
	}
	if err := add(BusyBoxImage, "busybox", map[string]any{"Cmd": []string{"sh"}}, busybox); err != nil {
		return nil, err
	}
	regression := newLayer()
	if err := regression.addFile(boom, "regression-issue-74839"); err != nil {
		return nil, err
	}
	if err := add(RegressionImage, "regression-issue-74839", map[string]any{"Entrypoint": []string{"/regression-issue-74839"}}, regression); err != nil {
		return nil, err
	}
	hostTools := newLayer()
	for _, prog := range []string{"dash", "conntrack", "iptables", "nft"} {
		if err := hostTools.addProgram(ctx, prog); err != nil {
			return nil, err
		}
	}
	hostTools.link("bin/sh", "/usr/bin/dash")
	if err := add(IptablesImage, "distroless-iptables", nil, busybox, hostTools); err != nil {
		return nil, err
	}
	pause, err := buildGoImage(ctx, dir, "github.com/weirlb/weir/test/cmd/pause", "pause", E2EPauseImage)
	if err != nil {
		return nil, err
	}
	return append(images, pause), nil
}

// busyboxLayer is Debian's static BusyBox as /bin/busybox and every applet
// it has as a link to it, where BusyBox itself would put it.
func busyboxLayer() (*layer, error) {
	const bb = "/bin/busybox"
	data, err := os.ReadFile(bb)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: the images need Debian's busybox-static: %w", err)
	}
	if f, err := elf.Open(bb); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	} else {
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				return nil, fmt.Errorf("kubecluster: %s is linked dynamically: the images need Debian's busybox-static", bb)
			}
		}
	}
	out, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("kubecluster: busybox --list-full: %w", err)
	}
	l := newLayer()
	l.file("bin/busybox", data, 0o755)
	for applet := range strings.FieldsSeq(string(out)) {
		if applet != "bin/busybox" {
			l.link(applet, "/bin/busybox")
		}
	}
	return l, nil
}

// layer is an image layer being made: files, links and folders by path
// (relative, no leading slash). Later additions replace earlier ones.
type layer struct {
	entries map[string]layerEntry
}

type layerEntry struct {
	data []byte
	mode int64
	link string // a symbolic link when set
	dir  bool
}

func newLayer() *layer { return &layer{entries: map[string]layerEntry{}} }

func (l *layer) file(name string, data []byte, mode int64) {
	l.entries[name] = layerEntry{data: data, mode: mode}
}

func (l *layer) link(name, target string) { l.entries[name] = layerEntry{link: target, mode: 0o777} }

func (l *layer) dir(name string, mode int64) { l.entries[name] = layerEntry{dir: true, mode: mode} }

// addFile copies the file at path into the layer as name, executable.
func (l *layer) addFile(path, name string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	l.file(name, data, 0o755)
	return nil
}

// addProgram copies a program of this machine (found on PATH) into the
// layer at the same path (its content, through any link), with every shared library ldd names for it and
// the dynamic loader, each at the path ldd gives.
func (l *layer) addProgram(ctx context.Context, name string) error {
	prog, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("kubecluster: the e2e images need %s: %w", name, err)
	}
	// The program goes in under the name it was found by (iptables is a
	// link to a multi-call binary that reads its name).
	out, err := exec.CommandContext(ctx, "ldd", prog).Output()
	if err != nil {
		return fmt.Errorf("kubecluster: ldd %s: %w", prog, err)
	}
	paths := []string{prog}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"
		fields := strings.Fields(sc.Text())
		for _, f := range fields {
			if strings.HasPrefix(f, "/") {
				paths = append(paths, f)
				break
			}
		}
	}
	for _, p := range paths {
		data, err := os.ReadFile(p) // through any link: the library itself
		if err != nil {
			return fmt.Errorf("kubecluster: %w", err)
		}
		l.file(strings.TrimPrefix(p, "/"), data, 0o755)
	}
	return nil
}

// tar writes the layer in path order, each entry's parent folders first,
// so the same entries give the same bytes.
func (l *layer) tar() ([]byte, error) {
	// Folders are keyed with a trailing slash, which sorts them before
	// what they hold.
	keys := map[string]bool{}
	for name, e := range l.entries {
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			keys[d+"/"] = true
		}
		if e.dir {
			name += "/"
		}
		keys[name] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, key := range sorted {
		hdr := &tar.Header{Name: key, ModTime: time.Unix(0, 0), Typeflag: tar.TypeDir, Mode: 0o755}
		e, ok := l.entries[strings.TrimSuffix(key, "/")]
		switch {
		case ok && e.dir:
			hdr.Mode = e.mode
		case ok && e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.link, e.mode
		case ok:
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, e.mode, int64(len(e.data))
		}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("kubecluster: %w", err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := w.Write(e.data); err != nil {
				return nil, fmt.Errorf("kubecluster: %w", err)
			}
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	return buf.Bytes(), nil
}

// writeImage writes an OCI image archive (see writeOCIArchive) of the
// layers, bottom first, with config as the image's run settings
// (Entrypoint, Cmd).
func writeImage(archive, ref string, config map[string]any, layers ...*layer) error {
	var tars [][]byte
	for _, l := range layers {
		t, err := l.tar()
		if err != nil {
			return err
		}
		tars = append(tars, t)
	}
	return writeOCI(archive, ref, config, tars)
}
