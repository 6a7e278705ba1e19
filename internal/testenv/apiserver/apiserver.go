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

// Package apiserver starts a real kube-apiserver and etcd through
// controller-runtime's envtest, apart from package testenv so that the demo
// does not pull in envtest.
package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// Server is a real kube-apiserver backed by a real etcd, started for one
// suite through controller-runtime's envtest.
type Server struct {
	Env    *envtest.Environment
	Config *rest.Config
}

// Start starts kube-apiserver and etcd with the CRDs found in
// crdPaths (files or directories of YAML) installed. Stop it with Stop,
// typically in DeferCleanup. ctx bounds the build of the binaries on
// first use; envtest's start itself takes no context.
func Start(ctx context.Context, crdPaths ...string) (*Server, error) {
	assets, err := envtestAssets(ctx)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdPaths,
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	return &Server{Env: env, Config: cfg}, nil
}

// Stop stops the API server and etcd.
func (s *Server) Stop() error {
	if err := s.Env.Stop(); err != nil {
		return fmt.Errorf("stop kube-apiserver and etcd: %w", err)
	}
	return nil
}

// envtestAssets is the directory holding kube-apiserver and etcd:
// KUBEBUILDER_ASSETS when set (make sets it), else what
// hack/envtest-assets.sh provides, building it on first use.
func envtestAssets(ctx context.Context) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "hack", "envtest-assets.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/envtest-assets.sh: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
