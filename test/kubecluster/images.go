package kubecluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The images every node imports besides Weir's: the pod sandbox and the
// workload the lab's Services front.
const (
	PauseImage = "registry.k8s.io/pause:3.10"
	EchoImage  = "weir.test/echo:lab"
)

// Image is an OCI image archive on disk, importable with
// `ctr -n k8s.io images import`.
type Image struct {
	Ref     string // docker.io/weir/weir-agent:TAG, registry.k8s.io/pause:3.10
	Archive string
}

// buildGoImage builds pkg (a main package of Weir's module) as a static
// binary and writes a one-layer image holding it as /<name>, the
// entrypoint, into dir.
func buildGoImage(ctx context.Context, dir, pkg, name, ref string) (Image, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Image{}, fmt.Errorf("kubecluster: go build %s: %w: %s", pkg, err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return Image{}, fmt.Errorf("kubecluster: %w", err)
	}
	archive := filepath.Join(dir, name+".tar")
	if err := writeOCIArchive(archive, ref, "/"+name, map[string][]byte{name: data}); err != nil {
		return Image{}, err
	}
	return Image{Ref: ref, Archive: archive}, nil
}

// writeOCIArchive writes an OCI image layout, as one tar, whose single
// layer holds files (mode 0755, owned by root) and whose entrypoint is
// entrypoint. The manifest carries the name containerd imports it under.
func writeOCIArchive(path, ref, entrypoint string, files map[string][]byte) error {
	layer, err := tarOf(files, 0o755)
	if err != nil {
		return err
	}
	return writeOCI(path, ref, map[string]any{"Entrypoint": []string{entrypoint}}, [][]byte{layer})
}

// writeOCI writes an OCI image layout, as one tar, of the layers (tars,
// bottom first) with run settings config. The manifest carries the name
// containerd imports it under.
func writeOCI(path, ref string, config map[string]any, layers [][]byte) error {
	var diffIDs []string
	var layerDescs []any
	for _, l := range layers {
		diffIDs = append(diffIDs, digest(l))
		layerDescs = append(layerDescs, descriptor("application/vnd.oci.image.layer.v1.tar", l))
	}
	configBlob, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       config,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", configBlob),
		"layers":        layerDescs,
	})
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": ref}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	entries := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": index,
	}
	for _, blob := range append([][]byte{configBlob, manifest}, layers...) {
		entries["blobs/sha256/"+strings.TrimPrefix(digest(blob), "sha256:")] = blob
	}
	archive, err := tarOf(entries, 0o644)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, archive, 0o644); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}

func descriptor(mediaType string, blob []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(blob), "size": len(blob)}
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// tarOf is a tar of files, in name order so the same files give the same
// bytes (and so the same digests).
func tarOf(files map[string][]byte, mode int64) ([]byte, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, name := range sortedKeys(files) {
		hdr := &tar.Header{Name: name, Mode: mode, Size: int64(len(files[name])), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("kubecluster: %w", err)
		}
		if _, err := w.Write(files[name]); err != nil {
			return nil, fmt.Errorf("kubecluster: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	return buf.Bytes(), nil
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// WeirImages builds Weir's server and agent images with
// deploy/container/build-images.sh, tagged tags[0], and the same images
// again under each further tag (an upgrade to a new tag starts new pods of
// the same code). The build takes a minute or two.
func WeirImages(ctx context.Context, dir string, tags ...string) ([]Image, error) {
	if len(tags) == 0 {
		return nil, fmt.Errorf("kubecluster: WeirImages needs a tag")
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("kubecluster: go env GOMOD: %w", err)
	}
	repo := filepath.Dir(strings.TrimSpace(string(out)))
	built := filepath.Join(dir, tags[0])
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "deploy/container/build-images.sh"),
		"--tag", tags[0], "--oci-dir", built, "--out", filepath.Join(dir, "rootfs"))
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kubecluster: build-images.sh: %w\n%s", err, out)
	}
	var images []Image
	for _, tag := range tags {
		for _, name := range []string{"weir-server", "weir-agent"} {
			im := Image{Ref: "docker.io/weir/" + name + ":" + tag, Archive: filepath.Join(built, name+".tar")}
			if tag != tags[0] {
				if im, err = retag(im, im.Ref, filepath.Join(dir, tag)); err != nil {
					return nil, err
				}
			}
			images = append(images, im)
		}
	}
	return images, nil
}

// retag writes a copy of an image archive into dir whose index names the
// image ref instead.
func retag(im Image, ref, dir string) (Image, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, fmt.Errorf("kubecluster: %w", err)
	}
	f, err := os.Open(im.Archive)
	if err != nil {
		return Image{}, fmt.Errorf("kubecluster: %w", err)
	}
	defer f.Close()
	files := map[string][]byte{}
	r := tar.NewReader(f)
	for {
		hdr, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Image{}, fmt.Errorf("kubecluster: read %s: %w", im.Archive, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if files[hdr.Name], err = io.ReadAll(r); err != nil {
			return Image{}, fmt.Errorf("kubecluster: read %s: %w", im.Archive, err)
		}
	}
	var index struct {
		SchemaVersion int              `json:"schemaVersion"`
		MediaType     string           `json:"mediaType,omitempty"`
		Manifests     []map[string]any `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		return Image{}, fmt.Errorf("kubecluster: %s: index.json: %w", im.Archive, err)
	}
	for _, m := range index.Manifests {
		m["annotations"] = map[string]string{"io.containerd.image.name": ref}
	}
	if files["index.json"], err = json.Marshal(index); err != nil {
		return Image{}, fmt.Errorf("kubecluster: %w", err)
	}
	delete(files, "manifest.json") // Docker's, naming the old tag
	archive, err := tarOf(files, 0o644)
	if err != nil {
		return Image{}, err
	}
	out := filepath.Join(dir, filepath.Base(im.Archive))
	if err := os.WriteFile(out, archive, 0o644); err != nil {
		return Image{}, fmt.Errorf("kubecluster: %w", err)
	}
	return Image{Ref: ref, Archive: out}, nil
}
