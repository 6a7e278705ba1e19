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
