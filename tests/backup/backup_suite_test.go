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

// Package backup_test is the functional suite of the backup data path: a
// real S3 server (versitygw) on loopback and, for the hypervisor side,
// libvirt's checkpoints and push-mode backups of a running guest.
package backup_test

import (
	"context"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestBackup(t *testing.T) {
	framework.RunSuite(t, "backup functional Suite")
}

var s3Binary string

var _ = BeforeSuite(func(ctx context.Context) {
	var err error
	s3Binary, err = s3server.Binary(ctx, testenv.RepoRoot())
	framework.Require(err, "the S3 server build (hack/s3-server.sh)")
}, NodeTimeout(15*60e9))

// startS3 runs a fresh S3 server for one spec, stopped when the spec ends.
func startS3(ctx context.Context) *s3server.Server {
	srv, err := s3server.Start(ctx, s3Binary, GinkgoT().TempDir())
	framework.Require(err, "the S3 server (versitygw)")
	DeferCleanup(srv.Stop)
	return srv
}

// roundTrip backs up a VM of one 32 MiB disk, 8 MiB of it written, to the
// location of cfg and restores it, checking the restored disk's content;
// it returns the VM.
func roundTrip(ctx context.Context, cfg objectstore.Config, work string) catalog.VM {
	repo, err := backup.Open(cfg)
	Expect(err).NotTo(HaveOccurred())
	hv, err := backuptest.New(ctx, GinkgoT().TempDir(), 32*mib)
	Expect(err).NotTo(HaveOccurred())
	Expect(hv.Write(ctx, 0, 8*mib, 0x5a)).To(Succeed())
	vm := catalog.VM{Namespace: "prod", Name: "db"}
	_, err = repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "mon", WorkDir: work})
	Expect(err).NotTo(HaveOccurred())
	expected := filepath.Join(work, "expected.raw")
	Expect(hv.Snapshot(ctx, expected)).To(Succeed())
	target := filepath.Join(work, "restored.raw")
	_, err = repo.Restore(ctx, backup.RestoreOptions{Backup: "mon", VM: vm, Disk: "vda", Target: target, WorkDir: work})
	Expect(err).NotTo(HaveOccurred())
	Expect(qcow2.Tool{}.Compare(ctx, target, qcow2.FormatRaw, expected, "")).To(BeTrue())
	return vm
}
