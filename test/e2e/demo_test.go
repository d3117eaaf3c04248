package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// TestDemo runs README's demo as a newcomer would (make demo runs the same
// program): it must end well and show pods answering the client. Its logs
// go to the test's own folder, removed when the test ends.
func TestDemo(t *testing.T) {
	lab.SkipUnlessPrivileged(t)
	root, err := weirlab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./test/cmd/demo", "-logs", t.TempDir())
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"answered by pod", "the client's own address: preserved", "tearing the lab down"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}
