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

// Package overlay_test is the functional suite of overlay volumes on the
// virt-launcher side: the patched KubeVirt tree's converter turns a VMI with
// an overlay volume into a domain, its overlay creator makes or validates the
// overlay, and the domain boots under a private libvirtd with the test guest.
package overlay_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestOverlay(t *testing.T) {
	framework.RunSuite(t, "overlay volumes functional Suite")
}

// vmi2domain is the tool built inside the patched tree for the suite.
var vmi2domain testenv.VMI2Domain

var _ = BeforeSuite(func(ctx SpecContext) {
	_, err := os.Stat(filepath.Join(testenv.KubeVirtTree(), "pkg", "storage", "overlay", "overlay.go"))
	framework.Require(err, "the patched KubeVirt tree (hack/kubevirt.sh apply)")

	dir, err := os.MkdirTemp("", "overlay-vmi2domain-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	vmi2domain, err = testenv.BuildVMI2Domain(ctx, dir)
	Expect(err).ToNot(HaveOccurred())
}, NodeTimeout(15*time.Minute))
