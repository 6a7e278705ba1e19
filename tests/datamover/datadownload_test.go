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
	"fmt"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
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

		restoreClaim(ctx, vm.namespace, "restored", corev1.PersistentVolumeFilesystem)
		dd := newDataDownload(ctx, datamover.SnapshotID("old", vm.namespace, vm.name), vm.namespace, "restored", loc, map[string]string{datamover.ConfigDisk: "vda"})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataDownloadPhaseCompleted))
		expectRestoredInto(ctx, dd, vm.namespace, "restored", must(testenv.SHA256(atOld)))
	})

	It("restores a VM's disk into a volume of its own, binds it to the claim Velero left and restarts the VM under its new name", func(ctx context.Context) {
		// Velero's restore with a namespace mapping, the VM renamed: the
		// catalog's VM is the one the backup saved, the DataDownload names
		// the claim and the VM as restored.
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		_, err := loc.repository().BackupVM(ctx, vm.catalogVM(), vm.hv, backup.BackupOptions{Backup: "mon", WorkDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		atMon := filepath.Join(GinkgoT().TempDir(), "mon.raw")
		Expect(vm.hv.Snapshot(ctx, atMon)).To(Succeed())
		Expect(vm.hv.Write(ctx, 8<<20, 1<<20, 0x44)).To(Succeed())

		target := fmt.Sprintf("restored-%d", specCounter.Add(1))
		Expect(k8s.Create(ctx, restrictedNamespace(target))).To(Succeed())
		restoreClaim(ctx, target, "copy-rootdisk", corev1.PersistentVolumeFilesystem)
		copyVM := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: "db-copy", Namespace: target, Annotations: map[string]string{
				datamover.AnnotationOriginalRunStrategy: string(kubevirtv1.RunStrategyAlways), datamover.AnnotationOriginalRunStrategySource: "runStrategy"}},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
				Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		Expect(k8s.Create(ctx, copyVM)).To(Succeed())

		dd := newDataDownload(ctx, datamover.SnapshotID("mon", vm.namespace, vm.name), target, "copy-rootdisk", loc,
			map[string]string{datamover.ConfigDisk: "vda"}, func(dd *velerov2.DataDownload) {
				dd.Labels = map[string]string{velerov1.AsyncOperationIDLabel: "dd-" + target}
				dd.Annotations = map[string]string{datamover.AnnotationTargetVMName: copyVM.Name}
			})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataDownloadPhaseCompleted))
		expectRestoredInto(ctx, dd, target, "copy-rootdisk", must(testenv.SHA256(atMon)))
		Expect(getDataDownload(ctx, dd).Status.Message).To(MatchRegexp(`into claim restored-\d+/copy-rootdisk \(volume pvc-.+\)$`))

		Eventually(func() *kubevirtv1.VirtualMachineRunStrategy {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(copyVM), copyVM)).To(Succeed())
			return copyVM.Spec.RunStrategy
		}).Should(HaveValue(Equal(kubevirtv1.RunStrategyAlways)))
		Expect(copyVM.Annotations).NotTo(HaveKey(datamover.AnnotationOriginalRunStrategy))
		Eventually(eventReasons(ctx, dd)).Should(ContainElement("VMResumed"))
		source := &kubevirtv1.VirtualMachine{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: vm.namespace, Name: vm.name}, source)).To(Succeed())
		Expect(source.Spec.RunStrategy).To(BeNil(), "the VM the backup saved is not touched")
	})

	It("fails naming the claim when the target claim is bound to a volume already", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		_, err := loc.repository().BackupVM(ctx, vm.catalogVM(), vm.hv, backup.BackupOptions{Backup: "tue", WorkDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		// A claim without Velero's selector: the provisioner binds it
		// first.
		Expect(k8s.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "provisioned", Namespace: vm.namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resourceQuantity(diskSize)}},
			},
		})).To(Succeed())
		Eventually(func() (string, error) { return vols.claimDir(ctx, k8s, vm.namespace, "provisioned") }).Should(Not(BeEmpty()))
		dd := newDataDownload(ctx, datamover.SnapshotID("tue", vm.namespace, vm.name), vm.namespace, "provisioned", loc, map[string]string{datamover.ConfigDisk: "vda"})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(time.Minute).Should(Equal(velerov2.DataDownloadPhaseFailed))
		Expect(getDataDownload(ctx, dd).Status.Message).To(MatchRegexp(`^target claim vms-\d+/provisioned is already bound to volume pvc-`))
		Expect(gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: veleroNamespace, Name: "kubevirt-restore-" + dd.Name}})()).To(BeTrue())
	})

	It("restores into a block claim with a pod the restricted Pod Security level admits", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		_, err := loc.repository().BackupVM(ctx, vm.catalogVM(), vm.hv, backup.BackupOptions{Backup: "sun", WorkDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		restoreClaim(ctx, vm.namespace, "restored", corev1.PersistentVolumeBlock)
		kubelet.holdPods(vm.namespace, true)
		dd := newDataDownload(ctx, datamover.SnapshotID("sun", vm.namespace, vm.name), vm.namespace, "restored", loc, map[string]string{datamover.ConfigDisk: "vda"})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(time.Minute).Should(Equal(velerov2.DataDownloadPhaseInProgress))
		key := client.ObjectKey{Namespace: veleroNamespace, Name: "kubevirt-restore-" + dd.Name}
		pod := &corev1.Pod{}
		Expect(k8s.Get(ctx, key, pod)).To(Succeed())
		Expect(pod.Spec.Containers[0].VolumeDevices).To(ConsistOf(corev1.VolumeDevice{Name: "target", DevicePath: datamover.PodTargetDevice}))
		Expect(pod.Spec.SecurityContext.RunAsUser).To(HaveValue(Equal(datamover.PodUser)))
		intermediate := &corev1.PersistentVolumeClaim{}
		Expect(k8s.Get(ctx, key, intermediate)).To(Succeed())
		Expect(intermediate.Spec.VolumeMode).To(HaveValue(Equal(corev1.PersistentVolumeBlock)))
		Expect(pod.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.PersistentVolumeClaim.ClaimName", key.Name)))

		dd = getDataDownload(ctx, dd)
		dd.Spec.Cancel = true
		Expect(k8s.Update(ctx, dd)).To(Succeed())
		Eventually(dataDownloadPhase(ctx, dd)).Should(Equal(velerov2.DataDownloadPhaseCanceled))
		Eventually(gone(ctx, intermediate)).Should(BeTrue())
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Name: intermediate.Spec.VolumeName}, &corev1.PersistentVolume{})
		}).Should(MatchError(ContainSubstring("not found")), "the intermediate volume is deleted with its claim")
		user := &corev1.PersistentVolumeClaim{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: vm.namespace, Name: "restored"}, user)).To(Succeed())
		Expect(user.Spec.VolumeName).To(BeEmpty(), "the user's claim is left as Velero left it")
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
			restoreClaim(ctx, vm.namespace, "target", corev1.PersistentVolumeFilesystem)
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
