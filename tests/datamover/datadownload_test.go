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

package datamover_test

import (
	"context"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

var _ = Describe("DataDownload", func() {
	It("restores a backup an earlier release wrote under the location's prefix", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		s3store, err := objectstore.NewS3(loc.cfg)
		Expect(err).NotTo(HaveOccurred())
		legacy := backup.NewRepository(s3store.At(catalog.LegacyRoot(loc.cfg.Prefix)))
		_, err = legacy.BackupVM(ctx, vm.catalogVM(), vm.hv, backup.BackupOptions{Backup: "old", WorkDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		atOld := filepath.Join(GinkgoT().TempDir(), "old.raw")
		Expect(vm.hv.Snapshot(ctx, atOld)).To(Succeed())
		Expect(vm.hv.Write(ctx, 8<<20, 1<<20, 0x33)).To(Succeed())

		Expect(k8s.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "restored", Namespace: vm.namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resourceQuantity(diskSize)}},
			},
		})).To(Succeed())
		dd := newDataDownload(ctx, datamover.SnapshotID("old", vm.namespace, vm.name), vm.namespace, "restored", loc, map[string]string{datamover.ConfigDisk: "vda"})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataDownloadPhaseCompleted))
		restored := filepath.Join(vols.dir(vm.namespace, "restored"), datamover.PodTargetFile)
		Expect(testenv.SHA256(restored)).To(Equal(must(testenv.SHA256(atOld))))
	})

	It("restores into a block claim with a pod the restricted Pod Security level admits", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		_, err := loc.repository().BackupVM(ctx, vm.catalogVM(), vm.hv, backup.BackupOptions{Backup: "sun", WorkDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "restored", Namespace: vm.namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				VolumeMode:  ptr.To(corev1.PersistentVolumeBlock),
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resourceQuantity(diskSize)}},
			},
		})).To(Succeed())
		kubelet.holdPods(vm.namespace, true)
		dd := newDataDownload(ctx, datamover.SnapshotID("sun", vm.namespace, vm.name), vm.namespace, "restored", loc, map[string]string{datamover.ConfigDisk: "vda"})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(time.Minute).Should(Equal(velerov2.DataDownloadPhaseInProgress))
		pod := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: vm.namespace, Name: "kubevirt-restore-" + dd.Name}, pod)).To(Succeed())
		Expect(pod.Spec.Containers[0].VolumeDevices).To(ConsistOf(corev1.VolumeDevice{Name: "target", DevicePath: datamover.PodTargetDevice}))
		Expect(pod.Spec.SecurityContext.RunAsUser).To(HaveValue(Equal(datamover.PodUser)))

		dd = getDataDownload(ctx, dd)
		dd.Spec.Cancel = true
		Expect(k8s.Update(ctx, dd)).To(Succeed())
		Eventually(dataDownloadPhase(ctx, dd)).Should(Equal(velerov2.DataDownloadPhaseCanceled))
	})

	It("has its pods refused by the restricted level when they ask for root", func(ctx context.Context) {
		// The admission the suite relies on is real: a pod as the
		// controllers made them before, running as the image's user
		// (root), is refused in the VMs' namespaces.
		vm := newVM(ctx)
		err := k8s.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "as-root", Namespace: vm.namespace},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: datamover.PodContainer, Image: "datamover-upload:suite"}}},
		})
		Expect(err).To(MatchError(ContainSubstring(`violates PodSecurity "restricted:latest"`)))
	})

	DescribeTable("fails with a message naming what is missing",
		func(ctx context.Context, snapshotID func(*testVM) string, want string) {
			vm := newVM(ctx)
			loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
			Expect(k8s.Create(ctx, &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: vm.namespace},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resourceQuantity(diskSize)}},
				},
			})).To(Succeed())
			dd := newDataDownload(ctx, snapshotID(vm), vm.namespace, "target", loc, nil)
			Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(time.Minute).Should(Equal(velerov2.DataDownloadPhaseFailed))
			Expect(getDataDownload(ctx, dd).Status.Message).To(MatchRegexp(want))
		},
		Entry("a snapshot ID of another data mover", func(*testVM) string { return "kopia-snapshot-1234" },
			`^snapshot ID "kopia-snapshot-1234": want <backup>/<vm namespace>/<vm name>$`),
		Entry("a backup the location does not hold", func(vm *testVM) string {
			return datamover.SnapshotID("never", vm.namespace, vm.name)
		}, `^backup never of vms-\d+/db: `),
	)
})
