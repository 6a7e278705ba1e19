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

package qcow2_test

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

const mib = 1 << 20

// These tests run the real qemu-img.
var _ = Describe("Tool", func() {
	var (
		ctx  context.Context
		tool qcow2.Tool
		dir  string
		base string
	)

	BeforeEach(func() {
		ctx = context.Background()
		dir = GinkgoT().TempDir()
		base = filepath.Join(dir, "base.raw")
		Expect(os.WriteFile(base, nil, 0o644)).To(Succeed())
		Expect(os.Truncate(base, 64*mib)).To(Succeed())
	})

	Describe("CreateOverlay", func() {
		It("makes a qcow2 image over the backing with its size", func() {
			overlay := filepath.Join(dir, "disk.qcow2")
			Expect(tool.CreateOverlay(ctx, overlay, base, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())

			info, err := tool.Info(ctx, overlay, qcow2.InfoOptions{})
			Expect(err).ToNot(HaveOccurred())
			Expect(info.Format).To(Equal(qcow2.FormatQcow2))
			Expect(info.VirtualSize).To(Equal(int64(64 * mib)))
			Expect(info.BackingFilename).To(Equal(base))
			Expect(info.BackingFormat).To(Equal(qcow2.FormatRaw))
		})

		It("applies creation options", func() {
			overlay := filepath.Join(dir, "disk.qcow2")
			opts := qcow2.CreateOptions{ClusterSize: 128 * 1024, ExtendedL2: true, LazyRefcounts: true, Size: 128 * mib}
			Expect(tool.CreateOverlay(ctx, overlay, base, qcow2.FormatRaw, opts)).To(Succeed())

			info, err := tool.Info(ctx, overlay, qcow2.InfoOptions{Format: qcow2.FormatQcow2})
			Expect(err).ToNot(HaveOccurred())
			Expect(info.ClusterSize).To(Equal(int64(128 * 1024)))
			Expect(info.FormatSpecific.Data.ExtendedL2).To(BeTrue())
			Expect(info.FormatSpecific.Data.LazyRefcounts).To(BeTrue())
			Expect(info.VirtualSize).To(Equal(int64(128 * mib)))
		})

		It("leaves nothing behind when qemu-img fails", func() {
			overlay := filepath.Join(dir, "disk.qcow2")
			err := tool.CreateOverlay(ctx, overlay, filepath.Join(dir, "missing.raw"), qcow2.FormatRaw, qcow2.CreateOptions{})
			Expect(err).To(MatchError(ContainSubstring("create overlay " + overlay)))
			entries, err := os.ReadDir(dir)
			Expect(err).ToNot(HaveOccurred())
			Expect(entries).To(HaveLen(1), "only the backing remains")
		})

		DescribeTable("refuses bad arguments before running qemu-img",
			func(backing, format, message string) {
				calls := 0
				counting := qcow2.Tool{Exec: func(context.Context, ...string) ([]byte, error) { calls++; return nil, nil }}
				err := counting.CreateOverlay(ctx, filepath.Join(dir, "disk.qcow2"), backing, format, qcow2.CreateOptions{})
				Expect(err).To(MatchError(ContainSubstring(message)))
				Expect(calls).To(BeZero())
			},
			Entry("relative backing", "base.raw", qcow2.FormatRaw, `backing path "base.raw" is not absolute`),
			Entry("unknown format", "/images/base", "vmdk", `unsupported backing format "vmdk"`),
		)
	})

	It("inspects and checks a layer without opening its backing", func() {
		overlay := filepath.Join(dir, "disk.qcow2")
		Expect(tool.CreateOverlay(ctx, overlay, base, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())
		Expect(os.Remove(base)).To(Succeed())

		_, err := tool.Check(ctx, overlay, qcow2.InfoOptions{})
		Expect(err).To(MatchError(ContainSubstring("Could not open backing file")))
		res, err := tool.Check(ctx, overlay, qcow2.InfoOptions{NoBacking: true})
		Expect(err).ToNot(HaveOccurred())
		Expect(res.Clean()).To(BeTrue())
		info, err := tool.Info(ctx, overlay, qcow2.InfoOptions{NoBacking: true})
		Expect(err).ToNot(HaveOccurred())
		Expect(info.BackingFilename).To(Equal(base))
	})

	Describe("Check", func() {
		It("reports a fresh overlay clean", func() {
			overlay := filepath.Join(dir, "disk.qcow2")
			Expect(tool.CreateOverlay(ctx, overlay, base, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())
			res, err := tool.Check(ctx, overlay, qcow2.InfoOptions{})
			Expect(err).ToNot(HaveOccurred())
			Expect(res.Clean()).To(BeTrue())
		})

		It("reports leaked clusters as not clean", func() {
			overlay := filepath.Join(dir, "disk.qcow2")
			Expect(tool.CreateOverlay(ctx, overlay, base, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())
			leakOneCluster(overlay)
			res, err := tool.Check(ctx, overlay, qcow2.InfoOptions{})
			Expect(err).ToNot(HaveOccurred())
			Expect(res.Leaks).To(BeNumerically(">", 0))
			Expect(res.Clean()).To(BeFalse())
		})

		It("fails on a file that is not an image of the format", func() {
			_, err := tool.Check(ctx, base, qcow2.InfoOptions{Format: qcow2.FormatQcow2})
			Expect(err).To(MatchError(ContainSubstring("check " + base)))
		})
	})

	It("measures the fully allocated size with metadata", func() {
		size, err := tool.Measure(ctx, 1024*mib, qcow2.CreateOptions{})
		Expect(err).ToNot(HaveOccurred())
		Expect(size).To(BeNumerically(">", 1024*mib))
		Expect(size).To(BeNumerically("<", 1040*mib))
	})

	It("rebuilds a chain with Rebase, then Convert and Compare", func() {
		Expect(os.WriteFile(base, []byte("golden"), 0o644)).To(Succeed())
		Expect(os.Truncate(base, 64*mib)).To(Succeed())
		// The layer was written against a backing that has since moved.
		layer := filepath.Join(dir, "layer.qcow2")
		moved := filepath.Join(dir, "moved.raw")
		Expect(tool.CreateOverlay(ctx, layer, base, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())
		Expect(os.Rename(base, moved)).To(Succeed())
		Expect(tool.Rebase(ctx, layer, moved, qcow2.FormatRaw)).To(Succeed())
		base = moved

		flat := filepath.Join(dir, "flat.raw")
		Expect(tool.Convert(ctx, layer, qcow2.FormatQcow2, flat, qcow2.FormatRaw)).To(Succeed())
		same, err := tool.Compare(ctx, flat, qcow2.FormatRaw, base, qcow2.FormatRaw)
		Expect(err).ToNot(HaveOccurred())
		Expect(same).To(BeTrue())

		Expect(os.WriteFile(flat, []byte("changed"), 0o644)).To(Succeed())
		Expect(os.Truncate(flat, 64*mib)).To(Succeed())
		same, err = tool.Compare(ctx, flat, qcow2.FormatRaw, base, qcow2.FormatRaw)
		Expect(err).ToNot(HaveOccurred())
		Expect(same).To(BeFalse())
	})
})

// leakOneCluster writes one cluster of data into a qcow2 image and then
// clears the L2 entry that maps it: the cluster keeps its refcount but no
// table references it, which is what `qemu-img check` calls a leak.
func leakOneCluster(image string) {
	GinkgoHelper()
	out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", image).CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), string(out))

	f, err := os.OpenFile(image, os.O_RDWR, 0)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	readUint64 := func(off int64) uint64 {
		buf := make([]byte, 8)
		_, err := f.ReadAt(buf, off)
		Expect(err).ToNot(HaveOccurred())
		return binary.BigEndian.Uint64(buf)
	}
	const l1TableOffsetField = 40
	const offsetMask = 0x00fffffffffffe00
	l2Table := readUint64(int64(readUint64(l1TableOffsetField))) & offsetMask
	Expect(l2Table).ToNot(BeZero())
	_, err = f.WriteAt(make([]byte, 8), int64(l2Table))
	Expect(err).ToNot(HaveOccurred())
}
