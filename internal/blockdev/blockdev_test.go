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

package blockdev_test

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

func TestBlockdev(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "blockdev Suite")
}

var _ = Describe("Is", func() {
	It("refuses what is not a block device", func() {
		dir := GinkgoT().TempDir()
		file := filepath.Join(dir, "image")
		Expect(os.WriteFile(file, nil, 0o600)).To(Succeed())
		Expect(blockdev.Is(file)).To(BeFalse(), "a regular file")
		Expect(blockdev.Is(dir)).To(BeFalse(), "a directory")
		Expect(blockdev.Is(filepath.Join(dir, "missing"))).To(BeFalse(), "a missing path")
		Expect(blockdev.Is("/dev/null")).To(BeFalse(), "a character device")
	})

	It("accepts a block device and a link to one", func() {
		devs, _ := filepath.Glob("/dev/loop[0-9]*")
		if len(devs) == 0 {
			Skip("no loop device node on this machine")
		}
		link := filepath.Join(GinkgoT().TempDir(), "disk")
		Expect(os.Symlink(devs[0], link)).To(Succeed())
		Expect(blockdev.Is(devs[0])).To(BeTrue())
		Expect(blockdev.Is(link)).To(BeTrue())
	})
})
