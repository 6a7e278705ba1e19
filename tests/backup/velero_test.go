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
	"errors"
	"io"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/persistence"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// veleroObjectStore is Velero's object store plugin interface on the
// suite's S3 server: what Velero's aws plugin is to Velero, reduced to
// plain S3 calls, so that Velero's own backup store code runs against the
// bucket the datamover wrote.
type veleroObjectStore struct{ client *minio.Client }

var _ velero.ObjectStore = (*veleroObjectStore)(nil)

func newVeleroObjectStore(srv *s3server.Server) *veleroObjectStore {
	c, err := minio.New(strings.TrimPrefix(srv.URL, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Region: "us-east-1",
		BucketLookup: minio.BucketLookupPath,
	})
	Expect(err).NotTo(HaveOccurred())
	return &veleroObjectStore{client: c}
}

// GetObjectStore is Velero's plugin lookup: every provider is this store.
func (s *veleroObjectStore) GetObjectStore(string) (velero.ObjectStore, error) { return s, nil }

func (s *veleroObjectStore) Init(map[string]string) error { return nil }

func (s *veleroObjectStore) PutObject(bucket, key string, body io.Reader) error {
	_, err := s.client.PutObject(context.Background(), bucket, key, body, -1, minio.PutObjectOptions{})
	return err
}

func (s *veleroObjectStore) ObjectExists(bucket, key string) (bool, error) {
	_, err := s.client.StatObject(context.Background(), bucket, key, minio.StatObjectOptions{})
	if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return false, nil
	}
	return err == nil, err
}

func (s *veleroObjectStore) GetObject(bucket, key string) (io.ReadCloser, error) {
	return s.client.GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
}

// ListCommonPrefixes is the call Velero's IsValid makes: the "directories"
// right under prefix.
func (s *veleroObjectStore) ListCommonPrefixes(bucket, prefix, delimiter string) ([]string, error) {
	if delimiter != "/" {
		return nil, errors.New("only / delimits prefixes here")
	}
	var out []string
	for o := range s.client.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if o.Err != nil {
			return nil, o.Err
		}
		if strings.HasSuffix(o.Key, "/") {
			out = append(out, o.Key)
		}
	}
	return out, nil
}

func (s *veleroObjectStore) ListObjects(bucket, prefix string) ([]string, error) {
	var out []string
	for o := range s.client.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, o.Err
		}
		out = append(out, o.Key)
	}
	return out, nil
}

func (s *veleroObjectStore) DeleteObject(bucket, key string) error {
	return s.client.RemoveObject(context.Background(), bucket, key, minio.RemoveObjectOptions{})
}

func (s *veleroObjectStore) CreateSignedURL(bucket, key string, ttl time.Duration) (string, error) {
	u, err := s.client.PresignedGetObject(context.Background(), bucket, key, ttl, nil)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// veleroBackupStore is Velero's view of a backup storage location on srv,
// made by Velero's own code from the BackupStorageLocation.
func veleroBackupStore(srv *s3server.Server, bucket, prefix string) persistence.BackupStore {
	bsl := &velerov1.BackupStorageLocation{Spec: velerov1.BackupStorageLocationSpec{
		Provider:    "aws",
		StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{Bucket: bucket, Prefix: prefix}},
		Config:      map[string]string{"region": "us-east-1", "s3Url": srv.URL, "s3ForcePathStyle": "true"},
	}}
	log := logrus.New()
	log.SetOutput(GinkgoWriter)
	store, err := persistence.NewObjectBackupStoreGetter(nil).Get(bsl, newVeleroObjectStore(srv), log)
	Expect(err).NotTo(HaveOccurred())
	return store
}

var _ = Describe("the object layout with Velero", func() {
	const bucket = "backups"
	var (
		srv   *s3server.Server
		creds string
		work  string
	)
	BeforeEach(func(ctx SpecContext) {
		srv = startS3(ctx)
		work = GinkgoT().TempDir()
		var err error
		creds, err = srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
	})

	DescribeTable("leaves the location valid to Velero after a backup",
		func(ctx SpecContext, prefix string) {
			repo := newRepository(ctx, srv.BSL(bucket, prefix), creds)
			velero := veleroBackupStore(srv, bucket, prefix)
			Expect(velero.PutBackupMetadata("nightly", strings.NewReader(`{"kind":"Backup","apiVersion":"velero.io/v1","metadata":{"name":"nightly"}}`))).To(Succeed())
			Expect(velero.IsValid()).To(Succeed(), "Velero's location before the datamover wrote")

			vm := catalog.VM{Namespace: "prod", Name: "db"}
			hv, err := backuptest.New(ctx, work, 16*mib)
			Expect(err).NotTo(HaveOccurred())
			Expect(hv.Write(ctx, 0, 2*mib, 0x5a)).To(Succeed())
			for _, b := range []string{"nightly", "hourly"} {
				_, err = repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: b, WorkDir: work})
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(allKeys(ctx, repo.Store)).To(ContainElement(catalog.VMIndexPath(vm)))

			Expect(velero.IsValid()).To(Succeed(), "Velero's validation of the location after a backup")
			Expect(velero.ListBackups()).To(ConsistOf("nightly"), "Velero sees its own backups only")
		},
		Entry("under a prefix", "velero"),
		Entry("under a nested prefix", "clusters/east"),
		Entry("without a prefix", ""),
	)

	It("restores a backup that an earlier release wrote under the prefix", func(ctx SpecContext) {
		const prefix = "velero"
		repo := newRepository(ctx, srv.BSL(bucket, prefix), creds)
		old, err := objectstore.NewS3(loadBSL(srv.BSL(bucket, prefix), creds))
		Expect(err).NotTo(HaveOccurred())
		legacy := backup.NewRepository(old.At(catalog.LegacyRoot(prefix)))

		vm := catalog.VM{Namespace: "prod", Name: "db"}
		hv, err := backuptest.New(ctx, work, 16*mib)
		Expect(err).NotTo(HaveOccurred())
		Expect(hv.Write(ctx, 0, 2*mib, 0x5a)).To(Succeed())
		_, err = legacy.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "mon", WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		atMon := filepath.Join(work, "mon.raw")
		Expect(hv.Snapshot(ctx, atMon)).To(Succeed())
		Expect(veleroBackupStore(srv, bucket, prefix).IsValid()).To(MatchError(ContainSubstring("invalid top-level directories: [kubevirt-datamover]")),
			"the earlier layout is what Velero refuses")

		By("a backup after the upgrade, in the new place, full")
		Expect(hv.Write(ctx, 4*mib, mib, 0x21)).To(Succeed())
		res, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "tue", WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Checkpoint.Type).To(Equal(catalog.Full))

		By("restores of both")
		for b, want := range map[string]string{"mon": atMon, "tue": hv.Live()} {
			target := filepath.Join(work, b+"-restored.raw")
			_, err := repo.Restore(ctx, backup.RestoreOptions{Backup: b, VM: vm, Disk: "vda", Target: target, WorkDir: work})
			Expect(err).NotTo(HaveOccurred(), "restore %s", b)
			Expect(qcow2.Tool{}.Compare(ctx, target, qcow2.FormatRaw, want, "")).To(BeTrue(), "restore %s", b)
		}
		_, err = repo.ResolveChain(ctx, "never", vm)
		Expect(err).To(MatchError(ContainSubstring("backup never is not in the store")))
		Expect(backup.IsNotFound(err)).To(BeTrue())
	})
})
