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

package csiloop_test

import (
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

var _ = Describe("internal/blockdev loop devices", func() {
	var dir, file string
	BeforeEach(func() {
		dir = GinkgoT().TempDir()
		file = filepath.Join(dir, "disk.img")
		Expect(os.WriteFile(file, nil, 0o600)).To(Succeed())
		Expect(os.Truncate(file, mib)).To(Succeed())
		DeferCleanup(func() { Eventually(func() []string { return boundUnder(dir) }).Should(BeEmpty()) })
	})

	It("attaches, finds by inode, grows online and detaches, through ioctls alone", func() {
		dev, err := blockdev.AttachLoop(file, false)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(blockdev.DetachLoop, dev)
		Expect(blockdev.LoopBackingFile(dev)).To(Equal(file))
		Expect(blockdev.LoopBacks(dev, file)).To(BeTrue())
		link := filepath.Join(dir, "link.img")
		Expect(os.Symlink(file, link)).To(Succeed())
		Expect(blockdev.FindLoops(link)).To(Equal([]string{dev}), "whatever path names the file")
		other := filepath.Join(dir, "other.img")
		Expect(os.WriteFile(other, nil, 0o600)).To(Succeed())
		Expect(blockdev.LoopBacks(dev, other)).To(BeFalse())
		Expect(blockdev.FindLoops(other)).To(BeEmpty())
		Expect(sizeOf(dev)).To(Equal(mib))

		Expect(os.Truncate(file, 3*mib)).To(Succeed())
		Expect(sizeOf(dev)).To(Equal(mib), "the device keeps its size until told")
		Expect(blockdev.RefreshLoopCapacity(dev)).To(Equal(3 * mib))
		Expect(sizeOf(dev)).To(Equal(3 * mib))

		Expect(blockdev.DetachLoop(dev)).To(Succeed())
		Expect(blockdev.FindLoops(file)).To(BeEmpty())
		Expect(blockdev.LoopBacks(dev, file)).To(BeFalse())
		Expect(blockdev.DetachLoop(dev)).To(Succeed(), "an unbound device")
	})

	It("attaches read-only devices that refuse writes", func() {
		dev, err := blockdev.AttachLoop(file, true)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(blockdev.DetachLoop, dev)
		Expect(os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "ro"))).To(Equal([]byte("1\n")))
		// Opening succeeds, as for any read-only block device; writing
		// does not.
		f, err := os.OpenFile(dev, os.O_WRONLY, 0)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(f.Close)
		_, err = f.Write(make([]byte, 4096))
		Expect(err).To(MatchError(unix.EPERM))
	})

	It("lets a device detached while open back nothing, and go when closed", func() {
		dev, err := blockdev.AttachLoop(file, false)
		Expect(err).ToNot(HaveOccurred())
		f, err := os.Open(dev)
		Expect(err).ToNot(HaveOccurred())
		Expect(blockdev.DetachLoop(dev)).To(Succeed())
		Expect(blockdev.LoopBacks(dev, file)).To(BeFalse())
		Expect(blockdev.FindLoops(file)).To(BeEmpty())
		Expect(f.Close()).To(Succeed())
		Eventually(func() []string { return boundUnder(dir) }).Should(BeEmpty())
	})
})
