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

package containerdisk_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestContainerDisk(t *testing.T) {
	framework.RunSuite(t, "container-disk Suite")
}

// binary is the container-disk program under test, as `make` builds it.
var binary string

var _ = BeforeSuite(func() {
	binary = testenv.Binary("container-disk")

	// make is cheap when the binary is up to date and keeps the suite from
	// testing a stale build after the C sources changed.
	if err := buildTools(); err != nil {
		if _, statErr := os.Stat(binary); statErr == nil {
			GinkgoWriter.Printf("cannot rebuild (%v); testing the existing %s\n", err, binary)
			return
		}
		framework.Require(err, "the container-disk build")
	}
	build := exec.Command("make", "-C", testenv.RepoRoot(), "_out/bin/container-disk")
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "make _out/bin/container-disk:\n%s", out)
	Expect(binary).To(BeAnExistingFile())
})

// buildTools reports whether make and a C compiler are there to run.
func buildTools() error {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	for _, tool := range []string{"make", cc} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s: %w", tool, err)
		}
	}
	return nil
}
