// Command pause is the pod sandbox's process for the cluster lab
// (test/kubecluster): it holds the pod's namespaces and does nothing until
// it is told to stop. No registry is reachable from where Weir is tested,
// so the lab builds its sandbox image from this.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	// As PID 1 of the pod, the kernel hands orphans to it: reap them.
	signal.Notify(sig, syscall.SIGCHLD)
	for s := range sig {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
