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

package overlay_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/overlay"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

func TestOverlay(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "overlay Suite")
}

const mib = 1 << 20

// Every behaviour holds for both image tools: Go alone (a sidecar) and
// qemu-img (a launcher).
var tools = []struct {
	name   string
	images overlay.Images
}{
	{"native", overlay.Native{}},
	{"qemu-img", overlay.QemuImg{}},
}

var _ = Describe("Manager", func() {
	for _, tool := range tools {
		Context("with "+tool.name, func() {
			var (
				ctx     context.Context
				m       overlay.Manager
				dir     string
				golden  string
				spec    overlay.Spec
				goldSum string
			)

			BeforeEach(func() {
				ctx = context.Background()
				m = overlay.Manager{Images: tool.images}
				dir = GinkgoT().TempDir()
				golden = filepath.Join(dir, "golden.raw")
				writeGolden(golden, 64*mib)
				goldSum = sha256File(golden)
				spec = overlay.Spec{
					Path:       filepath.Join(dir, "vm1", "rootdisk.qcow2"),
					Backing:    overlay.Backing{Path: golden, Format: qcow2.FormatRaw},
					Persistent: true,
				}
			})

			It("creates an overlay with the backing's size and a record", func() {
				res, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(res.Created).To(BeTrue())
				Expect(res.Record.Size).To(Equal(int64(64 * mib)))
				Expect(res.Record.Identity.Method).To(Equal(overlay.IdentitySampled))

				info := qemuInfo(spec.Path)
				Expect(info.BackingFilename).To(Equal(golden))
				Expect(info.BackingFormat).To(Equal("raw"))
				Expect(info.VirtualSize).To(Equal(int64(64 * mib)))
				Expect(spec.Path + overlay.RecordSuffix).To(BeAnExistingFile())
				Expect(leftovers(filepath.Dir(spec.Path))).To(BeEmpty())
				Expect(sha256File(golden)).To(Equal(goldSum))
			})

			It("reuses a valid overlay and keeps what the guest wrote", func() {
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				qemuIO(spec.Path, "write -P 0x77 1M 64k")

				res, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(res.Created).To(BeFalse())
				qemuIO(spec.Path, "read -P 0x77 1M 64k")
				Expect(sha256File(golden)).To(Equal(goldSum))
			})

			It("records where QEMU sees the backing and reads it where this process does", func() {
				spec.Backing = overlay.Backing{
					Path:      "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img",
					Format:    qcow2.FormatRaw,
					LocalPath: golden,
				}
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				h, err := overlay.Native{}.Inspect(ctx, spec.Path)
				Expect(err).ToNot(HaveOccurred())
				Expect(h.BackingFile).To(Equal(spec.Backing.Path))

				res, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(res.Created).To(BeFalse())
				Expect(res.Record.Backing.LocalPath).To(BeEmpty(), "the record names QEMU's path only")
			})

			It("takes a qcow2 backing's virtual size", func() {
				qgolden := filepath.Join(dir, "golden.qcow2")
				run("qemu-img", "create", "-q", "-f", "qcow2", qgolden, "3G")
				spec.Backing = overlay.Backing{Path: qgolden, Format: qcow2.FormatQcow2}
				res, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(res.Record.Size).To(Equal(int64(3 << 30)))
				Expect(qemuInfo(spec.Path).BackingFormat).To(Equal("qcow2"))
			})

			It("applies size and creation options", func() {
				spec.Size = 128 * mib
				spec.Options = overlay.CreateOptions{ClusterSize: 128 << 10, ExtendedL2: true, LazyRefcounts: true}
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				info := qemuInfo(spec.Path)
				Expect(info.VirtualSize).To(Equal(int64(128 * mib)))
				Expect(info.ClusterSize).To(Equal(int64(128 << 10)))
				Expect(info.FormatSpecific.Data.ExtendedL2).To(BeTrue())
				Expect(info.FormatSpecific.Data.LazyRefcounts).To(BeTrue())
			})

			It("refuses an overlay whose backing changed, and leaves it alone", func() {
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				qemuIO(spec.Path, "write -P 0x77 0 64k")
				before := sha256File(spec.Path)
				writeAt(golden, 0, []byte("a new golden image"))

				_, err = m.Ensure(ctx, spec)
				Expect(err).To(MatchError(overlay.ErrBackingChanged))
				Expect(err).To(MatchError(ContainSubstring(golden)))
				Expect(sha256File(spec.Path)).To(Equal(before), "never re-created")
			})

			It("refuses an overlay whose backing grew", func() {
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(os.Truncate(golden, 65*mib)).To(Succeed())
				_, err = m.Ensure(ctx, spec)
				Expect(err).To(MatchError(overlay.ErrBackingChanged))
			})

			DescribeTable("refuses an existing overlay that cannot be trusted",
				func(damage func(spec *overlay.Spec), message string) {
					_, err := m.Ensure(ctx, spec)
					Expect(err).ToNot(HaveOccurred())
					damage(&spec)
					_, err = m.Ensure(ctx, spec)
					Expect(err).To(MatchError(overlay.ErrInvalidOverlay))
					Expect(err).To(MatchError(ContainSubstring(message)))
				},
				Entry("another backing expected", func(s *overlay.Spec) {
					other := filepath.Join(filepath.Dir(s.Backing.Path), "other.raw")
					writeGolden(other, 64*mib)
					s.Backing.Path = other
				}, "names backing"),
				Entry("another backing format expected", func(s *overlay.Spec) {
					s.Backing.Format = qcow2.FormatQcow2
				}, `names backing format "raw", expected "qcow2"`),
				Entry("not a qcow2 image", func(s *overlay.Spec) {
					Expect(os.WriteFile(s.Path, make([]byte, 4096), 0o644)).To(Succeed())
				}, "cannot be trusted"),
				Entry("leaked clusters", func(s *overlay.Spec) {
					qemuIO(s.Path, "write 0 64k")
					leakFirstCluster(s.Path)
				}, "metadata check failed"),
				Entry("no creation record", func(s *overlay.Spec) {
					Expect(os.Remove(s.Path + overlay.RecordSuffix)).To(Succeed())
				}, "creation record"),
			)

			It("validates an overlay QEMU has open without checking it", func() {
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				qemuIO(spec.Path, "write 0 64k")
				leakFirstCluster(spec.Path)
				spec.InUse = true
				_, err = m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
			})

			It("never creates an overlay QEMU is said to have open", func() {
				spec.InUse = true
				_, err := m.Ensure(ctx, spec)
				Expect(err).To(MatchError(overlay.ErrInvalidOverlay))
				Expect(spec.Path).ToNot(BeAnExistingFile())
			})

			It("replaces the remains of an interrupted create", func() {
				Expect(os.MkdirAll(filepath.Dir(spec.Path), 0o755)).To(Succeed())
				Expect(os.WriteFile(spec.Path+overlay.RecordSuffix, []byte(`{"version":1}`), 0o644)).To(Succeed())
				half := filepath.Join(filepath.Dir(spec.Path), ".rootdisk.qcow2.creating-123")
				Expect(os.WriteFile(half, []byte("QFI"), 0o644)).To(Succeed())

				res, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(res.Created).To(BeTrue())
				_, err = m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
			})

			It("fails when the backing is missing, creating nothing", func() {
				spec.Backing.Path = filepath.Join(dir, "missing.raw")
				_, err := m.Ensure(ctx, spec)
				Expect(err).To(MatchError(ContainSubstring("missing.raw")))
				Expect(spec.Path).ToNot(BeAnExistingFile())
			})

			It("removes an ephemeral overlay and refuses to remove a persistent one", func() {
				_, err := m.Ensure(ctx, spec)
				Expect(err).ToNot(HaveOccurred())
				Expect(m.Remove(spec)).To(MatchError(ContainSubstring("refusing to remove a persistent overlay")))
				Expect(spec.Path).To(BeAnExistingFile())

				spec.Persistent = false
				Expect(m.Remove(spec)).To(Succeed())
				Expect(spec.Path).ToNot(BeAnExistingFile())
				Expect(spec.Path + overlay.RecordSuffix).ToNot(BeAnExistingFile())
				Expect(m.Remove(spec)).To(Succeed(), "removing twice is fine")
				Expect(sha256File(golden)).To(Equal(goldSum))
			})
		})
	}

	DescribeTable("refuses bad specs before touching anything",
		func(mutate func(*overlay.Spec), message string) {
			spec := overlay.Spec{Path: "/overlays/a.qcow2", Backing: overlay.Backing{Path: "/golden.raw", Format: "raw"}}
			mutate(&spec)
			_, err := overlay.Manager{Images: overlay.Native{}}.Ensure(context.Background(), spec)
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("relative overlay", func(s *overlay.Spec) { s.Path = "a.qcow2" }, `overlay path "a.qcow2" is not absolute`),
		Entry("relative backing", func(s *overlay.Spec) { s.Backing.Path = "golden.raw" }, `backing path "golden.raw" is not absolute`),
		Entry("unknown format", func(s *overlay.Spec) { s.Backing.Format = "vmdk" }, `unsupported backing format "vmdk"`),
		Entry("unknown identity", func(s *overlay.Spec) { s.Identity = "md5" }, `unknown identity method "md5"`),
	)
})

var _ = Describe("Identify", func() {
	var (
		ctx    context.Context
		golden string
	)

	BeforeEach(func() {
		ctx = context.Background()
		golden = filepath.Join(GinkgoT().TempDir(), "golden.raw")
		writeGolden(golden, 64*mib)
	})

	It("is stable and changes with the bytes it reads", func() {
		a, err := overlay.Identify(ctx, golden, overlay.IdentitySampled)
		Expect(err).ToNot(HaveOccurred())
		b, err := overlay.Identify(ctx, golden, overlay.IdentitySampled)
		Expect(err).ToNot(HaveOccurred())
		Expect(a).To(Equal(b))
		writeAt(golden, 64*mib-1, []byte{0xff})
		c, err := overlay.Identify(ctx, golden, overlay.IdentitySampled)
		Expect(err).ToNot(HaveOccurred())
		Expect(c.Digest).ToNot(Equal(a.Digest))
	})

	It("hashes everything in full mode, the samples only in sampled mode", func() {
		sampled, err := overlay.Identify(ctx, golden, overlay.IdentitySampled)
		Expect(err).ToNot(HaveOccurred())
		full, err := overlay.Identify(ctx, golden, overlay.IdentityFull)
		Expect(err).ToNot(HaveOccurred())
		// A byte between two samples.
		writeAt(golden, 2*mib+100*1024, []byte{0xff})
		sampled2, err := overlay.Identify(ctx, golden, overlay.IdentitySampled)
		Expect(err).ToNot(HaveOccurred())
		full2, err := overlay.Identify(ctx, golden, overlay.IdentityFull)
		Expect(err).ToNot(HaveOccurred())
		Expect(sampled2).To(Equal(sampled))
		Expect(full2).ToNot(Equal(full))
	})

	It("stops when its context is cancelled", func() {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := overlay.Identify(cctx, golden, overlay.IdentityFull)
		Expect(err).To(MatchError(context.Canceled))
	})
})

// writeGolden makes a raw image whose every MiB starts with its index, so
// that content differs everywhere.
func writeGolden(path string, size int64) {
	GinkgoHelper()
	f, err := os.Create(path)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	Expect(f.Truncate(size)).To(Succeed())
	for off := int64(0); off < size; off += mib {
		_, err := f.WriteAt([]byte{byte(off / mib), 0xaa}, off)
		Expect(err).ToNot(HaveOccurred())
	}
}

func writeAt(path string, off int64, data []byte) {
	GinkgoHelper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	_, err = f.WriteAt(data, off)
	Expect(err).ToNot(HaveOccurred())
}

func sha256File(path string) string {
	GinkgoHelper()
	f, err := os.Open(path)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	Expect(err).ToNot(HaveOccurred())
	return hex.EncodeToString(h.Sum(nil))
}

func leftovers(dir string) []string {
	GinkgoHelper()
	matches, err := filepath.Glob(filepath.Join(dir, ".*"))
	Expect(err).ToNot(HaveOccurred())
	return matches
}

func qemuInfo(path string) *qcow2.Info {
	GinkgoHelper()
	info, err := qcow2.Tool{}.Info(context.Background(), path, qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
	Expect(err).ToNot(HaveOccurred())
	return info
}

func qemuIO(path, command string) {
	GinkgoHelper()
	out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", command, path).CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), string(out))
	Expect(string(out)).ToNot(ContainSubstring("Pattern verification failed"))
}

func run(name string, args ...string) {
	GinkgoHelper()
	out, err := exec.Command(name, args...).CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), string(out))
}

// leakFirstCluster unmaps guest cluster 0: its data cluster stays
// allocated with no reference.
func leakFirstCluster(path string) {
	GinkgoHelper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	buf := make([]byte, 8)
	_, err = f.ReadAt(buf, 40)
	Expect(err).ToNot(HaveOccurred())
	l1 := be64(buf)
	_, err = f.ReadAt(buf, int64(l1))
	Expect(err).ToNot(HaveOccurred())
	l2 := be64(buf) & 0x00fffffffffffe00
	Expect(l2).ToNot(BeZero())
	_, err = f.WriteAt(make([]byte, 8), int64(l2))
	Expect(err).ToNot(HaveOccurred())
}

func be64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}
