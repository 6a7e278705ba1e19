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

package qcow2meta_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

const gib = 1 << 30

// Offsets of header fields (docs/interop/qcow2.txt).
const (
	offBackingFileOffset   = 8
	offBackingFileSize     = 16
	offSize                = 24
	offL1Size              = 36
	offL1TableOffset       = 40
	offRefcountTableOffset = 48
	offRefcountTableSize   = 56
	offNbSnapshots         = 60
	offIncompatible        = 72
	offHeaderLength        = 100
	// The first header extension of an image this package writes: the
	// backing format.
	offFirstExtensionLength = 112 + 4
)

// What an image costs to read is bounded by its header and by QEMU's own
// limits, never by the length of the file or by sizes an image states.
var _ = Describe("limits", func() {
	var (
		ctx     context.Context
		dir     string
		backing string
		path    string
	)

	BeforeEach(func() {
		ctx = context.Background()
		dir = GinkgoT().TempDir()
		backing = filepath.Join(dir, "golden.raw")
		Expect(os.WriteFile(backing, nil, 0o644)).To(Succeed())
		path = filepath.Join(dir, "overlay.qcow2")
	})

	// A block device, or a sparse file, is often much longer than the
	// clusters its image uses: Check must cost what the image uses.
	It("checks a long sparse file with small clusters in memory that follows the clusters in use", func() {
		Expect(qcow2meta.CreateOverlay(path, backing, "raw", 1*gib, qcow2meta.Options{ClusterSize: 512})).To(Succeed())
		run("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", "-c", "write -P 0xa5 512M 4k", path)
		Expect(os.Truncate(path, 4*gib)).To(Succeed())
		qemuImgCheckClean(path)

		var res *qcow2meta.CheckResult
		allocated := bytesAllocated(func() {
			var err error
			res, err = qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
		})
		Expect(res.Clean()).To(BeTrue(), res.String())
		// 8 Mi clusters of 512 bytes in the file; a few hundred in use.
		Expect(allocated).To(BeNumerically("<", 1<<20), "bytes allocated by Check")
	})

	It("walks an L2 table that many L1 entries share only once", func() {
		const cs = 64 << 10
		const l1Entries = 64
		Expect(qcow2meta.CreateOverlay(path, backing, "raw", l1Entries*(cs/8)*cs, qcow2meta.Options{})).To(Succeed())
		h, err := qcow2meta.ReadHeader(path)
		Expect(err).ToNot(HaveOccurred())
		Expect(h.L1Size).To(Equal(uint32(l1Entries)))
		fi, err := os.Stat(path)
		Expect(err).ToNot(HaveOccurred())

		// One full L2 table after the image, mapping the clusters after it;
		// every L1 entry names it.
		const copied = uint64(1) << 63
		l2Cluster := uint64(fi.Size()+cs-1) / cs
		l2 := make([]byte, cs)
		for j := range uint64(cs / 8) {
			binary.BigEndian.PutUint64(l2[8*j:], (l2Cluster+1+j)*cs|copied)
		}
		writeAt(path, int64(l2Cluster*cs), l2)
		Expect(os.Truncate(path, int64((l2Cluster+1+cs/8)*cs))).To(Succeed())
		l1 := make([]byte, 8*l1Entries)
		for i := range l1Entries {
			binary.BigEndian.PutUint64(l1[8*i:], l2Cluster*cs|copied)
		}
		writeAt(path, int64(h.L1TableOffset), l1)

		var res *qcow2meta.CheckResult
		allocated := bytesAllocated(func() {
			res, err = qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
		})
		Expect(allocated).To(BeNumerically("<", 1<<20), "bytes allocated by Check")
		Expect(res.Clean()).To(BeFalse())
		Expect(res.String()).To(ContainSubstring("L2 table of L1 entry 1 at %#x is already in use", l2Cluster*cs))
		Expect(qemuImgCheck(path)).To(Equal(2), "qemu-img check exits 2 on corruptions")
	})

	DescribeTable("hostile headers are refused before anything is read from their sizes",
		func(opts qcow2meta.Options, patch func(path string), message string) {
			Expect(qcow2meta.CreateOverlay(path, backing, "raw", 100*mib, opts)).To(Succeed())
			patch(path)

			_, err := qcow2meta.ReadHeader(path)
			Expect(err).To(MatchError(ContainSubstring(message)))
			_, err = qcow2meta.Check(ctx, path)
			Expect(err).To(MatchError(ContainSubstring(message)))
			Expect(qemuImgInfoFails(path)).To(BeTrue(), "qemu-img info refuses it too")
		},
		Entry("an L1 table larger than QEMU's 32 MiB",
			qcow2meta.Options{}, setUint32(offL1Size, 1<<22+1),
			"L1 size 4194305 exceeds QEMU's limit of 4194304 entries"),
		Entry("the largest L1 table",
			qcow2meta.Options{}, setUint32(offL1Size, math.MaxUint32),
			"L1 size 4294967295 exceeds QEMU's limit of 4194304 entries"),
		Entry("an L1 table too small for the virtual size",
			qcow2meta.Options{}, setUint64(offSize, 1<<40),
			"L1 size 1 is too small for a virtual size of 1099511627776 bytes"),
		Entry("the largest virtual size",
			qcow2meta.Options{}, setUint64(offSize, math.MaxUint64),
			"L1 size 1 is too small for a virtual size of 18446744073709551615 bytes"),
		Entry("an unaligned L1 table",
			qcow2meta.Options{}, addUint64(offL1TableOffset, 8),
			"L1 table offset 0x30008 is not cluster aligned"),
		Entry("a refcount table larger than QEMU's 8 MiB",
			qcow2meta.Options{}, setUint32(offRefcountTableSize, 129),
			"refcount table of 129 clusters exceeds QEMU's limit of 128"),
		Entry("the largest refcount table",
			qcow2meta.Options{}, setUint32(offRefcountTableSize, math.MaxUint32),
			"refcount table of 4294967295 clusters exceeds QEMU's limit of 128"),
		Entry("no refcount table",
			qcow2meta.Options{}, setUint32(offRefcountTableSize, 0),
			"image has no refcount table"),
		Entry("an unaligned refcount table",
			qcow2meta.Options{}, addUint64(offRefcountTableOffset, 512),
			"refcount table offset 0x10200 is not cluster aligned"),
		Entry("too many snapshots",
			qcow2meta.Options{}, setUint32(offNbSnapshots, 65537),
			"65537 snapshots exceed QEMU's limit of 65536"),
		Entry("a header extension longer than the first cluster",
			qcow2meta.Options{}, setUint32(offFirstExtensionLength, math.MaxUint32),
			"header extension 0xe2792aca of 4294967295 bytes runs past"),
		Entry("a backing format longer than QEMU's 15 bytes",
			qcow2meta.Options{}, setUint32(offFirstExtensionLength, 16),
			"backing format of 16 bytes exceeds QEMU's limit of 15"),
		Entry("a backing file name longer than QEMU's 1023 bytes",
			qcow2meta.Options{}, setUint32(offBackingFileSize, 1024),
			"backing file name of 1024 bytes exceeds QEMU's limit of 1023"),
		Entry("the longest backing file name",
			qcow2meta.Options{}, setUint32(offBackingFileSize, math.MaxUint32),
			"backing file name of 4294967295 bytes"),
		Entry("a backing file name beyond the first cluster",
			qcow2meta.Options{}, setUint64(offBackingFileOffset, math.MaxUint64),
			"backing file name offset 0xffffffffffffffff is beyond the first cluster"),
		Entry("a version 3 header shorter than version 3's",
			qcow2meta.Options{}, setUint32(offHeaderLength, 72),
			"header length 72 is shorter than version 3's 104"),
		Entry("a header longer than the first cluster",
			qcow2meta.Options{ClusterSize: 4096}, setUint32(offHeaderLength, 4096+8),
			"header length 4104 exceeds the cluster size 4096"),
		Entry("extended L2 entries in small clusters",
			qcow2meta.Options{ClusterSize: 4096}, setUint64(offIncompatible, qcow2meta.IncompatExtendedL2),
			"extended L2 entries need clusters of at least 16 KiB, not 4096 bytes"),
	)

	DescribeTable("hostile bitmaps extensions are refused",
		func(field int64, value uint64, message string) {
			run("qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", "raw", path, "100M")
			run("qemu-img", "bitmap", "--add", path, "checkpoint-1")
			ext := extensionOffset(path, 0x23852875)
			if field == 0 {
				setUint32(ext+8, uint32(value))(path)
			} else {
				setUint64(ext+8+field, value)(path)
			}

			_, err := qcow2meta.ReadHeader(path)
			Expect(err).To(MatchError(ContainSubstring(message)))
			_, err = qcow2meta.Check(ctx, path)
			Expect(err).To(MatchError(ContainSubstring(message)))
			Expect(qemuImgInfoFails(path)).To(BeTrue(), "qemu-img info refuses it too")
		},
		Entry("more bitmaps than QEMU's 65535", int64(0), uint64(65536), "65536 bitmaps exceed QEMU's limit of 65535"),
		Entry("no bitmaps", int64(0), uint64(0), "bitmaps extension with no bitmaps"),
		Entry("a bitmap directory larger than QEMU's", int64(8), uint64(1024*65535+1), "bitmap directory of 67107841 bytes exceeds QEMU's limit of 67107840"),
		Entry("the largest bitmap directory", int64(8), uint64(math.MaxUint64), "bitmap directory of 18446744073709551615 bytes exceeds"),
		Entry("an unaligned bitmap directory", int64(16), uint64(512), "bitmap directory offset 0x200 is not cluster aligned"),
	)
})

