// Command apiserver is a stock Kubernetes control plane and kubelet built
// from the k8s.io/kubernetes module, so Weir's tests can run against the
// real thing without downloading release binaries. One binary holds four
// programs, so their shared packages are compiled once:
//
//	apiserver [kube-apiserver flags]          the kube-apiserver
//	apiserver kube-apiserver [flags]          the same
//	apiserver kube-controller-manager [flags]
//	apiserver kube-scheduler [flags]
//	apiserver kubelet [flags]
package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	cmd, args := command(os.Args[1:])
	cmd.SetArgs(args)
	// cli.Run sets up logging and flag normalisation the same way the
	// upstream mains do, and returns the exit code.
	os.Exit(cli.Run(cmd))
}

// command picks the program named by the first argument; without one
// (flags only, as test/kubeapi starts it) it is the kube-apiserver.
func command(args []string) (*cobra.Command, []string) {
	if len(args) > 0 {
		switch args[0] {
		case "kube-apiserver":
			return apiserver.NewAPIServerCommand(), args[1:]
		case "kube-controller-manager":
			return controllermanager.NewControllerManagerCommand(), args[1:]
		case "kube-scheduler":
			return scheduler.NewSchedulerCommand(), args[1:]
		case "kubelet":
			return kubelet.NewKubeletCommand(context.Background()), args[1:]
		}
	}
	return apiserver.NewAPIServerCommand(), args
}
