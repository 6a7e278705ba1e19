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

package veleroplugin_test

import (
	"context"
	"errors"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore/objectstoretest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

// seedBackup records a full checkpoint of vm with one disk object, needed
// by backupName alone.
func seedBackup(store objectstore.Store, backupName string, vm catalog.VM) string {
	repo := backup.NewRepository(store)
	checkpoint := "cp-" + backupName
	key := catalog.DiskPath(vm, checkpoint, backupName, "db-root")
	Expect(store.Put(ctx, key, strings.NewReader("layer"), 5, objectstore.PutOptions{})).Error().NotTo(HaveOccurred())
	_, err := repo.Catalog.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
		idx.Checkpoints = append(idx.Checkpoints, catalog.CheckpointEntry{
			ID: checkpoint, Type: catalog.Full, Timestamp: time.Now().UTC(), State: catalog.Complete,
			Files:        []catalog.FileEntry{{Filename: catalog.DiskFilename(backupName, "db-root"), DiskName: "db-root", Size: 5, ObjectPath: key}},
			ReferencedBy: []string{backupName},
		})
		return nil
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(repo.RecordBackup(ctx, backupName, vm, []string{checkpoint})).To(Succeed())
	return key
}

// uploadItem is a finished DataUpload of the backup action as the backup's
// tarball holds it.
func uploadItem(vm catalog.VM, dataMover string) *velero.DeleteItemActionExecuteInput {
	du := &velerov2.DataUpload{
		TypeMeta: metav1.TypeMeta{APIVersion: velerov2.SchemeGroupVersion.String(), Kind: "DataUpload"},
		ObjectMeta: metav1.ObjectMeta{Name: "tue-" + vm.Name, Namespace: veleroNamespace,
			Labels:      map[string]string{velerov1.BackupNameLabel: "tue"},
			Annotations: map[string]string{datamover.AnnotationVMName: vm.Name, datamover.AnnotationVMNamespace: vm.Namespace}},
		Spec: velerov2.DataUploadSpec{DataMover: dataMover, BackupStorageLocation: "default", SourceNamespace: vm.Namespace},
		Status: velerov2.DataUploadStatus{Phase: velerov2.DataUploadPhaseCompleted,
			SnapshotID: datamover.SnapshotID("tue", vm.Namespace, vm.Name)},
	}
	return &velero.DeleteItemActionExecuteInput{Item: item(du), Backup: kubevirtBackup()}
}

var _ = Describe("the delete action", func() {
	var (
		store  *objectstoretest.Memory
		opened []string
		action *veleroplugin.DeleteAction
		db     = catalog.VM{Namespace: "prod", Name: "db"}
		web    = catalog.VM{Namespace: "prod", Name: "web"}
	)
	BeforeEach(func() {
		store = objectstoretest.NewMemory()
		opened = nil
		action = veleroplugin.NewDeleteAction(newClient(interceptor.Funcs{}), log).WithOpener(
			func(_ context.Context, _ client.Reader, namespace, name string) (*backup.Repository, error) {
				opened = append(opened, namespace+"/"+name)
				return backup.NewRepository(store), nil
			})
	})

	It("applies to DataUploads", func() {
		sel, err := action.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(sel.IncludedResources).To(ConsistOf("datauploads.velero.io"))
	})

	It("removes the backup from the catalog and what no other backup needs, once per backup", func() {
		tueDB, tueWeb := seedBackup(store, "tue", db), seedBackup(store, "tue", web)
		wedDB := seedBackup(store, "wed", db)

		Expect(action.Execute(uploadItem(db, datamover.DataMover))).To(Succeed())
		Expect(action.Execute(uploadItem(web, datamover.DataMover))).To(Succeed())
		Expect(opened).To(Equal([]string{"velero/default"}), "one removal for the backup's two VMs")

		repo := backup.NewRepository(store)
		backups, err := repo.Backups(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(backups).To(HaveLen(1))
		Expect(backups[0].BackupName).To(Equal("wed"))
		keys := store.Keys()
		Expect(keys).NotTo(ContainElements(tueDB, tueWeb))
		Expect(keys).To(ContainElement(wedDB))
		for _, key := range keys {
			Expect(key).NotTo(HavePrefix(catalog.BackupDir("tue")))
		}
		idx, err := repo.Index(ctx, db)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(1))
		Expect(idx.Checkpoints[0].ReferencedBy).To(ConsistOf("wed"))
		_, err = repo.ResolveChain(ctx, "wed", db)
		Expect(err).NotTo(HaveOccurred())
	})

	It("removes the backup from where earlier releases kept it too", func() {
		legacy := objectstoretest.NewMemory()
		seedBackup(legacy, "tue", db)
		action.WithOpener(func(context.Context, client.Reader, string, string) (*backup.Repository, error) {
			repo := backup.NewRepository(store)
			repo.Legacy = legacy
			return repo, nil
		})
		Expect(action.Execute(uploadItem(db, datamover.DataMover))).To(Succeed())
		Expect(legacy.Keys()).To(ConsistOf(catalog.VMIndexPath(db)))
	})

	It("leaves DataUploads of other data movers to Velero", func() {
		seedBackup(store, "tue", db)
		Expect(action.Execute(uploadItem(db, ""))).To(Succeed())
		Expect(opened).To(BeEmpty())
	})

	It("says what it could not do", func() {
		in := uploadItem(db, datamover.DataMover)
		in.Item.(interface{ SetAnnotations(map[string]string) }).SetAnnotations(nil)
		Expect(action.Execute(in)).To(MatchError(ContainSubstring(datamover.AnnotationVMName)))

		action.WithOpener(func(context.Context, client.Reader, string, string) (*backup.Repository, error) {
			return nil, errors.New("backup storage location velero/default: not found")
		})
		Expect(action.Execute(uploadItem(db, datamover.DataMover))).To(MatchError(ContainSubstring("delete backup tue from location default")))
	})
})