// bytesAllocated is how many bytes of heap f allocates.
func bytesAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func qemuImgInfoFails(path string) bool {
	GinkgoHelper()
	err := exec.Command("qemu-img", "info", "-f", "qcow2", path).Run()
	if _, ok := errors.AsType[*exec.ExitError](err); ok {
		return true
	}
	Expect(err).ToNot(HaveOccurred())
	return false
}

func setUint32(offset int64, v uint32) func(path string) {
	return func(path string) {
		GinkgoHelper()
		buf := make([]byte, 4)
		binary.BigEndian.PutUint32(buf, v)
		writeAt(path, offset, buf)
	}
}

func setUint64(offset int64, v uint64) func(path string) {
	return func(path string) {
		GinkgoHelper()
		writeUint64(path, offset, v)
	}
}

func addUint64(offset int64, delta uint64) func(path string) {
	return func(path string) {
		GinkgoHelper()
		writeUint64(path, offset, readUint64(path, offset)+delta)
	}
}

func readUint64(path string, offset int64) uint64 {
	GinkgoHelper()
	f, err := os.Open(path)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	buf := make([]byte, 8)
	_, err = f.ReadAt(buf, offset)
	Expect(err).ToNot(HaveOccurred())
	return binary.BigEndian.Uint64(buf)
}

// extensionOffset finds the header extension typ of a version 3 image.
func extensionOffset(path string, typ uint32) int64 {
	GinkgoHelper()
	f, err := os.Open(path)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	buf := make([]byte, 8)
	_, err = f.ReadAt(buf, offHeaderLength)
	Expect(err).ToNot(HaveOccurred())
	off := int64(binary.BigEndian.Uint32(buf))
	for {
		_, err := f.ReadAt(buf, off)
		Expect(err).ToNot(HaveOccurred())
		t, length := binary.BigEndian.Uint32(buf), int64(binary.BigEndian.Uint32(buf[4:]))
		Expect(t).ToNot(BeZero(), "no header extension %#x", typ)
		if t == typ {
			return off
		}
		off += 8 + (length+7)&^7
	}
}
