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

package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// KubeVirtVersion is the KubeVirt release whose patched tree and binaries
// the suites use: $KUBEVIRT_VERSION, as hack/ scripts read it, else the
// default line.
func KubeVirtVersion() string {
	if v := os.Getenv("KUBEVIRT_VERSION"); v != "" {
		return v
	}
	return "v1.8.3"
}

// KubeVirtTree is the assembled, patched KubeVirt tree the suites build
// their tools in: $KUBEVIRT_TREE (as hack/kubevirt.sh uses it), else
// _build/kubevirt-<KubeVirtVersion> of this checkout.
func KubeVirtTree() string {
	if tree := os.Getenv("KUBEVIRT_TREE"); tree != "" {
		return tree
	}
	return filepath.Join(RepoRoot(), "_build", "kubevirt-"+KubeVirtVersion())
}

// KubeVirtOut is where `make` puts the patched KubeVirt's binaries and
// manifests: _out/kubevirt-<KubeVirtVersion>.
func KubeVirtOut() string {
	return filepath.Join(OutDir(), "kubevirt-"+KubeVirtVersion())
}

// BuildInKubeVirtTree builds test tools whose source lives in this
// repository as main packages of the KubeVirt tree, so they link the patched
// packages themselves, without writing into the tree (`go build -overlay`).
// tools maps a package directory inside the tree (e.g. "cmd/vmi2domain") to
// the tool's main.go here; each binary lands in outDir under the package's
// last path element.
func BuildInKubeVirtTree(ctx context.Context, tools map[string]string, outDir string) error {
	tree, err := filepath.Abs(KubeVirtTree())
	if err != nil {
		return err
	}
	// go runs in the tree: a relative outDir would land inside it.
	if outDir, err = filepath.Abs(outDir); err != nil {
		return err
	}
	replace := map[string]string{}
	args := []string{"build"}
	var pkgs []string
	for pkg, source := range tools {
		replace[filepath.Join(tree, pkg, "main.go")] = source
		pkgs = append(pkgs, "./"+pkg)
	}
	spec, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	overlayFile := filepath.Join(outDir, "overlay.json")
	if err := os.WriteFile(overlayFile, spec, 0o644); err != nil {
		return err
	}
	args = append(args, "-overlay", overlayFile, "-o", outDir+string(filepath.Separator))
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = tree
	// A tree whose go.work names modules the proxy refuses has a workspace
	// beside it (hack/common.sh kubevirt_gowork).
	work := tree + ".gowork/go.work"
	if fi, err := os.Stat(work); err == nil && fi.Mode().IsRegular() {
		cmd.Env = append(os.Environ(), "GOWORK="+work)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %v inside %s: %w: %s", pkgs, tree, err, out)
	}
	return nil
}
