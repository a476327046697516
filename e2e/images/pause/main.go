// Command pause is the sandbox ("infra") container of every pod in the end-to-end cluster: it
// holds the pod's namespaces open, reaps orphaned children (it is PID 1 of the pod when the
// process namespace is shared) and exits cleanly on SIGINT or SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (tidalmq e2e)")
		return
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child so none stays a zombie.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
