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

package mover_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore/objectstoretest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

// report is one call of a ProgressFunc.
type report struct{ done, total int64 }

// progressLog records the calls of a ProgressFunc.
type progressLog struct {
	mu    sync.Mutex
	calls []report
}

func (l *progressLog) fn(done, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, report{done, total})
}

var _ = Describe("the progress of a transfer", func() {
	var (
		ctx  context.Context
		repo *backup.Repository
		vm   = catalog.VM{Namespace: "prod", Name: "db"}
	)
	BeforeEach(func() {
		ctx = context.Background()
		repo = backup.NewRepository(objectstoretest.NewMemory())
		// No tick during the spec: only the reports the transfer makes
		// at its start and end.
		repo.ProgressInterval = time.Hour
	})

	// upload stores a full checkpoint of a 4 MiB disk as an upload pod
	// does, and returns the size of the qcow2 file it moved.
	upload := func(progress mover.ProgressFunc) int64 {
		hv, err := backuptest.New(ctx, GinkgoT().TempDir(), 4<<20)
		Expect(err).NotTo(HaveOccurred())
		Expect(hv.Write(ctx, 0, 1<<20, 0x5a)).To(Succeed())
		source := GinkgoT().TempDir()
		dir := filepath.Join(source, "db", "cp-1")
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		files, err := hv.Backup(ctx, "cp-1", "", dir)
		Expect(err).NotTo(HaveOccurred())
		file := filepath.Join(dir, "vmb-1-rootdisk.qcow2")
		Expect(os.Rename(files[hv.Disk], file)).To(Succeed())
		st, err := os.Stat(file)
		Expect(err).NotTo(HaveOccurred())

		res, err := mover.Upload(ctx, repo, mover.UploadOptions{VM: vm, Backup: "nightly", Checkpoint: "cp-1", Type: catalog.Full,
			VMBackup: "vmb-1", Source: source, Disks: []mover.Disk{{Volume: "rootdisk", Name: "db-root"}},
			Credentials: "unused", BSL: []byte("unused")}, progress)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Bytes).To(Equal(st.Size()))
		return st.Size()
	}

	It("tells an upload's total before the first byte moves, and keeps it", func() {
		var log progressLog
		total := upload(log.fn)
		Expect(log.calls).NotTo(BeEmpty())
		Expect(log.calls[0]).To(Equal(report{0, total}), "the first report, before any byte moved")
		for _, c := range log.calls {
			Expect(c.total).To(Equal(total))
		}
		Expect(log.calls[len(log.calls)-1]).To(Equal(report{total, total}))
	})

	It("tells a restore's total before the first byte moves, and keeps it", func() {
		total := upload(nil)
		var log progressLog
		res, err := mover.Restore(ctx, repo, mover.RestoreOptions{VM: vm, Backup: "nightly", Disk: "db-root",
			Target: filepath.Join(GinkgoT().TempDir(), "disk.raw"), WorkDir: GinkgoT().TempDir()}, log.fn)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Bytes).To(Equal(total))
		Expect(log.calls).NotTo(BeEmpty())
		Expect(log.calls[0]).To(Equal(report{0, total}), "the first report, before any byte moved")
		for _, c := range log.calls {
			Expect(c.total).To(Equal(total))
		}
		Expect(log.calls[len(log.calls)-1]).To(Equal(report{total, total}))
	})
})
