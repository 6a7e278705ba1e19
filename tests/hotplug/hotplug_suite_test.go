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

// Package hotplug_test is the functional suite of containerDisk hotplug on
// one node: the real container-disk program in attachment pod containers on
// an image root filesystem, the patched virt-handler mounter and
// virt-launcher converter (cdhotplug, built inside the patched tree), and a
// running domain of a private libvirtd the disks are attached to.
package hotplug_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/hotplug"
)

func TestHotplug(t *testing.T) {
	framework.RunSuite(t, "containerDisk hotplug functional Suite")
}

var tools hotplug.Tools

var _ = BeforeSuite(func(ctx SpecContext) {
	if os.Geteuid() != 0 {
		framework.Require(os.ErrPermission, "root (mounts, namespaces, libvirtd)")
	}
	// make keeps the program current when its C sources changed.
	out, err := exec.CommandContext(ctx, "make", "-C", testenv.RepoRoot(), "_out/bin/container-disk").CombinedOutput()
	framework.Require(err, "the container-disk build (make): "+string(out))

	dir, err := os.MkdirTemp("", "hotplug-tools-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	framework.Require(hotplug.TreeHasHotplug(), "the KubeVirt tree with the containerDisk hotplug patches")
	tools, err = hotplug.BuildTools(ctx, dir)
	Expect(err).ToNot(HaveOccurred())
}, NodeTimeout(20*time.Minute))
