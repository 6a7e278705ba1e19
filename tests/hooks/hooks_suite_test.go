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

// Package hooks_test is the functional suite of the overlay hook sidecar:
// KubeVirt v1.7.0's own hook manager (through tests/hooks/hookclient)
// discovers the sidecar on a real socket directory and calls it, and the
// domain it returns boots under a private libvirtd with the test guest.
package hooks_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestHooks(t *testing.T) {
	framework.RunSuite(t, "overlay hook functional Suite")
}

// binaries built once for the suite.
var bins struct {
	hook, client, shim string
}

var _ = BeforeSuite(func(ctx SpecContext) {
	dir, err := os.MkdirTemp("", "overlay-hook-bins-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	bins.hook = filepath.Join(dir, "overlay-hook")
	bins.client = filepath.Join(dir, "hookclient")
	bins.shim = filepath.Join(dir, "sidecar-shim")
	build(ctx, bins.hook, "./hooks/overlay", "CGO_ENABLED=0")
	build(ctx, bins.client, "./tests/hooks/hookclient")
	build(ctx, bins.shim, "kubevirt.io/kubevirt/cmd/sidecars")

	out, err := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "true").CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, out)
	}
	framework.Require(err, "a private mount namespace (unshare --mount, as root)")
}, NodeTimeout(15*time.Minute))

func build(ctx context.Context, out, pkg string, env ...string) {
	GinkgoHelper()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), env...)
	output, err := cmd.CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), string(output))
}

// pod lays out, in a temporary directory, what a virt-launcher pod gives
// the sidecar: the directory over /run whose kubevirt-hooks holds one
// socket directory per sidecar, and the claim shared by the sidecar and
// the compute container. Sidecar and "compute" (QEMU) see every path at
// the same place here.
type pod struct {
	dir       string
	runDir    string
	socketDir string
	store     string
	golden    string
}

func newPod() *pod {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	p := &pod{
		dir:    dir,
		runDir: filepath.Join(dir, "run"),
		store:  filepath.Join(dir, "store"),
	}
	p.socketDir = filepath.Join(p.runDir, "kubevirt-hooks", "hook-sidecar-0")
	p.golden = filepath.Join(p.store, "disk.img")
	Expect(os.MkdirAll(p.socketDir, 0o755)).To(Succeed())
	Expect(os.MkdirAll(p.store, 0o755)).To(Succeed())
	return p
}

// startSidecar runs the overlay hook as a gRPC sidecar of the pod; it is
// stopped when the spec ends. The channel closes when it exits.
func (p *pod) startSidecar(ctx context.Context, args ...string) <-chan struct{} {
	GinkgoHelper()
	cmd := exec.Command(bins.hook, append([]string{
		"--socket-dir", p.socketDir, "--compute-socket-dir", p.socketDir, "--container-name", "hook-sidecar-0",
	}, args...)...)
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	DeferCleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		Eventually(exited).WithTimeout(10 * time.Second).Should(BeClosed())
	})
	Eventually(func() string { return filepath.Join(p.socketDir, "overlay.sock") }).WithContext(ctx).Should(BeAnExistingFile())
	return exited
}

// client runs hookclient, KubeVirt's hook manager, for the pod.
func (p *pod) client(ctx context.Context, mode string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "private",
		bins.client, mode, "--run-dir", p.runDir}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("hookclient %s: %w: %s", mode, err, stderr.String())
	}
	return stdout.String(), nil
}

// define has the hook manager call OnDefineDomain and returns the domain
// the sidecars made.
func (p *pod) define(ctx context.Context, vmiJSON, domainXML []byte) ([]byte, error) {
	in := filepath.Join(p.dir, "in.xml")
	vmi := filepath.Join(p.dir, "vmi.json")
	out := filepath.Join(p.dir, "out.xml")
	Expect(os.WriteFile(in, domainXML, 0o644)).To(Succeed())
	Expect(os.WriteFile(vmi, vmiJSON, 0o644)).To(Succeed())
	_ = os.Remove(out)
	if _, err := p.client(ctx, "define", "--vmi", vmi, "--domain", in, "--out", out); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}
