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

// Package demo_test runs `make demo`'s program end to end, as a user would,
// and checks what it leaves: its output files agree with the images, and
// nothing else remains.
package demo_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestDemo(t *testing.T) {
	framework.RunSuite(t, "local demo Suite")
}

// demo is the demo program, built for the suite.
var demo string

var _ = BeforeSuite(func(ctx SpecContext) {
	_, err := os.Stat(filepath.Join(testenv.KubeVirtTree(), "pkg", "storage", "overlay", "overlay.go"))
	framework.Require(err, "the patched KubeVirt tree (make)")

	demo = filepath.Join(GinkgoT().TempDir(), "demo")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", demo, "./hack/demo")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), string(out))
}, NodeTimeout(10*time.Minute))
