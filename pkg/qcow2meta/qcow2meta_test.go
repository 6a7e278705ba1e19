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
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

func TestQcow2meta(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "qcow2meta Suite")
}

const mib = 1 << 20

// The reference for every expectation here is QEMU itself: images written
// by this package must satisfy qemu-img, and images written by QEMU must
// read the same through this package.
var _ = Describe("qcow2meta", func() {
	var (
		ctx     context.Context
		dir     string
		backing string
	)

	BeforeEach(func() {
		ctx = context.Background()
		dir = GinkgoT().TempDir()
		backing = filepath.Join(dir, "golden.raw")
		Expect(os.WriteFile(backing, nil, 0o644)).To(Succeed())
		Expect(os.Truncate(backing, 100*mib)).To(Succeed())
	})

	DescribeTable("CreateOverlay writes an image qemu-img accepts as it was asked for",
		func(size int64, opts qcow2meta.Options, wantCluster int64) {
			path := filepath.Join(dir, "overlay.qcow2")
			Expect(qcow2meta.CreateOverlay(path, backing, "raw", size, opts)).To(Succeed())

			info := qemuImgInfo(path)
			Expect(info.Format).To(Equal("qcow2"))
			Expect(info.VirtualSize).To(Equal(size))
			Expect(info.ClusterSize).To(Equal(wantCluster))
			Expect(info.BackingFilename).To(Equal(backing))
			Expect(info.BackingFormat).To(Equal("raw"))
			Expect(info.FormatSpecific.Data.ExtendedL2).To(Equal(opts.ExtendedL2))
			Expect(info.FormatSpecific.Data.LazyRefcounts).To(Equal(opts.LazyRefcounts))
			qemuImgCheckClean(path)

			res, err := qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
			Expect(res.Clean()).To(BeTrue(), res.String())

			h, err := qcow2meta.ReadHeader(path)
			Expect(err).ToNot(HaveOccurred())
			Expect(h.BackingFile).To(Equal(backing))
			Expect(h.BackingFormat).To(Equal("raw"))
			Expect(h.Size).To(Equal(uint64(size)))
		},
		Entry("defaults", int64(100*mib), qcow2meta.Options{}, int64(64<<10)),
		Entry("a size that is no multiple of the cluster", int64(100*mib+512), qcow2meta.Options{}, int64(64<<10)),
		Entry("128K clusters, extended L2, lazy refcounts", int64(100*mib), qcow2meta.Options{ClusterSize: 128 << 10, ExtendedL2: true, LazyRefcounts: true}, int64(128<<10)),
		Entry("small clusters and a multi-cluster L1 table", int64(4096*mib), qcow2meta.Options{ClusterSize: 512}, int64(512)),
		Entry("a 16 TiB disk", int64(16<<40), qcow2meta.Options{}, int64(64<<10)),
	)

	It("records a backing that this process cannot open", func() {
		path := filepath.Join(dir, "overlay.qcow2")
		elsewhere := "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"
		Expect(qcow2meta.CreateOverlay(path, elsewhere, "raw", 10*mib, qcow2meta.Options{})).To(Succeed())
		h, err := qcow2meta.ReadHeader(path)
		Expect(err).ToNot(HaveOccurred())
		Expect(h.BackingFile).To(Equal(elsewhere))
	})

	DescribeTable("CreateOverlay refuses bad arguments",
		func(backing, format string, size int64, opts qcow2meta.Options, message string) {
			path := filepath.Join(dir, "overlay.qcow2")
			Expect(qcow2meta.CreateOverlay(path, backing, format, size, opts)).To(MatchError(ContainSubstring(message)))
			Expect(path).ToNot(BeAnExistingFile())
		},
		Entry("relative backing", "golden.raw", "raw", int64(mib), qcow2meta.Options{}, `backing path "golden.raw" is not absolute`),
		Entry("no format", "/golden.raw", "", int64(mib), qcow2meta.Options{}, `invalid backing format ""`),
		Entry("zero size", "/golden.raw", "raw", int64(0), qcow2meta.Options{}, "size 0 is not positive"),
		Entry("odd cluster size", "/golden.raw", "raw", int64(mib), qcow2meta.Options{ClusterSize: 3000}, "cluster size 3000"),
		Entry("extended L2 with small clusters", "/golden.raw", "raw", int64(mib), qcow2meta.Options{ClusterSize: 4096, ExtendedL2: true}, "at least 16K"),
	)

	Describe("Check agrees with qemu-img check", func() {
		var path string

		BeforeEach(func() {
			path = filepath.Join(dir, "overlay.qcow2")
		})

		DescribeTable("on images QEMU has written to",
			func(createOpts string, ioCommands ...string) {
				args := []string{"create", "-q", "-f", "qcow2", "-b", backing, "-F", "raw"}
				if createOpts != "" {
					args = append(args, "-o", createOpts)
				}
				run("qemu-img", append(args, path)...)
				for _, c := range ioCommands {
					run("qemu-io", "-f", "qcow2", "-c", c, path)
				}
				qemuImgCheckClean(path)
				res, err := qcow2meta.Check(ctx, path)
				Expect(err).ToNot(HaveOccurred())
				Expect(res.Clean()).To(BeTrue(), res.String())
			},
			Entry("plain writes", "", "write -P 0xa5 0 1M", "write -P 0x5a 50M 64k", "write 99M 1M"),
			Entry("compressed writes", "", "write -c -P 0x11 0 64k", "write -c 1M 64k", "write 2M 4k"),
			Entry("zeroes and discards", "", "write 0 2M", "write -z 512k 512k", "discard 1M 512k"),
			Entry("extended L2 subclusters", "extended_l2=on,cluster_size=128k", "write 0 4k", "write 100k 8k", "write -z 1M 64k"),
			Entry("8-bit refcounts", "refcount_bits=8", "write 0 1M"),
			Entry("64-bit refcounts", "refcount_bits=64", "write 0 1M"),
			Entry("1-bit refcounts", "refcount_bits=1", "write 0 1M"),
		)

		It("counts persistent bitmaps", func() {
			run("qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", "raw", path)
			run("qemu-img", "bitmap", "--add", path, "checkpoint-1")
			run("qemu-io", "-f", "qcow2", "-c", "write 0 8M", path)
			run("qemu-img", "bitmap", "--add", path, "checkpoint-2")
			run("qemu-io", "-f", "qcow2", "-c", "write 40M 4M", path)
			qemuImgCheckClean(path)

			h, err := qcow2meta.ReadHeader(path)
			Expect(err).ToNot(HaveOccurred())
			Expect(h.Bitmaps).ToNot(BeNil())
			Expect(h.Bitmaps.Count).To(Equal(uint32(2)))
			res, err := qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
			Expect(res.Clean()).To(BeTrue(), res.String())
		})

		It("finds a leaked cluster", func() {
			Expect(qcow2meta.CreateOverlay(path, backing, "raw", 100*mib, qcow2meta.Options{})).To(Succeed())
			run("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", path)
			clearFirstL2Entry(path)

			res, err := qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
			Expect(res.Leaks).To(Equal(1))
			Expect(res.Corruptions).To(BeZero())
			Expect(res.Clean()).To(BeFalse())
			Expect(qemuImgCheck(path)).To(Equal(3), "qemu-img check exits 3 on leaks")
		})

		It("finds a cluster whose refcount is too low", func() {
			Expect(qcow2meta.CreateOverlay(path, backing, "raw", 100*mib, qcow2meta.Options{})).To(Succeed())
			run("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", path)
			// The data cluster is the last one of the file; zero its refcount.
			fi, err := os.Stat(path)
			Expect(err).ToNot(HaveOccurred())
			lastCluster := fi.Size()/(64<<10) - 1
			writeUint16(path, 2*(64<<10)+2*lastCluster, 0)

			res, err := qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
			Expect(res.Corruptions).To(BeNumerically(">=", 1))
			Expect(res.Clean()).To(BeFalse())
			Expect(qemuImgCheck(path)).To(Equal(2), "qemu-img check exits 2 on corruptions")
		})

		It("reports a corrupt bit", func() {
			Expect(qcow2meta.CreateOverlay(path, backing, "raw", 10*mib, qcow2meta.Options{})).To(Succeed())
			writeUint64(path, 72, qcow2meta.IncompatCorrupt)
			res, err := qcow2meta.Check(ctx, path)
			Expect(err).ToNot(HaveOccurred())
			Expect(res.MarkedCorrupt).To(BeTrue())
			Expect(res.Clean()).To(BeFalse())
		})

		It("refuses images with internal snapshots", func() {
			run("qemu-img", "create", "-q", "-f", "qcow2", path, "10M")
			run("qemu-img", "snapshot", "-c", "s1", path)
			_, err := qcow2meta.Check(ctx, path)
			Expect(err).To(MatchError(ContainSubstring("internal snapshots are not supported")))
		})
	})

	DescribeTable("ReadHeader refuses what is not a qcow2 image",
		func(content []byte) {
			path := filepath.Join(dir, "image")
			Expect(os.WriteFile(path, content, 0o644)).To(Succeed())
			_, err := qcow2meta.ReadHeader(path)
			Expect(err).To(MatchError(qcow2meta.ErrNotQcow2))
		},
		Entry("empty", []byte{}),
		Entry("short", []byte("QFI")),
		Entry("raw data", make([]byte, 4096)),
	)
})

type qemuInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	ClusterSize     int64  `json:"cluster-size"`
	BackingFilename string `json:"backing-filename"`
	BackingFormat   string `json:"backing-filename-format"`
	FormatSpecific  struct {
		Data struct {
			ExtendedL2    bool `json:"extended-l2"`
			LazyRefcounts bool `json:"lazy-refcounts"`
		} `json:"data"`
	} `json:"format-specific"`
}

func qemuImgInfo(path string) qemuInfo {
	GinkgoHelper()
	out := run("qemu-img", "info", "--output=json", "-f", "qcow2", path)
	var info qemuInfo
	Expect(json.Unmarshal(out, &info)).To(Succeed())
	return info
}

func qemuImgCheckClean(path string) {
	GinkgoHelper()
	Expect(qemuImgCheck(path)).To(BeZero())
}

// qemuImgCheck returns qemu-img check's exit status: 0 clean, 2
// corruptions, 3 leaks.
func qemuImgCheck(path string) int {
	GinkgoHelper()
	out, err := exec.Command("qemu-img", "check", "-f", "qcow2", path).CombinedOutput()
	if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
		return exitErr.ExitCode()
	}
	Expect(err).ToNot(HaveOccurred(), string(out))
	return 0
}

func run(name string, args ...string) []byte {
	GinkgoHelper()
	out, err := exec.Command(name, args...).Output()
	if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
		Fail(name + " failed: " + string(exitErr.Stderr))
	}
	Expect(err).ToNot(HaveOccurred())
	return out
}

