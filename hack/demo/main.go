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

// Command demo shows overlay volumes on one machine, without Kubernetes:
// three VMs from one golden image through the patched virt-launcher
// converter, under a private libvirtd. `make demo` runs it; it needs root
// and the patched KubeVirt tree `make` builds. See docs/demo.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/hack/demo/overlaydemo"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	flags := flag.NewFlagSet("demo", flag.ExitOnError)
	opts := overlaydemo.Options{Log: os.Stdout}
	flags.StringVar(&opts.OutDir, "out", filepath.Join(testenv.OutDir(), "demo"), "output directory: VMI manifests, domain XML, disk usage table and chart")
	flags.StringVar(&opts.WorkDir, "work", "", "work directory for the images, created and removed (default: a new temporary directory)")
	flags.BoolVar(&opts.KeepImages, "keep-images", false, "leave the work directory and its images for inspection")
	_ = flags.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	if err := overlaydemo.Run(ctx, opts); err != nil {
		return err
	}
	fmt.Printf("demo finished in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}
