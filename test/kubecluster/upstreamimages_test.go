package kubecluster

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A layer holds its folders before what they hold, links as links, and
// the same entries always give the same bytes (the same image digest).
func TestLayerTar(t *testing.T) {
	l := newLayer()
	l.file("usr/bin/tool", []byte("#!"), 0o755)
	l.link("bin/sh", "/usr/bin/dash")
	l.dir("tmp", 0o1777)
	b, err := l.tar()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	r := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name+" "+string(h.Typeflag)+" "+h.Linkname)
		if h.Name == "tmp/" && h.Mode != 0o1777 {
			t.Errorf("tmp/ mode %o, want 1777", h.Mode)
		}
	}
	want := []string{"bin/ 5 ", "bin/sh 2 /usr/bin/dash", "tmp/ 5 ", "usr/ 5 ", "usr/bin/ 5 ", "usr/bin/tool 0 "}
	if len(got) != len(want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %q, want %q", i, got[i], want[i])
		}
	}
	again, _ := l.tar()
	if !bytes.Equal(b, again) {
		t.Error("the same layer gave other bytes")
	}
}

// A report names every spec of the suite: only the specs (It) are read,
// with their full names, states and failures.
func TestReadReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.json")
	os.WriteFile(path, []byte(`[{"SpecReports": [
	  {"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed"},
	  {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeType": "It", "LeafNodeText": "should serve [Conformance]", "State": "passed", "RunTime": 2000000000},
	  {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeType": "It", "LeafNodeText": "should fail", "State": "failed", "Failure": {"Message": "boom"}}
	]}]`), 0o644)
	got, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "[sig-network] Services should serve [Conformance]" || !got[0].Passed() || got[0].Duration.Seconds() != 2 ||
		got[1].State != "failed" || got[1].Failure != "boom" {
		t.Errorf("read %+v", got)
	}
}
