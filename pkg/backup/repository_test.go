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

package backup_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore/objectstoretest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

const mib = 1 << 20

var vm = catalog.VM{Namespace: "default", Name: "vm1"}

type fixture struct {
	ctx   context.Context
	dir   string
	store *objectstoretest.Memory
	repo  *backup.Repository
	hv    *backuptest.Hypervisor
	clock time.Time
}

func newFixture() *fixture {
	f := &fixture{ctx: context.Background(), dir: GinkgoT().TempDir(), store: objectstoretest.NewMemory(),
		clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f.store.Now = func() time.Time { return f.clock }
	f.repo = backup.NewRepository(f.store)
	f.repo.Now = func() time.Time { return f.clock }
	f.repo.Catalog.Now = f.repo.Now
	f.repo.RetryDelay = time.Millisecond
	var err error
	f.hv, err = backuptest.New(f.ctx, f.dir, 16*mib)
	Expect(err).NotTo(HaveOccurred())
	return f
}

// backupNow takes backup name of vm through the stand-in hypervisor and
// keeps a copy of the live disk as it was.
func (f *fixture) backupNow(name string, opts backup.PlanOptions) *backup.BackupResult {
	f.clock = f.clock.Add(time.Minute)
	res, err := f.repo.BackupVM(f.ctx, vm, f.hv, backup.BackupOptions{Backup: name, Checkpoint: "cp-" + name, Plan: opts, WorkDir: f.dir})
	Expect(err).NotTo(HaveOccurred())
	Expect(f.hv.Snapshot(f.ctx, filepath.Join(f.dir, name+".expected.raw"))).To(Succeed())
	return res
}

func (f *fixture) restore(name string) (*backup.RestoreResult, error) {
	return f.repo.Restore(f.ctx, backup.RestoreOptions{Backup: name, VM: vm, Disk: "vda",
		Target: filepath.Join(f.dir, name+".restored.raw"), WorkDir: f.dir})
}

func (f *fixture) expectRestored(name string) {
	_, err := f.restore(name)
	Expect(err).NotTo(HaveOccurred())
	same, err := qcow2.Tool{}.Compare(f.ctx, filepath.Join(f.dir, name+".restored.raw"), qcow2.FormatRaw, filepath.Join(f.dir, name+".expected.raw"), qcow2.FormatRaw)
	Expect(err).NotTo(HaveOccurred())
	Expect(same).To(BeTrue(), "restored %s differs from the disk at its checkpoint", name)
}

// threeBackups writes, backs up full, writes, incremental, writes,
// incremental.
func (f *fixture) threeBackups() {
	Expect(f.hv.Write(f.ctx, 0, 4*mib, 0x11)).To(Succeed())
	Expect(f.backupNow("b1", backup.PlanOptions{}).Checkpoint.Type).To(Equal(catalog.Full))
	Expect(f.hv.Write(f.ctx, 1*mib, 64<<10, 0x22)).To(Succeed())
	Expect(f.backupNow("b2", backup.PlanOptions{}).Checkpoint.Type).To(Equal(catalog.Incremental))
	Expect(f.hv.Write(f.ctx, 8*mib, 128<<10, 0x33)).To(Succeed())
	Expect(f.backupNow("b3", backup.PlanOptions{}).Checkpoint.Type).To(Equal(catalog.Incremental))
}

func diskKey(name string) string {
	return catalog.DiskPath(vm, "cp-"+name, name, "vda")
}

var _ = Describe("backup and restore", func() {
	var f *fixture
	BeforeEach(func() { f = newFixture() })

	It("restores every backup of a full-then-incremental chain to the disk as it was", func() {
		f.threeBackups()
		for _, b := range []string{"b1", "b2", "b3"} {
			f.expectRestored(b)
		}
		idx, err := f.repo.Index(f.ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoint("cp-b1").ReferencedBy).To(ConsistOf("b1", "b2", "b3"))
		Expect(idx.Checkpoint("cp-b3").ReferencedBy).To(ConsistOf("b3"))
		Expect(idx.Checkpoint("cp-b3").Parent).To(Equal("cp-b2"))
		Expect(idx.Checkpoint("cp-b3").Files[0].SHA256).To(HaveLen(64))
	})

	It("uploads only what changed in an incremental", func() {
		Expect(f.hv.Write(f.ctx, 0, 8*mib, 0x11)).To(Succeed())
		full := f.backupNow("b1", backup.PlanOptions{})
		Expect(f.hv.Write(f.ctx, 2*mib, 256<<10, 0x22)).To(Succeed())
		inc := f.backupNow("b2", backup.PlanOptions{})
		Expect(full.Uploaded).To(BeNumerically(">", 8*mib))
		Expect(inc.Uploaded).To(BeNumerically("<", 1*mib))
	})

	DescribeTable("falls back to a full backup when the chain cannot be trusted",
		func(breakIt func(f *fixture) backup.PlanOptions, reason string) {
			f.threeBackups()
			opts := breakIt(f)
			plan, err := f.repo.Plan(f.ctx, vm, opts)
			Expect(err).NotTo(HaveOccurred())
			Expect(plan.Type).To(Equal(catalog.Full))
			Expect(plan.Reason).To(ContainSubstring(reason))
		},
		Entry("forced", func(*fixture) backup.PlanOptions { return backup.PlanOptions{ForceFull: true} }, "forced"),
		Entry("chain at its maximum length", func(*fixture) backup.PlanOptions { return backup.PlanOptions{MaxChainLength: 3} }, "maximum is 3"),
		Entry("the hypervisor lost the checkpoints", func(*fixture) backup.PlanOptions {
			return backup.PlanOptions{HypervisorCheckpoints: []string{"other"}}
		}, "hypervisor has none"),
		Entry("an object missing", func(f *fixture) backup.PlanOptions {
			Expect(f.store.Delete(f.ctx, diskKey("b2"))).To(Succeed())
			return backup.PlanOptions{}
		}, "missing from the bucket"),
		Entry("an object truncated", func(f *fixture) backup.PlanOptions {
			f.store.Tamper(diskKey("b1"), func(b []byte) []byte { return b[:len(b)-512] })
			return backup.PlanOptions{}
		}, "the object was altered"),
		Entry("an object replaced with one of the same size", func(f *fixture) backup.PlanOptions {
			f.store.Tamper(diskKey("b1"), func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b })
			return backup.PlanOptions{}
		}, "the object was replaced"),
	)

	It("plans an incremental from the latest checkpoint when all is well", func() {
		f.threeBackups()
		plan, err := f.repo.Plan(f.ctx, vm, backup.PlanOptions{MaxChainLength: 4, VerifyContent: true})
		Expect(err).NotTo(HaveOccurred())
		Expect(plan.Type).To(Equal(catalog.Incremental))
		Expect(plan.Parent).To(Equal("cp-b3"))
		Expect(catalog.IDs(plan.Chain)).To(Equal([]string{"cp-b1", "cp-b2", "cp-b3"}))
	})

	It("takes a full backup after a corrupt chain and restores from it", func() {
		f.threeBackups()
		Expect(f.store.Delete(f.ctx, diskKey("b2"))).To(Succeed())
		Expect(f.hv.Write(f.ctx, 12*mib, 64<<10, 0x44)).To(Succeed())
		res := f.backupNow("b4", backup.PlanOptions{})
		Expect(res.Checkpoint.Type).To(Equal(catalog.Full))
		Expect(res.Plan.Reason).To(ContainSubstring("missing"))
		f.expectRestored("b4")
	})

	DescribeTable("fails a restore with a clear error when an object is damaged",
		func(breakIt func(f *fixture), message string) {
			f.threeBackups()
			breakIt(f)
			_, err := f.restore("b3")
			Expect(err).To(MatchError(ContainSubstring(message)))
			Expect(backup.IsCorrupt(err)).To(BeTrue())
		},
		Entry("missing", func(f *fixture) { Expect(f.store.Delete(f.ctx, diskKey("b2"))).To(Succeed()) },
			"b2-vda.qcow2: missing from the bucket"),
		Entry("altered in place", func(f *fixture) {
			f.store.Tamper(diskKey("b1"), func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b })
		}, "b1-vda.qcow2: sha256 is"),
		Entry("altered in place: read again, never trusted", func(f *fixture) {
			f.store.Tamper(diskKey("b1"), func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b })
		}, "the object was altered (after 3 attempts)"),
		Entry("truncated", func(f *fixture) {
			f.store.Tamper(diskKey("b3"), func(b []byte) []byte { return b[:100] })
		}, "has 100 bytes, the index records"),
	)

	It("reads a layer again whose bytes were altered on the way, and restores it", func() {
		f.threeBackups()
		altered := 0
		f.store.Tear = func(key string, data []byte) []byte {
			if key == diskKey("b2") && altered < 2 {
				altered++
				data[len(data)/2] ^= 0xff
			}
			return data
		}
		f.expectRestored("b3")
		Expect(altered).To(Equal(2))
	})

	It("fails a restore, naming the layer, whose reads are altered every time, before qemu-img sees it", func() {
		f.threeBackups()
		reads := 0
		f.store.Tear = func(key string, data []byte) []byte {
			if key == diskKey("b2") {
				reads++
				data[len(data)/2] ^= 0xff
			}
			return data
		}
		_, err := f.restore("b3")
		Expect(err).To(MatchError(MatchRegexp(`^restore default/vm1 disk vda: checkpoint cp-b2: object ` + diskKey("b2") +
			`: sha256 is [0-9a-f]{64}, the index records [0-9a-f]{64}: the object was altered \(after 3 attempts\)$`)))
		Expect(backup.IsCorrupt(err)).To(BeTrue())
		Expect(reads).To(Equal(3))
	})

	// l2Read tells a ranged read of b2's layer that is a whole L2 table:
	// a cluster, not the header's.
	l2Read := func(key string, offset int64, data []byte) bool {
		return key == diskKey("b2") && offset > 0 && len(data) == 64<<10
	}

	DescribeTable("maps a layer again whose metadata were altered on the way, and restores it",
		func(alter func(l2 []byte)) {
			f.threeBackups()
			altered := 0
			f.store.TearRanges = func(key string, offset int64, data []byte) []byte {
				if l2Read(key, offset, data) && altered == 0 {
					altered++
					alter(data)
				}
				return data
			}
			f.expectRestored("b3")
			Expect(altered).To(Equal(1))
		},
		Entry("into another valid map: the stream finds it out", func(l2 []byte) {
			for i := 0; i < len(l2); i += 8 {
				l2[i+7] ^= 1 // every cluster zeroes or not
			}
		}),
		Entry("into a map it refuses: the layer read whole finds it out", func(l2 []byte) {
			l2[0] ^= 0x40 // compressed
		}),
	)

	It("fails a restore whose metadata reads are altered every time", func() {
		f.threeBackups()
		f.store.TearRanges = func(key string, offset int64, data []byte) []byte {
			if l2Read(key, offset, data) {
				for i := 0; i < len(data); i += 8 {
					data[i+7] ^= 1
				}
			}
			return data
		}
		_, err := f.restore("b3")
		Expect(err).To(MatchError(MatchRegexp(`^restore default/vm1 disk vda: checkpoint cp-b2: object ` + diskKey("b2") +
			`: bytes \d+-\d+ differ from those its map was read from: the object was altered \(after 3 attempts\)$`)))
		Expect(backup.IsCorrupt(err)).To(BeTrue())
	})

	It("restores through staged copies a chain whose map needs more ranges than allowed", func() {
		f.threeBackups()
		f.repo.MaxRestoreExtents = 4
		f.expectRestored("b3")
		f.expectRestored("b1")
	})

	It("replaces a target file larger than the disk", func() {
		f.threeBackups()
		target := filepath.Join(f.dir, "b3.restored.raw")
		Expect(os.WriteFile(target, bytes.Repeat([]byte{0xff}, 20*mib), 0o600)).To(Succeed())
		res, err := f.restore("b3")
		Expect(err).NotTo(HaveOccurred())
		Expect(res.VirtualSize).To(Equal(int64(16 * mib)))
		st, err := os.Stat(target)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Size()).To(Equal(int64(16 * mib)))
		f.expectRestored("b3")
	})

	It("refuses, naming the layer, a layer of compressed clusters, which it does not map", func() {
		Expect(f.hv.Write(f.ctx, 0, mib, 0x11)).To(Succeed())
		up, err := f.repo.Begin(f.ctx, vm, backup.CheckpointSpec{ID: "cp-c", Type: catalog.Full, Backup: "c"})
		Expect(err).NotTo(HaveOccurred())
		compressed := filepath.Join(f.dir, "compressed.qcow2")
		out, err := exec.Command("qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", f.hv.Live(), compressed).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		_, err = up.PutDisk(f.ctx, "vda", compressed, nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = up.Commit(f.ctx)
		Expect(err).NotTo(HaveOccurred())
		_, err = f.restore("c")
		Expect(err).To(MatchError(ContainSubstring("checkpoint cp-c: layer 0 (" + catalog.DiskPath(vm, "cp-c", "c", "vda") + "): ")))
		Expect(err).To(MatchError(ContainSubstring("compressed clusters are not supported")))
		Expect(backup.IsCorrupt(err)).To(BeFalse())
	})

	It("resumes a layer whose body ended early without an error", func() {
		f.threeBackups()
		cut := 0
		f.store.Tear = func(key string, data []byte) []byte {
			if key == diskKey("b1") && cut == 0 {
				cut++
				return data[:len(data)/3]
			}
			return data
		}
		f.expectRestored("b3")
		Expect(cut).To(Equal(1), "the read from where the body ended is whole")
	})

	It("resumes downloads whose connection breaks", func() {
		f.threeBackups()
		f.store.BreakReadsAfter = 256 << 10
		f.store.MaxBrokenReads = 3
		f.expectRestored("b3")
		Expect(f.store.BrokenReads).To(Equal(3))
	})

	It("reports progress from a ticker, not from the data path, and always the final count", func() {
		type report struct{ done, total int64 }
		var (
			mu      sync.Mutex
			reports = map[string][]report{}
		)
		progress := func(object string, done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			reports[object] = append(reports[object], report{done, total})
		}
		// A ticker that never ticks during the transfers: a report per
		// read would show as more than one per object.
		f.repo.ProgressInterval = time.Hour
		Expect(f.hv.Write(f.ctx, 0, 8*mib, 0x11)).To(Succeed())
		res, err := f.repo.BackupVM(f.ctx, vm, f.hv, backup.BackupOptions{Backup: "b1", Checkpoint: "cp-b1", WorkDir: f.dir, Progress: progress})
		Expect(err).NotTo(HaveOccurred())
		size := res.Checkpoint.Files[0].Size
		Expect(reports).To(Equal(map[string][]report{diskKey("b1"): {{size, size}}}))

		reports = map[string][]report{}
		_, err = f.repo.Restore(f.ctx, backup.RestoreOptions{Backup: "b1", VM: vm, Disk: "vda",
			Target: filepath.Join(f.dir, "b1.restored.raw"), WorkDir: f.dir, Progress: progress})
		Expect(err).NotTo(HaveOccurred())
		Expect(reports).To(Equal(map[string][]report{diskKey("b1"): {{size, size}}}))

		// A ticker that ticks: reports climb to the final count.
		f.repo.ProgressInterval = time.Microsecond
		f.store.SlowReads = 10 * time.Millisecond
		reports = map[string][]report{}
		_, err = f.repo.Restore(f.ctx, backup.RestoreOptions{Backup: "b1", VM: vm, Disk: "vda",
			Target: filepath.Join(f.dir, "b1.restored.raw"), WorkDir: f.dir, Progress: progress})
		Expect(err).NotTo(HaveOccurred())
		got := reports[diskKey("b1")]
		Expect(len(got)).To(BeNumerically(">", 1))
		Expect(got[len(got)-1]).To(Equal(report{size, size}))
		for i := 1; i < len(got); i++ {
			Expect(got[i].done).To(BeNumerically(">=", got[i-1].done))
		}
	})

	It("refuses an incremental file that holds a whole disk", func() {
		Expect(f.hv.Write(f.ctx, 0, mib, 0x11)).To(Succeed())
		f.backupNow("b1", backup.PlanOptions{})
		up, err := f.repo.Begin(f.ctx, vm, backup.CheckpointSpec{ID: "cp-x", Type: catalog.Incremental, Parent: "cp-b1", Backup: "bx"})
		Expect(err).NotTo(HaveOccurred())
		whole := filepath.Join(f.dir, "whole.qcow2")
		Expect(qcow2.Tool{}.Convert(f.ctx, f.hv.Live(), "raw", whole, "qcow2")).To(Succeed())
		_, err = up.PutDisk(f.ctx, "vda", whole, nil)
		Expect(err).To(MatchError(ContainSubstring("incremental layer has no backing file")))
		Expect(up.Abort(f.ctx)).To(Succeed())
		Expect(f.store.Keys()).NotTo(ContainElement(ContainSubstring("cp-x")))
	})
})

