/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Command nodeinit is PID 1 of the one-node cluster's PID namespace
// (hack/cluster.sh): it runs the node script, reaps every orphan the node's
// daemons and pods leave, and passes SIGTERM and SIGINT on to the script.
// When the script exits, nodeinit exits with its status, and the kernel
// ends everything else in the namespace.
//
// Without arguments it is the node's pause program: the process that holds
// a pod sandbox's namespaces, reaps, and exits on SIGTERM or SIGINT.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)

	script := -1
	if len(os.Args) > 1 {
		cmd := exec.Command(os.Args[1], os.Args[2:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "nodeinit: %v\n", err)
			os.Exit(1)
		}
		script = cmd.Process.Pid
	}
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			if script < 0 {
				os.Exit(0)
			}
			_ = syscall.Kill(script, sig.(syscall.Signal))
			continue
		}
		// exec.Cmd.Wait would race with this loop, so every child,
		// the script included, is reaped here.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			if pid == script {
				code := status.ExitStatus()
				if status.Signaled() {
					code = 128 + int(status.Signal())
				}
				os.Exit(code)
			}
		}
	}
}
