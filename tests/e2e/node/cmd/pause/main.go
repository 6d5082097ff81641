// Command pause is the e2e real node's sandbox ("pause") container: it sleeps until SIGTERM or SIGINT and reaps
// the children it inherits as PID 1, as registry.k8s.io/pause does. The harness builds it statically and imports it
// into containerd as registry.k8s.io/pause:3.6, since nothing can be pulled on the test machine.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 8)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