var _ = Describe("garbage collection", func() {
	var f *fixture
	BeforeEach(func() { f = newFixture() })

	objectsOf := func(f *fixture) []string {
		var out []string
		for _, k := range f.store.Keys() {
			if strings.HasSuffix(k, ".qcow2") {
				out = append(out, filepath.Base(k))
			}
		}
		return out
	}

	It("removes only what no remaining backup needs", func() {
		f.threeBackups()
		_, err := f.repo.DeleteBackup(f.ctx, "b2", backup.GCOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(objectsOf(f)).To(ConsistOf("b1-vda.qcow2", "b2-vda.qcow2", "b3-vda.qcow2"), "b3's chain needs b2's layer")
		f.expectRestored("b3")
		f.expectRestored("b1")

		rep, err := f.repo.DeleteBackup(f.ctx, "b3", backup.GCOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.Checkpoints).To(ConsistOf("default/vm1/cp-b2", "default/vm1/cp-b3"))
		Expect(objectsOf(f)).To(ConsistOf("b1-vda.qcow2"))
		f.expectRestored("b1")

		_, err = f.repo.DeleteBackup(f.ctx, "b1", backup.GCOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(f.store.Keys()).To(ConsistOf(catalog.VMIndexPath(vm)))
	})

	It("is idempotent and leaves other backups alone", func() {
		f.threeBackups()
		for i := 0; i < 2; i++ {
			_, err := f.repo.DeleteBackup(f.ctx, "b3", backup.GCOptions{})
			Expect(err).NotTo(HaveOccurred())
		}
		f.expectRestored("b2")
		backups, err := f.repo.Backups(f.ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(backups).To(HaveLen(2))
	})

	It("collects an upload that crashed between data and index, after the grace period only", func() {
		f.threeBackups()
		// The crash: the pending entry and the data are in, the commit is not.
		f.clock = f.clock.Add(time.Minute)
		up, err := f.repo.Begin(f.ctx, vm, backup.CheckpointSpec{ID: "cp-crash", Type: catalog.Incremental, Parent: "cp-b3", Backup: "crash"})
		Expect(err).NotTo(HaveOccurred())
		files, err := f.hv.Backup(f.ctx, "cp-crash", "cp-b3", f.dir)
		Expect(err).NotTo(HaveOccurred())
		_, err = up.PutDisk(f.ctx, "vda", files["vda"], nil)
		Expect(err).NotTo(HaveOccurred())
		// An object no entry names, such as a retried upload's leftover.
		Expect(f.store.Put(f.ctx, catalog.AttachmentPath(vm, "cp-ghost", "x.qcow2"), strings.NewReader("x"), 1, objectstoreOpts)).Error().NotTo(HaveOccurred())

		// Nothing is lost: the next backup is incremental from b3 and restores.
		Expect(f.hv.Write(f.ctx, 3*mib, 64<<10, 0x55)).To(Succeed())
		res := f.backupNow("b4", backup.PlanOptions{})
		Expect(res.Checkpoint.Parent).To(Equal("cp-b3"))
		f.expectRestored("b4")

		rep, err := f.repo.Collect(f.ctx, backup.GCOptions{Grace: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.Objects).To(BeEmpty(), "the upload may still be running")

		f.clock = f.clock.Add(2 * time.Hour)
		rep, err = f.repo.Collect(f.ctx, backup.GCOptions{Grace: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.Checkpoints).To(ConsistOf("default/vm1/cp-crash"))
		Expect(objectsOf(f)).To(ConsistOf("b1-vda.qcow2", "b2-vda.qcow2", "b3-vda.qcow2", "b4-vda.qcow2"))
		for _, k := range f.store.Keys() {
			Expect(k).NotTo(ContainSubstring("ghost"))
		}
		f.expectRestored("b4")
	})

	It("reports on a dry run what a real run then removes, and changes nothing", func() {
		f.threeBackups()
		// An object no entry names, old enough for the sweep.
		Expect(f.store.Put(f.ctx, catalog.AttachmentPath(vm, "cp-ghost", "x.qcow2"), strings.NewReader("x"), 1, objectstoreOpts)).Error().NotTo(HaveOccurred())
		f.clock = f.clock.Add(48 * time.Hour)
		keys := f.store.Keys()
		idx, err := f.repo.Index(f.ctx, vm)
		Expect(err).NotTo(HaveOccurred())

		dry, err := f.repo.DeleteBackup(f.ctx, "b3", backup.GCOptions{DryRun: true})
		Expect(err).NotTo(HaveOccurred())
		Expect(dry.Checkpoints).To(ConsistOf("default/vm1/cp-b3"))
		Expect(dry.Objects).To(ContainElements(diskKey("b3"), ContainSubstring("cp-ghost"), "manifests/b3/"))
		dryGC, err := f.repo.Collect(f.ctx, backup.GCOptions{DryRun: true})
		Expect(err).NotTo(HaveOccurred())
		Expect(dryGC.Objects).To(ConsistOf(ContainSubstring("cp-ghost")))
		Expect(f.store.Keys()).To(Equal(keys))
		after, err := f.repo.Index(f.ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(after).To(Equal(idx))

		done, err := f.repo.DeleteBackup(f.ctx, "b3", backup.GCOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(done).To(Equal(dry))
		Expect(f.store.Keys()).NotTo(ContainElement(diskKey("b3")))
	})

	It("keeps the parent of an upload in progress even when its backup is deleted", func() {
		Expect(f.hv.Write(f.ctx, 0, mib, 0x11)).To(Succeed())
		f.backupNow("b1", backup.PlanOptions{})
		up, err := f.repo.Begin(f.ctx, vm, backup.CheckpointSpec{ID: "cp-b2", Type: catalog.Incremental, Parent: "cp-b1", Backup: "b2"})
		Expect(err).NotTo(HaveOccurred())
		_, err = f.repo.DeleteBackup(f.ctx, "b1", backup.GCOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(objectsOf(f)).To(ConsistOf("b1-vda.qcow2"))

		files, err := f.hv.Backup(f.ctx, "cp-b2", "cp-b1", f.dir)
		Expect(err).NotTo(HaveOccurred())
		_, err = up.PutDisk(f.ctx, "vda", files["vda"], nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = up.Commit(f.ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(f.hv.Snapshot(f.ctx, filepath.Join(f.dir, "b2.expected.raw"))).To(Succeed())
		f.expectRestored("b2")
	})
})

var _ = Describe("concurrent commits", func() {
	It("records every VM of a backup finishing at once", func() {
		f := newFixture()
		const vms = 6
		hvs := make([]*backuptest.Hypervisor, vms)
		for i := range hvs {
			var err error
			hvs[i], err = backuptest.New(f.ctx, GinkgoT().TempDir(), 4*mib)
			Expect(err).NotTo(HaveOccurred())
			Expect(hvs[i].Write(f.ctx, 0, mib, byte(i+1))).To(Succeed())
		}
		errs := make(chan error, vms)
		for i := range hvs {
			go func(i int) {
				_, err := f.repo.BackupVM(f.ctx, catalog.VM{Namespace: "ns", Name: fmt.Sprintf("vm%d", i)}, hvs[i],
					backup.BackupOptions{Backup: "nightly", WorkDir: GinkgoT().TempDir()})
				errs <- err
			}(i)
		}
		for range hvs {
			Expect(<-errs).NotTo(HaveOccurred())
		}
		m, found, err := f.repo.Catalog.BackupManifest(f.ctx, "nightly")
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
		Expect(m.VMs).To(HaveLen(vms))
	})
})

var objectstoreOpts = objectstore.PutOptions{}
