// Command testdeps builds, before the tests run, the heavy dependencies
// some tests need and that would otherwise be built inside a test's clock:
// the real Kubernetes binary and its network e2e tests (see test/kubeapi) and helm (test/toolbin). It is what `make
// testdeps` runs, and it does nothing when they are already built.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/weirlb/weir/test/kubeapi"
	"github.com/weirlb/weir/test/toolbin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bin, err := kubeapi.BuildBinary(ctx, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("testdeps: Kubernetes (apiserver, kubelet, ...) at", bin)
	e2e, err := kubeapi.E2E(ctx, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("testdeps: Kubernetes' network e2e tests at", e2e)
	helm, err := toolbin.Helm(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("testdeps: helm at", helm)
}
