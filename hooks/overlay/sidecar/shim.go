package sidecar

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// Names under which KubeVirt's sidecar-shim looks for hook binaries in
// $PATH (cmd/sidecars/sidecar_shim.go).
const (
	ShimOnDefineDomain  = "onDefineDomain"
	ShimPreCloudInitIso = "preCloudInitIso"
)

// RunShimOnDefineDomain is the sidecar-shim contract for OnDefineDomain:
// `onDefineDomain --vmi <VMI JSON> --domain <domain XML>` prints the new
// domain on stdout; a failure is a non-zero exit, which the shim returns
// to virt-launcher as an error.
func RunShimOnDefineDomain(ctx context.Context, hook *Hook, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(ShimOnDefineDomain, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	vmi := fs.String("vmi", "", "VMI as JSON")
	domain := fs.String("domain", "", "domain as XML")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w", ShimOnDefineDomain, err)
	}
	if *vmi == "" || *domain == "" {
		return fmt.Errorf("%s: --vmi and --domain are required", ShimOnDefineDomain)
	}
	out, err := hook.OnDefineDomain(ctx, []byte(*vmi), []byte(*domain))
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// RunShimPreCloudInitIso is the sidecar-shim contract for PreCloudInitIso:
// `preCloudInitIso --vmi <VMI JSON> --cloud-init <CloudInitData JSON>`
// prints the cloud-init data, here unchanged.
func RunShimPreCloudInitIso(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(ShimPreCloudInitIso, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("vmi", "", "VMI as JSON")
	data := fs.String("cloud-init", "", "CloudInitData as JSON")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w", ShimPreCloudInitIso, err)
	}
	_, err := io.WriteString(stdout, *data)
	return err
}
