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
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	// A flag set of its own: the framework's test dependencies register
	// theirs on the default one.
	flags := flag.NewFlagSet("demo", flag.ExitOnError)
	opts := overlaydemo.Options{Log: os.Stdout}
	flags.StringVar(&opts.OutDir, "out", filepath.Join(framework.OutDir(), "demo"), "output directory: VMI manifests, domain XML, disk usage table and chart")
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
