// Command apiserver is a stock Kubernetes control plane, kubelet,
// kube-proxy and kubectl built from the k8s.io/kubernetes module, so Weir's
// tests can run against the real thing without downloading release
// binaries. One binary holds every program, so their shared packages are
// compiled once:
//
//	apiserver [kube-apiserver flags]          the kube-apiserver
//	apiserver kube-apiserver [flags]          the same
//	apiserver kube-controller-manager [flags]
//	apiserver kube-scheduler [flags]
//	apiserver kubelet [flags]
//	apiserver kube-proxy [flags]
//	apiserver kubectl [args]
//
// Run under one of those names (a link called kubectl, say), it is that
// program: Kubernetes' e2e tests run "kubectl" from their PATH.
//
// The e2e tests themselves are the test binary of ./upstream.
package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	cmd, args := command(filepath.Base(os.Args[0]), os.Args[1:])
	cmd.SetArgs(args)
	// cli.Run sets up logging and flag normalisation the same way the
	// upstream mains do, and returns the exit code.
	os.Exit(cli.Run(cmd))
}

// programs are the commands by name.
var programs = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-proxy":              proxy.NewProxyCommand,
	"kubectl":                 kubectl.NewDefaultKubectlCommand,
}

// command picks the program the binary is run as (name), else the one
// named by the first argument; without either (flags only, as test/kubeapi
// starts it) it is the kube-apiserver.
func command(name string, args []string) (*cobra.Command, []string) {
	if p, ok := programs[name]; ok {
		return p(), args
	}
	if len(args) > 0 {
		if p, ok := programs[args[0]]; ok {
			return p(), args[1:]
		}
	}
	return apiserver.NewAPIServerCommand(), args
}
