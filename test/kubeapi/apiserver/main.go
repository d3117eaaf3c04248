// Command apiserver is a stock kube-apiserver built from the k8s.io/kubernetes
// module, so Weir's tests can run against the real thing on loopback without
// downloading release binaries.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	// cli.Run sets up logging and flag normalisation the same way the
	// upstream kube-apiserver main does, and returns the exit code.
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
