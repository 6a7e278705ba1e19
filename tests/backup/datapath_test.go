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
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

const mib = 1 << 20

// bucketFile is where the posix backend keeps an object of the datamover's
// root: behind the server's back, as disk rot would change it.
func bucketFile(srv *s3server.Server, bucket, prefix, key string) string {
	return filepath.Join(srv.Root, bucket, catalog.Root(prefix), key)
}

// allKeys lists every object in the store.
func allKeys(ctx context.Context, s objectstore.Store) []string {
	objs, err := s.List(ctx, "")
	Expect(err).NotTo(HaveOccurred())
	keys := make([]string, len(objs))
	for i, o := range objs {
		keys[i] = o.Key
	}
	return keys
}

// referencedKeys lists every object some index or manifest names, plus the
// documents themselves.
func referencedKeys(ctx context.Context, repo *backup.Repository) []string {
	var keys []string
	vms, err := repo.VMs(ctx)
	Expect(err).NotTo(HaveOccurred())
	for _, vm := range vms {
		keys = append(keys, catalog.VMIndexPath(vm))
		idx, err := repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		for _, c := range idx.Checkpoints {
			for _, f := range c.Files {
				keys = append(keys, f.ObjectPath)
			}
		}
	}
	backups, err := repo.Backups(ctx)
	Expect(err).NotTo(HaveOccurred())
	for _, b := range backups {
		keys = append(keys, catalog.BackupIndexPath(b.BackupName))
		for _, v := range b.VMs {
			keys = append(keys, v.ManifestPath)
		}
	}
	return keys
}

