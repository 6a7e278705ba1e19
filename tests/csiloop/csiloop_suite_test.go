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

// Package csiloop_test is the functional suite of the csi-loop CSI driver
// and of the loop devices under it (internal/blockdev): csi-sanity and a
// volume's whole life on real loop devices and bind mounts, restarts of
// the driver, and devices it must leave alone. Needs root.
package csiloop_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestCSILoop(t *testing.T) {
	framework.RunSuite(t, "csi-loop functional Suite")
}

const mib = int64(1) << 20

var _ = BeforeSuite(func() {
	framework.Require(tryLoopDevice(), "a loop device (root, /dev/loop-control)")
})

// tryLoopDevice attaches and detaches a loop device.
func tryLoopDevice() error {
	file := filepath.Join(GinkgoT().TempDir(), "probe.img")
	if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
		return err
	}
	dev, err := blockdev.AttachLoop(file, false)
	if err != nil {
		return err
	}
	return blockdev.DetachLoop(dev)
}

// boundUnder lists the loop devices bound to files under dir, from sysfs
// as `losetup -a` reads it: what a spec must not leave behind.
func boundUnder(dir string) []string {
	attrs, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	Expect(err).ToNot(HaveOccurred())
	var devs []string
	for _, attr := range attrs {
		data, err := os.ReadFile(attr)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.HasPrefix(strings.TrimSpace(string(data)), dir+"/") {
			devs = append(devs, filepath.Base(filepath.Dir(filepath.Dir(attr))))
		}
	}
	return devs
}

func sizeOf(path string) int64 {
	size, err := blockdev.Size(path)
	Expect(err).ToNot(HaveOccurred())
	return size
}
