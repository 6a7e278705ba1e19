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

// Command hookclient drives hook sidecars with KubeVirt v1.7.0's own hook
// manager (kubevirt.io/kubevirt/pkg/hooks), the client virt-launcher uses,
// for the functional suite and the benchmark. The manager only looks in
// /var/run/kubevirt-hooks, so hookclient runs in a private mount namespace
// (started by `unshare --mount --propagation private`) and bind-mounts a
// test directory over /run there; it refuses to mount anything in the
// machine's own namespace.
//
//	hookclient define   --run-dir D --sidecars N --vmi F --domain F --out F
//	hookclient shutdown --run-dir D --sidecars N
//	hookclient cloudinit --run-dir D --sidecars N --vmi F --user-data S
//	hookclient serve    --run-dir D --sidecars N --vmi F --domain F
//	hookclient exec     --run-dir D -- COMMAND ARGS...
//
// serve answers every line on stdin with one OnDefineDomain call and a line
// "<nanoseconds>" or "error: <message>". exec runs a command (e.g.
// KubeVirt's sidecar-shim, which also only knows /var/run/kubevirt-hooks)
// with the same mount.
package main

import (
	"bufio"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	v1 "kubevirt.io/api/core/v1"

	cloudinit "kubevirt.io/kubevirt/pkg/cloud-init"
	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hookclient:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) < 2 {
		return errors.New("usage: hookclient define|shutdown|cloudinit|serve|exec [flags]")
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	runDir := fs.String("run-dir", "", "directory to mount over /run; its kubevirt-hooks is the hook socket directory")
	sidecars := fs.Uint("sidecars", 1, "number of sidecars to collect")
	vmiFile := fs.String("vmi", "", "VMI as JSON")
	domainFile := fs.String("domain", "", "domain XML")
	outFile := fs.String("out", "", "where define writes the domain")
	userData := fs.String("user-data", "", "cloud-init user data")
	if err := fs.Parse(os.Args[2:]); err != nil {
		return err
	}
	if err := mountRun(*runDir); err != nil {
		return err
	}
	if mode == "exec" {
		args := fs.Args()
		if len(args) == 0 {
			return errors.New("exec: no command")
		}
		path, err := exec.LookPath(args[0])
		if err != nil {
			return err
		}
		return syscall.Exec(path, args, os.Environ())
	}

	manager := hooks.GetManager()
	if err := manager.Collect(*sidecars, 30*time.Second); err != nil {
		return fmt.Errorf("collect sidecars: %w", err)
	}
	switch mode {
	case "shutdown":
		return manager.Shutdown()
	case "define", "serve", "cloudinit":
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	vmi := &v1.VirtualMachineInstance{}
	if err := readJSON(*vmiFile, vmi); err != nil {
		return err
	}
	if mode == "cloudinit" {
		data, err := manager.PreCloudInitIso(vmi, &cloudinit.CloudInitData{DataSource: cloudinit.DataSourceNoCloud, UserData: *userData})
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(data)
	}
	// virt-launcher holds the domain as its own DomainSpec, which the
	// manager serialises for the sidecars.
	raw, err := os.ReadFile(*domainFile)
	if err != nil {
		return err
	}
	spec := &api.DomainSpec{}
	if err := xml.Unmarshal(raw, spec); err != nil {
		return fmt.Errorf("parse domain: %w", err)
	}
	if mode == "define" {
		out, err := manager.OnDefineDomain(spec, vmi)
		if err != nil {
			return err
		}
		return os.WriteFile(*outFile, []byte(out), 0o644)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		start := time.Now()
		_, err := manager.OnDefineDomain(spec, vmi)
		if err != nil {
			fmt.Printf("error: %v\n", err)
			continue
		}
		fmt.Println(time.Since(start).Nanoseconds())
	}
	return in.Err()
}

// mountRun bind-mounts dir over /run, only in a mount namespace of its own.
func mountRun(dir string) error {
	if dir == "" {
		return errors.New("--run-dir is required")
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	// unshare(1) execs this program: the parent is in the namespace the
	// mount must not reach.
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return err
	}
	if own == parent {
		return errors.New("refusing to mount over /run outside a private mount namespace (run under unshare --mount)")
	}
	if err := syscall.Mount(dir, "/run", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over /run: %w", dir, err)
	}
	return nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}