var _ = Describe("the data path on a real S3 server", func() {
	const bucket, prefix = "backups", "velero"
	var (
		ctx   context.Context
		srv   *s3server.Server
		store objectstore.Store
		repo  *backup.Repository
		work  string
	)
	BeforeEach(func(c SpecContext) {
		ctx = context.Background()
		work = GinkgoT().TempDir()
		srv = startS3(c)
		creds, err := srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
		repo = newRepository(ctx, srv.BSL(bucket, prefix), creds)
		store = repo.Store
		repo.RetryDelay = 10 * time.Millisecond
	})

	newVM := func(name string) (catalog.VM, *backuptest.Hypervisor) {
		hv, err := backuptest.New(ctx, GinkgoT().TempDir(), 32*mib)
		Expect(err).NotTo(HaveOccurred())
		Expect(hv.Write(ctx, 0, 8*mib, 0x5a)).To(Succeed())
		return catalog.VM{Namespace: "prod", Name: name}, hv
	}

	restoreAndCompare := func(b string, vm catalog.VM, expected string) {
		target := filepath.Join(work, b+"-"+vm.Name+".raw")
		_, err := repo.Restore(ctx, backup.RestoreOptions{Backup: b, VM: vm, Disk: "vda", Target: target, WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		Expect(qcow2.Tool{}.Compare(ctx, target, qcow2.FormatRaw, expected, "")).To(BeTrue())
	}

	It("keeps both VMs of one backup that finish at the same moment", func() {
		vmA, hvA := newVM("a")
		vmB, hvB := newVM("b")
		Expect(hvB.Write(ctx, 16*mib, mib, 0x77)).To(Succeed())
		ups := map[catalog.VM]*backup.Upload{}
		for vm, hv := range map[catalog.VM]*backuptest.Hypervisor{vmA: hvA, vmB: hvB} {
			up, err := repo.Begin(ctx, vm, backup.CheckpointSpec{ID: "nightly-1", Type: catalog.Full, Backup: "nightly"})
			Expect(err).NotTo(HaveOccurred())
			files, err := hv.Backup(ctx, "nightly-1", "", GinkgoT().TempDir())
			Expect(err).NotTo(HaveOccurred())
			_, err = up.PutDisk(ctx, "vda", files["vda"], nil)
			Expect(err).NotTo(HaveOccurred())
			ups[vm] = up
		}
		// Both commits race for manifests/nightly/index.json.
		commitTogether(ctx, slices.Collect(maps.Values(ups)))
		m, found, err := repo.Catalog.BackupManifest(ctx, "nightly")
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
		Expect(m.VMs).To(ConsistOf(HaveField("Name", "a"), HaveField("Name", "b")))
		restoreAndCompare("nightly", vmA, hvA.Live())
		restoreAndCompare("nightly", vmB, hvB.Live())
	})

	It("keeps both backups of one VM that finish at the same moment", func() {
		vm, hv := newVM("a")
		var ups []*backup.Upload
		for _, b := range []string{"hourly", "weekly"} {
			up, err := repo.Begin(ctx, vm, backup.CheckpointSpec{ID: b + "-1", Type: catalog.Full, Backup: b})
			Expect(err).NotTo(HaveOccurred())
			files, err := hv.Backup(ctx, b+"-1", "", GinkgoT().TempDir())
			Expect(err).NotTo(HaveOccurred())
			_, err = up.PutDisk(ctx, "vda", files["vda"], nil)
			Expect(err).NotTo(HaveOccurred())
			ups = append(ups, up)
		}
		commitTogether(ctx, ups)
		idx, err := repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Latest()).To(HaveLen(2))
		Expect(idx.Checkpoint("hourly-1").ReferencedBy).To(ConsistOf("hourly"))
		Expect(idx.Checkpoint("weekly-1").ReferencedBy).To(ConsistOf("weekly"))
		restoreAndCompare("hourly", vm, hv.Live())
		restoreAndCompare("weekly", vm, hv.Live())
	})

	It("loses nothing and leaves nothing when an upload dies between data and index", func() {
		vm, hv := newVM("a")
		_, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b1", Checkpoint: "cp1", WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		Expect(hv.Write(ctx, 4*mib, mib, 0x21)).To(Succeed())

		// The upload pod dies after its data is in and before its commit.
		up, err := repo.Begin(ctx, vm, backup.CheckpointSpec{ID: "cp2", Type: catalog.Incremental, Parent: "cp1", Backup: "b2"})
		Expect(err).NotTo(HaveOccurred())
		files, err := hv.Backup(ctx, "cp2", "cp1", GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		_, err = up.PutDisk(ctx, "vda", files["vda"], nil)
		Expect(err).NotTo(HaveOccurred())

		// The next backup goes on from the last complete checkpoint.
		Expect(hv.Write(ctx, 20*mib, mib, 0x22)).To(Succeed())
		res, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b3", Checkpoint: "cp3", WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Checkpoint.Parent).To(Equal("cp1"))
		restoreAndCompare("b3", vm, hv.Live())

		// The dead upload's objects are the only ones no document names...
		Expect(allKeys(ctx, store)).To(ContainElement(HaveSuffix("cp2/b2-vda.qcow2")))
		// ...and garbage collection removes them once the grace period is over.
		rep, err := repo.Collect(ctx, backup.GCOptions{Grace: -1})
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.Checkpoints).To(ConsistOf("prod/a/cp2"))
		Expect(allKeys(ctx, store)).To(ConsistOf(referencedKeys(ctx, repo)))
		restoreAndCompare("b3", vm, hv.Live())
	})

	It("removes exactly what no backup needs when backups are deleted", func() {
		vm, hv := newVM("a")
		for i, b := range []string{"b1", "b2", "b3"} {
			Expect(hv.Write(ctx, int64(i)*4*mib, mib, byte(0x30+i))).To(Succeed())
			_, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: b, WorkDir: work})
			Expect(err).NotTo(HaveOccurred())
		}
		for _, b := range []string{"b1", "b2"} {
			_, err := repo.DeleteBackup(ctx, b, backup.GCOptions{})
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(allKeys(ctx, store)).To(ConsistOf(referencedKeys(ctx, repo)))
		Expect(allKeys(ctx, store)).To(HaveLen(6), "index, 3 layers of b3's chain, b3's two manifests")
		restoreAndCompare("b3", vm, hv.Live())
		_, err := repo.DeleteBackup(ctx, "b3", backup.GCOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(allKeys(ctx, store)).To(ConsistOf(catalog.VMIndexPath(vm)))
	})

	DescribeTable("catches a damaged object: the next backup is full, a restore fails clearly",
		func(damage func(key string), planOpts backup.PlanOptions, message string) {
			vm, hv := newVM("a")
			_, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b1", Checkpoint: "cp1", WorkDir: work})
			Expect(err).NotTo(HaveOccurred())
			Expect(hv.Write(ctx, 4*mib, mib, 0x21)).To(Succeed())
			_, err = repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b2", Checkpoint: "cp2", WorkDir: work})
			Expect(err).NotTo(HaveOccurred())

			damage(catalog.DiskPath(vm, "cp1", "b1", "vda"))

			_, err = repo.Restore(ctx, backup.RestoreOptions{Backup: "b2", VM: vm, Disk: "vda", Target: filepath.Join(work, "r.raw"), WorkDir: work})
			Expect(err).To(MatchError(ContainSubstring(message)))
			Expect(err).To(MatchError(ContainSubstring("cp1/b1-vda.qcow2")))

			Expect(hv.Write(ctx, 8*mib, mib, 0x22)).To(Succeed())
			res, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b3", WorkDir: work, Plan: planOpts})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Checkpoint.Type).To(Equal(catalog.Full))
			Expect(res.Plan.Reason).To(ContainSubstring("cp1/b1-vda.qcow2"))
			restoreAndCompare("b3", vm, hv.Live())
		},
		Entry("deleted", func(key string) {
			Expect(store.Delete(ctx, key)).To(Succeed())
		}, backup.PlanOptions{}, "missing from the bucket"),
		Entry("overwritten through S3", func(key string) {
			_, err := store.Put(ctx, key, strings.NewReader("not a qcow2"), 11, objectstore.PutOptions{})
			Expect(err).NotTo(HaveOccurred())
		}, backup.PlanOptions{}, "the object was altered"),
		Entry("rotten on the server's disk (same size and ETag)", func(key string) {
			path := bucketFile(srv, bucket, prefix, key)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			Expect(err).NotTo(HaveOccurred())
			defer f.Close()
			_, err = f.WriteAt([]byte{0xde, 0xad}, 128<<10)
			Expect(err).NotTo(HaveOccurred())
		}, backup.PlanOptions{VerifyContent: true}, "sha256 is"),
	)
})

// commitTogether commits every upload at once, so their catalog updates
// race, and expects all to succeed.
func commitTogether(ctx context.Context, ups []*backup.Upload) {
	GinkgoHelper()
	errs := make(chan error, len(ups))
	for _, up := range ups {
		go func(up *backup.Upload) {
			_, err := up.Commit(ctx)
			errs <- err
		}(up)
	}
	for range ups {
		Expect(<-errs).NotTo(HaveOccurred())
	}
}
