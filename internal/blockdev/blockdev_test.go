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
	"bytes"
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

var _ = Describe("Zero", func() {
	// filled is a file of 1 MiB of 0xff.
	filled := func() string {
		file := filepath.Join(GinkgoT().TempDir(), "disk")
		Expect(os.WriteFile(file, bytes.Repeat([]byte{0xff}, 1<<20), 0o600)).To(Succeed())
		return file
	}
	// zeroed expects exactly [from, to) of file to read as zeroes.
	zeroed := func(file string, from, to int) {
		data, err := os.ReadFile(file)
		Expect(err).NotTo(HaveOccurred())
		Expect(data[:from]).To(Equal(bytes.Repeat([]byte{0xff}, from)))
		Expect(data[from:to]).To(Equal(make([]byte, to-from)))
		Expect(data[to:]).To(Equal(bytes.Repeat([]byte{0xff}, len(data)-to)))
	}

	It("zeroes a range of a block device", func() {
		if _, err := os.Stat("/dev/loop-control"); err != nil || os.Geteuid() != 0 {
			Skip("needs root and loop devices")
		}
		file := filled()
		dev, err := blockdev.AttachLoop(file, false)
		Expect(err).NotTo(HaveOccurred())
		defer func() { Expect(blockdev.DetachLoop(dev)).To(Succeed()) }()
		f, err := os.OpenFile(dev, os.O_WRONLY, 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(blockdev.Zero(f, 4096, 70<<10)).To(Succeed())
		Expect(f.Sync()).To(Succeed())
		Expect(f.Close()).To(Succeed())
		zeroed(file, 4096, 4096+70<<10)
	})

	It("writes zeroes where the ioctl is refused", func() {
		file := filled()
		f, err := os.OpenFile(file, os.O_WRONLY, 0)
		Expect(err).NotTo(HaveOccurred())
		defer f.Close()
		Expect(blockdev.Zero(f, 512, 3<<20/4)).To(Succeed())
		zeroed(file, 512, 512+3<<20/4)
	})
})
