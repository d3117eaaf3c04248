// Package e2e tests Weir end to end: real binaries in a lab of network
// namespaces, real TCP connections, assertions on what each pod saw.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/weirlb/weir/test/weirlab"
)

// bin holds the binaries built once for every test.
var bin weirlab.Binaries

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		// Each test skips (or, under CI, fails) with a clear message.
		return m.Run()
	}
	root, err := weirlab.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "weir-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bin, err = weirlab.Build(context.Background(), root, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