// clearFirstL2Entry unmaps the first guest cluster: its data cluster keeps
// its refcount with no reference, a leak.
func clearFirstL2Entry(path string) {
	GinkgoHelper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	buf := make([]byte, 8)
	_, err = f.ReadAt(buf, 40)
	Expect(err).ToNot(HaveOccurred())
	l1 := binary.BigEndian.Uint64(buf)
	_, err = f.ReadAt(buf, int64(l1))
	Expect(err).ToNot(HaveOccurred())
	l2 := binary.BigEndian.Uint64(buf) & 0x00fffffffffffe00
	Expect(l2).ToNot(BeZero())
	_, err = f.WriteAt(make([]byte, 8), int64(l2))
	Expect(err).ToNot(HaveOccurred())
}

func writeUint16(path string, offset int64, v uint16) {
	GinkgoHelper()
	buf := make([]byte, 2)
	binary.BigEndian.PutUint16(buf, v)
	writeAt(path, offset, buf)
}

func writeUint64(path string, offset int64, v uint64) {
	GinkgoHelper()
	buf := make([]byte, 8)
	binary.BigEndian.PutUint64(buf, v)
	writeAt(path, offset, buf)
}

func writeAt(path string, offset int64, buf []byte) {
	GinkgoHelper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	_, err = f.WriteAt(buf, offset)
	Expect(err).ToNot(HaveOccurred())
}
